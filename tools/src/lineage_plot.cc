// lineage (text, DOT, rendered by Graphviz) and plot (gnuplot).
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "ckpt/records/events.h"
#include "session.h"
#include "subprocess.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

json ScoreJson(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Follows parents from `start` as far as manifests are stored.
StatusOr<std::vector<store::Manifest>> Chain(store::Store* s, const std::string& exp,
                                             store::Manifest start, bool* truncated) {
  std::vector<store::Manifest> chain;
  std::set<std::pair<std::string, int64_t>> seen;
  *truncated = false;
  chain.push_back(std::move(start));
  while (chain.back().parent) {
    const store::VersionRef p = *chain.back().parent;
    if (!seen.insert({p.member, p.version}).second) {
      return Status::Corruption(exp + "/" + VersionName(p.member, p.version) +
                                ": the lineage loops");
    }
    auto m = s->GetManifest(exp, p.member, p.version);
    if (!m.ok()) {
      if (m.status().IsNotFound()) {
        *truncated = true;
        break;
      }
      return m.status();
    }
    chain.push_back(std::move(*m));
  }
  return chain;
}

std::string DotQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The experiment's whole graph of versions: one row per member, an edge from
// each version's parent; exploits red, restores blue; `highlight` in bold.
StatusOr<std::string> ExploitGraphDot(store::Store* s, const std::string& exp,
                                      const std::set<std::pair<std::string, int64_t>>& highlight) {
  CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(exp));
  std::string dot = "digraph " + DotQuote(exp) + " {\n";
  dot += "  label=" + DotQuote(exp + ": versions and exploits (red), restores (blue)") +
         "; labelloc=t; rankdir=LR; newrank=true;\n";
  dot += "  node [shape=box, style=rounded, fontname=\"sans\", fontsize=10];\n";
  dot += "  edge [color=gray40];\n";
  std::string edges;
  for (const auto& h : members) {
    CKPT_ASSIGN_OR_RETURN(auto versions, s->ListVersions(exp, h.member));
    dot += "  subgraph " + DotQuote("cluster_" + h.member) + " {\n    label=" + DotQuote(h.member) +
           "; color=gray80;\n";
    for (const auto& m : versions) {
      const std::string id = VersionName(m.member, m.version);
      std::string label = id + "\n" + m.reason + " step " + std::to_string(m.step);
      if (std::isfinite(m.score())) label += "\nscore " + FormatScore(m.score());
      std::string attrs = "label=" + DotQuote(label);
      if (m.version == h.version) attrs += ", peripheries=2";
      if (!m.holds_blob) attrs += ", fontcolor=gray50, color=gray60";
      if (m.pinned) attrs += ", shape=note";
      if (highlight.count({m.member, m.version}))
        attrs += ", style=\"rounded,bold,filled\", fillcolor=lightyellow";
      dot += "    " + DotQuote(id) + " [" + attrs + "];\n";
      if (m.parent) {
        std::string e = "  " + DotQuote(VersionName(m.parent->member, m.parent->version)) + " -> " +
                        DotQuote(id);
        std::vector<std::string> ea;
        if (m.reason == store::kReasonExploit)
          ea.push_back("color=red, penwidth=2, label=exploit, fontcolor=red, fontsize=9");
        if (m.reason == store::kReasonRestore)
          ea.push_back("color=blue, style=dashed, label=restore, fontcolor=blue, fontsize=9");
        if (highlight.count({m.member, m.version}) &&
            highlight.count({m.parent->member, m.parent->version})) {
          ea.push_back("penwidth=3");
        }
        if (!ea.empty()) {
          e += " [";
          for (size_t i = 0; i < ea.size(); ++i) e += (i ? ", " : "") + ea[i];
          e += "]";
        }
        edges += e + ";\n";
      }
    }
    dot += "  }\n";
  }
  return dot + edges + "}\n";
}

Status CheckOutputPath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("no output file given");
  for (char c : path) {
    if (c == '\'' || c == '\n' || c == '\r' || c == '"' || c == '\\') {
      return Status::InvalidArgument("output path \"" + path +
                                     "\" has a quote, backslash or line break");
    }
  }
  return Status::OK();
}

}  // namespace

Status Lineage(const ToolOptions& tool, const LineageOptions& options) {
  Session session(tool);
  const bool graph = options.dot || !options.svg.empty() || !options.png.empty();
  CKPT_ASSIGN_OR_RETURN(
      MemberRef ref, graph ? ParseExperimentOrMemberRef(options.ref) : ParseMemberRef(options.ref));
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  if (auto info = s->GetExperiment(ref.exp); !info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + ref.exp + " not found");
    return info.status();
  }
  std::vector<store::Manifest> chain;
  bool truncated = false;
  if (!ref.member.empty()) {
    CKPT_ASSIGN_OR_RETURN(store::Manifest start, session.ResolveManifest(ref));
    CKPT_ASSIGN_OR_RETURN(chain, Chain(s, ref.exp, start, &truncated));
  }
  if (graph) {
    std::set<std::pair<std::string, int64_t>> highlight;
    for (const auto& m : chain) highlight.insert({m.member, m.version});
    CKPT_ASSIGN_OR_RETURN(std::string dot, ExploitGraphDot(s, ref.exp, highlight));
    if (!options.svg.empty()) {
      CKPT_RETURN_IF_ERROR(CheckOutputPath(options.svg));
      CKPT_RETURN_IF_ERROR(RunProgram({"dot", "-Tsvg", "-o", options.svg}, dot,
                                      "Debian package graphviz; scripts/setup-deps installs it"));
    }
    if (!options.png.empty()) {
      CKPT_RETURN_IF_ERROR(CheckOutputPath(options.png));
      CKPT_RETURN_IF_ERROR(RunProgram({"dot", "-Tpng", "-o", options.png}, dot,
                                      "Debian package graphviz; scripts/setup-deps installs it"));
    }
    if (options.dot) return Print(tool.out, dot);
    std::string wrote;
    for (const auto* f : {&options.svg, &options.png}) {
      if (!f->empty()) wrote += (wrote.empty() ? "" : ", ") + *f;
    }
    if (tool.json) {
      return Print(
          tool.out,
          json{{"experiment", ref.exp}, {"svg", options.svg}, {"png", options.png}}.dump(2) + "\n");
    }
    return Print(tool.out, "wrote " + wrote + "\n");
  }
  if (tool.json) {
    json list = json::array();
    for (const auto& m : chain) {
      list.push_back(
          {{"member", m.member},
           {"version", m.version},
           {"reason", m.reason},
           {"step", m.step},
           {"score", ScoreJson(m.score())},
           {"hparams", m.hparams},
           {"parent", m.parent ? json{{"member", m.parent->member}, {"version", m.parent->version}}
                               : json(nullptr)},
           {"holds_blob", m.holds_blob}});
    }
    return Print(tool.out,
                 json{{"experiment", ref.exp},
                      {"start", chain.front().member + "@" + std::to_string(chain.front().version)},
                      {"chain", list},
                      {"truncated", truncated}}
                         .dump(2) +
                     "\n");
  }
  TextTable t;
  t.AddRow({"VERSION", "REASON", "STEP", "SCORE", "HYPERPARAMETERS", "FROM"});
  for (const auto& m : chain) {
    t.AddRow({VersionName(m.member, m.version), m.reason, std::to_string(m.step),
              FormatScore(m.score()), FormatHparams(m.hparams),
              m.parent ? VersionName(m.parent->member, m.parent->version) : "-"});
  }
  std::string out = ref.exp + "/" + VersionName(chain.front().member, chain.front().version) +
                    ": " + std::to_string(chain.size()) + " versions back to " +
                    (truncated ? "the oldest one retention kept" : "its first") + "\n" + t.Render();
  return Print(tool.out, out);
}

namespace {

struct PlotPoint {
  int64_t step = 0;
  double score = std::nan("");
  std::map<std::string, double> hparams;
};
struct ExploitMark {
  std::string member;
  PlotPoint point;
};

// What the plot draws: each member's points, the exploits, and the
// hyperparameter names (one panel each).
struct PlotSeries {
  std::map<std::string, std::vector<PlotPoint>> series;
  std::vector<ExploitMark> exploits;
  std::set<std::string> keys;

  size_t Points() const {
    size_t points = 0;
    for (const auto& [name, pts] : series) points += pts.size();
    return points;
  }
};

std::string Cell(double v) {
  if (!std::isfinite(v)) return "?";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The gnuplot terminal for `options.output`, once the options are in range.
StatusOr<std::string> PlotTerminal(const PlotOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckOutputPath(options.output));
  std::string terminal;
  if (EndsWith(options.output, ".svg")) {
    terminal = "svg";
  } else if (EndsWith(options.output, ".png")) {
    terminal = "pngcairo";
  } else {
    return Status::InvalidArgument("plot output " + options.output + " must end in .svg or .png");
  }
  if (options.width < 200 || options.width > 20000 || options.panel_height < 100 ||
      options.panel_height > 5000) {
    return Status::InvalidArgument("plot size out of range (width 200..20000, panel 100..5000)");
  }
  return terminal;
}

// The event log has every interval and exploit; manifests add the exact
// step and hyperparameters where retention kept them.
Status AddEventPoints(store::Store* s, const std::string& exp, const ExperimentSettings& settings,
                      PlotSeries* plot) {
  auto& series = plot->series;
  std::map<std::string, std::map<std::string, double>> current;
  CKPT_ASSIGN_OR_RETURN(auto events, s->ListEvents(exp, 1, size_t{1} << 24));
  for (const auto& e : events) {
    // Other event types, and events this version cannot read, add no point.
    auto decoded = records::DecodeEvent(e.json, "experiment " + exp + " event");
    if (!decoded.ok()) continue;
    const auto manifest = [&](const std::string& member, int64_t version) {
      return version > 0 ? s->GetManifest(exp, member, version)
                         : StatusOr<store::Manifest>(Status::NotFound("none"));
    };
    if (const auto* t = std::get_if<records::TrainedEvent>(&*decoded)) {
      if (t->member.empty() || !series.count(t->member)) continue;
      PlotPoint p;
      p.step = t->interval * settings.steps_per_interval;
      p.score = t->val_score;
      p.hparams = current[t->member];
      if (auto m = manifest(t->member, t->version); m.ok()) {
        p.step = m->step;
        p.score = m->score();
        p.hparams = m->hparams;
      }
      current[t->member] = p.hparams;
      series[t->member].push_back(p);
    } else if (const auto* x = std::get_if<records::ExploitEvent>(&*decoded)) {
      if (x->member.empty() || !series.count(x->member)) continue;
      PlotPoint p;
      p.step = x->interval * settings.steps_per_interval;
      p.hparams = x->hparams;
      if (auto m = manifest(x->member, x->version); m.ok()) {
        p.step = m->step;
        p.hparams = m->hparams;
      }
      if (series.count(x->donor) && !series[x->donor].empty()) {
        p.score = series[x->donor].back().score;
      }
      current[x->member] = p.hparams;
      series[x->member].push_back(p);
      plot->exploits.push_back({x->member, p});
    }
  }
  return Status::OK();
}

// A store without events (or with its log trimmed): the manifests alone.
Status AddManifestPoints(store::Store* s, const std::string& exp,
                         const std::vector<store::MemberHead>& members, PlotSeries* plot) {
  for (const auto& h : members) {
    CKPT_ASSIGN_OR_RETURN(auto versions, s->ListVersions(exp, h.member));
    for (const auto& m : versions) {
      PlotPoint p{m.step, m.score(), m.hparams};
      plot->series[h.member].push_back(p);
      if (m.reason == store::kReasonExploit) plot->exploits.push_back({h.member, p});
    }
  }
  return Status::OK();
}

StatusOr<PlotSeries> CollectPlotSeries(store::Store* s, const std::string& exp) {
  auto info = s->GetExperiment(exp);
  if (!info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + exp + " not found");
    return info.status();
  }
  CKPT_ASSIGN_OR_RETURN(ExperimentSettings settings, ReadExperimentSettings(*info));
  CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(exp));
  PlotSeries plot;
  for (const auto& h : members) {
    plot.series[h.member];
    for (const auto& [k, v] : h.hparams) plot.keys.insert(k);
  }
  CKPT_RETURN_IF_ERROR(AddEventPoints(s, exp, settings, &plot));
  bool any = false;
  for (const auto& [name, pts] : plot.series) any = any || !pts.empty();
  if (!any) CKPT_RETURN_IF_ERROR(AddManifestPoints(s, exp, members, &plot));
  return plot;
}

// One data line: the step, the score, then each hyperparameter of `hp`.
std::string DataLine(const PlotPoint& p, const std::vector<std::string>& hp) {
  std::string line = std::to_string(p.step) + " " + Cell(p.score);
  for (const auto& k : hp) {
    auto it = p.hparams.find(k);
    line += " " + Cell(it == p.hparams.end() ? std::nan("") : it->second);
  }
  return line + "\n";
}

// The gnuplot data blocks: $m<i> for the i-th member (member ids may hold
// characters gnuplot does not take in a name), then $exploits.
std::string GnuplotData(const PlotSeries& plot, const std::vector<std::string>& hp) {
  std::string data;
  size_t index = 0;
  for (const auto& [name, pts] : plot.series) {
    data += "$m" + std::to_string(index++) + " << EOD\n";
    for (const auto& p : pts) data += DataLine(p, hp);
    data += "EOD\n";
  }
  data += "$exploits << EOD\n";
  for (const auto& x : plot.exploits) data += DataLine(x.point, hp);
  if (plot.exploits.empty()) data += "? ?" + std::string(hp.size() * 2, ' ') + "\n";
  data += "EOD\n";
  return data;
}

// One panel: every member's column `column` against the step, exploits circled.
std::string GnuplotPanel(const std::vector<std::string>& names, int column,
                         const std::string& ylabel, bool log) {
  std::string p = "set ylabel '" + ylabel + "'\n";
  p += log ? "set logscale y\n" : "unset logscale y\n";
  p += "plot ";
  for (size_t i = 0; i < names.size(); ++i) {
    p += "$m" + std::to_string(i) + " using 1:" + std::to_string(column) +
         " with linespoints pt 7 ps 0.4 lw 1.5 title '" + names[i] + "', ";
  }
  p += "$exploits using 1:" + std::to_string(column) +
       " with points pt 6 ps 1.6 lw 2 lc rgb 'black' title 'exploit'\n";
  return p;
}

// A hyperparameter spanning more than a decade is drawn on a log scale.
bool SpansDecades(const PlotSeries& plot, const std::string& key) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& [name, pts] : plot.series) {
    for (const auto& p : pts) {
      auto it = p.hparams.find(key);
      if (it != p.hparams.end() && std::isfinite(it->second)) {
        lo = std::min(lo, it->second);
        hi = std::max(hi, it->second);
      }
    }
  }
  return lo > 0 && hi / lo > 10;
}

struct PlotLayout {
  std::string exp;
  std::string terminal;
  int height = 0;
  int panels = 0;
};

std::string GnuplotScript(const PlotOptions& options, const PlotLayout& layout,
                          const PlotSeries& plot, const std::vector<std::string>& hp,
                          const std::vector<std::string>& names) {
  std::string script = "set encoding utf8\nset datafile missing '?'\n";
  if (layout.terminal == "svg") {
    script += "set terminal svg size " + std::to_string(options.width) + "," +
              std::to_string(layout.height) + " font 'sans,10' background rgb 'white'\n";
  } else {
    script += "set terminal pngcairo size " + std::to_string(options.width) + "," +
              std::to_string(layout.height) + " font 'sans,9' background rgb 'white'\n";
  }
  script += "set output '" + options.output + "'\n";
  script += GnuplotData(plot, hp);
  script += "set multiplot layout " + std::to_string(layout.panels) + ",1 title '" + layout.exp +
            ": population-based training (" + std::to_string(plot.exploits.size()) +
            " exploits, black circles)'\n";
  // Member and hyperparameter names are text, not gnuplot markup (weight_decay).
  script += "set termoption noenhanced\nset format y '%g'\n";
  script += "set grid\nset key outside right top\nset xlabel 'training step'\n";
  script += "set lmargin 12\nset rmargin 16\n";
  script += GnuplotPanel(names, 2, "validation accuracy", false);
  for (size_t k = 0; k < hp.size(); ++k) {
    script += GnuplotPanel(names, 3 + static_cast<int>(k), hp[k], SpansDecades(plot, hp[k]));
  }
  script += "unset multiplot\nset output\n";
  return script;
}

}  // namespace

Status Plot(const ToolOptions& tool, const PlotOptions& options) {
  Session session(tool);
  PlotLayout layout;
  CKPT_ASSIGN_OR_RETURN(layout.exp, ParseExperimentId(options.experiment));
  CKPT_ASSIGN_OR_RETURN(layout.terminal, PlotTerminal(options));
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  CKPT_ASSIGN_OR_RETURN(PlotSeries plot, CollectPlotSeries(s, layout.exp));
  const size_t points = plot.Points();
  if (points == 0) {
    return Status::NotFound("experiment " + layout.exp + " has no trained version to plot");
  }
  const std::vector<std::string> hp(plot.keys.begin(), plot.keys.end());
  layout.panels = 1 + static_cast<int>(hp.size());
  layout.height = options.panel_height * layout.panels;
  std::vector<std::string> names;
  for (const auto& [name, pts] : plot.series) names.push_back(name);
  const std::string script = GnuplotScript(options, layout, plot, hp, names);
  for (const auto& n : names) {
    if (n.find('\'') != std::string::npos) {
      return Status::InvalidArgument("member id " + n + " has a quote");
    }
  }
  CKPT_RETURN_IF_ERROR(RunProgram({"gnuplot"}, script,
                                  "Debian package gnuplot-nox; scripts/setup-deps installs it"));
  if (tool.json) {
    return Print(tool.out, json{{"experiment", layout.exp},
                                {"output", options.output},
                                {"width", options.width},
                                {"height", layout.height},
                                {"panels", layout.panels},
                                {"points", points},
                                {"exploits", plot.exploits.size()}}
                                   .dump(2) +
                               "\n");
  }
  return Print(tool.out, "wrote " + options.output + " (" + std::to_string(options.width) + "x" +
                             std::to_string(layout.height) + ", " + std::to_string(points) +
                             " points, " + std::to_string(plot.exploits.size()) + " exploits)\n");
}

}  // namespace ckpt::tool
