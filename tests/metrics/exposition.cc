#include "exposition.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

namespace ckpt::testing {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

bool IsMetricName(std::string_view s) {
  if (s.empty() || !(IsNameStart(s[0]) || s[0] == ':')) return false;
  for (char c : s) {
    if (!IsNameChar(c) && c != ':') return false;
  }
  return true;
}

bool IsLabelName(std::string_view s) {
  if (s.empty() || !IsNameStart(s[0])) return false;
  for (char c : s) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

// Go's strconv.ParseFloat, which Prometheus uses: decimal or exponent
// notation, or NaN / Inf / Infinity in any case with an optional sign.
bool ParseValue(std::string_view s, double* out) {
  std::string lower;
  for (char c : s) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string_view body = lower;
  const bool negative = !body.empty() && body[0] == '-';
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "nan") {
    *out = std::nan("");
    return true;
  }
  if (body == "inf" || body == "infinity") {
    *out = negative ? -INFINITY : INFINITY;
    return true;
  }
  if (body.empty()) return false;
  for (char c : lower) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' ||
          c == '-')) {
      return false;  // hex floats and anything else strtod would take
    }
  }
  const std::string copy(s);
  char* end = nullptr;
  *out = std::strtod(copy.c_str(), &end);
  return end == copy.c_str() + copy.size();
}

// The family a sample name belongs to, given the families declared so far.
std::string FamilyOf(const std::string& name, const Exposition& families) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string_view sv(suffix);
    if (name.size() > sv.size() && name.compare(name.size() - sv.size(), sv.size(), sv) == 0) {
      std::string base = name.substr(0, name.size() - sv.size());
      auto it = families.find(base);
      if (it != families.end() &&
          (it->second.type == "histogram" || it->second.type == "summary")) {
        return base;
      }
    }
  }
  return name;
}

struct Parser {
  std::string_view text;
  size_t line_no = 0;
  Exposition families;
  std::string current;  // family whose samples are being read
  std::set<std::string> finished;
  std::set<std::pair<std::string, LabelSet>> seen_series;

  Status Error(const std::string& why) const {
    return Status::InvalidArgument("exposition line " + std::to_string(line_no) + ": " + why);
  }

  Status Metadata(std::string_view line) {
    // "# HELP name text" or "# TYPE name type"; other comments are ignored.
    const bool help = line.rfind("# HELP ", 0) == 0;
    const bool type = line.rfind("# TYPE ", 0) == 0;
    if (!help && !type) return Status::OK();
    std::string_view rest = line.substr(7);
    const size_t sp = rest.find(' ');
    const std::string name(rest.substr(0, sp));
    if (!IsMetricName(name)) return Error("bad metric name \"" + name + "\"");
    const std::string value(sp == std::string_view::npos ? "" : rest.substr(sp + 1));
    if (finished.count(name) || (families.count(name) && !families[name].samples.empty())) {
      return Error("metadata for " + name + " after its samples");
    }
    ExpositionFamily& f = families[name];
    f.name = name;
    if (help) {
      if (!f.help.empty()) return Error("second HELP for " + name);
      if (value.empty()) return Error("empty HELP for " + name);
      f.help = value;
    } else {
      if (!f.type.empty()) return Error("second TYPE for " + name);
      static const std::set<std::string> kTypes{"counter", "gauge", "histogram", "summary",
                                                "untyped"};
      if (!kTypes.count(value)) return Error("unknown TYPE \"" + value + "\" for " + name);
      f.type = value;
    }
    if (current != name && !current.empty()) finished.insert(current);
    current = name;
    return Status::OK();
  }

  Status SampleLine(std::string_view line) {
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name(line.substr(0, i));
    if (!IsMetricName(name)) return Error("bad metric name \"" + name + "\"");
    LabelSet labels;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        size_t eq = line.find('=', i);
        if (eq == std::string_view::npos) return Error("label without '='");
        const std::string label(line.substr(i, eq - i));
        if (!IsLabelName(label)) return Error("bad label name \"" + label + "\"");
        if (label.rfind("__", 0) == 0) return Error("reserved label name \"" + label + "\"");
        i = eq + 1;
        if (i >= line.size() || line[i] != '"') return Error("label value not quoted");
        ++i;
        std::string value;
        while (true) {
          if (i >= line.size()) return Error("unterminated label value");
          const char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return Error("dangling escape");
            const char e = line[i++];
            if (e == 'n') {
              value.push_back('\n');
            } else if (e == '\\' || e == '"') {
              value.push_back(e);
            } else {
              return Error(std::string("bad escape \\") + e);
            }
          } else {
            value.push_back(c);
          }
        }
        if (!labels.emplace(label, value).second) return Error("duplicate label " + label);
        if (i < line.size() && line[i] == ',') {
          ++i;
        } else if (i >= line.size() || line[i] != '}') {
          return Error("expected ',' or '}' after a label");
        }
      }
    }
    if (i >= line.size() || line[i] != ' ') return Error("no value after " + name);
    std::string_view rest = line.substr(i + 1);
    const size_t sp = rest.find(' ');
    double value = 0;
    if (!ParseValue(rest.substr(0, sp), &value)) {
      return Error("bad value \"" + std::string(rest.substr(0, sp)) + "\"");
    }
    if (sp != std::string_view::npos) {
      const std::string ts(rest.substr(sp + 1));
      if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string::npos) {
        return Error("bad timestamp \"" + ts + "\"");
      }
    }
    const std::string family = FamilyOf(name, families);
    if (finished.count(family)) return Error("samples of " + family + " are not contiguous");
    if (family != current) {
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    ExpositionFamily& f = families[family];
    f.name = family;
    if (f.type.empty()) f.type = "untyped";
    if (!seen_series.emplace(name, labels).second) return Error("duplicate series " + name);
    if (f.type == "counter" && (!std::isfinite(value) || value < 0)) {
      return Error("counter " + name + " is " + std::string(rest.substr(0, sp)));
    }
    f.samples.push_back(ExpositionSample{name, std::move(labels), value});
    return Status::OK();
  }

  Status CheckHistograms() const {
    for (const auto& [name, f] : families) {
      if (f.type != "histogram") continue;
      std::map<LabelSet, std::vector<std::pair<double, double>>> buckets;
      std::map<LabelSet, double> counts;
      std::set<LabelSet> sums;
      for (const ExpositionSample& s : f.samples) {
        LabelSet key = s.labels;
        if (s.name == name + "_bucket") {
          auto le = key.find("le");
          if (le == key.end()) return Status::InvalidArgument(name + "_bucket without le");
          double bound = 0;
          if (!ParseValue(le->second, &bound)) {
            return Status::InvalidArgument(name + "_bucket le=\"" + le->second + "\"");
          }
          key.erase(le);
          buckets[key].emplace_back(bound, s.value);
        } else if (s.name == name + "_count") {
          counts[key] = s.value;
        } else if (s.name == name + "_sum") {
          sums.insert(key);
        } else {
          return Status::InvalidArgument("histogram " + name + " has sample " + s.name);
        }
      }
      for (const auto& [key, bs] : buckets) {
        for (size_t k = 1; k < bs.size(); ++k) {
          if (bs[k].first <= bs[k - 1].first || bs[k].second < bs[k - 1].second) {
            return Status::InvalidArgument(name + ": buckets not increasing and cumulative");
          }
        }
        if (bs.empty() || !std::isinf(bs.back().first)) {
          return Status::InvalidArgument(name + ": no le=\"+Inf\" bucket");
        }
        if (!counts.count(key) || counts.at(key) != bs.back().second) {
          return Status::InvalidArgument(name + ": _count differs from the +Inf bucket");
        }
        if (!sums.count(key)) return Status::InvalidArgument(name + ": no _sum");
      }
      if (buckets.size() != counts.size() || counts.size() != sums.size()) {
        return Status::InvalidArgument(name + ": _bucket, _count and _sum series do not match");
      }
    }
    return Status::OK();
  }

  Status Run() {
    size_t pos = 0;
    if (!text.empty() && text.back() != '\n') {
      return Status::InvalidArgument("exposition does not end with a newline");
    }
    while (pos < text.size()) {
      const size_t eol = text.find('\n', pos);
      std::string_view line = text.substr(pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (line.empty()) continue;
      if (line[0] == '#') {
        CKPT_RETURN_IF_ERROR(Metadata(line));
      } else {
        CKPT_RETURN_IF_ERROR(SampleLine(line));
      }
    }
    return CheckHistograms();
  }
};

}  // namespace

std::vector<LabelSet> ExpositionFamily::SeriesLabels() const {
  std::set<LabelSet> sets;
  for (const ExpositionSample& s : samples) {
    LabelSet l = s.labels;
    l.erase("le");
    sets.insert(l);
  }
  return std::vector<LabelSet>(sets.begin(), sets.end());
}

std::vector<std::string> ExpositionFamily::LabelNames() const {
  std::set<std::string> names;
  for (const ExpositionSample& s : samples) {
    for (const auto& [k, v] : s.labels) {
      if (k != "le") names.insert(k);
    }
  }
  return std::vector<std::string>(names.begin(), names.end());
}

const ExpositionSample* ExpositionFamily::Find(std::string_view sample_name,
                                               const LabelSet& labels) const {
  for (const ExpositionSample& s : samples) {
    if (s.name == sample_name && s.labels == labels) return &s;
  }
  return nullptr;
}

StatusOr<Exposition> ParseExposition(std::string_view text) {
  Parser p;
  p.text = text;
  CKPT_RETURN_IF_ERROR(p.Run());
  return std::move(p.families);
}

}  // namespace ckpt::testing
