// TextTable: columns aligned with two spaces between them, for the text
// output of ckpt-tool's commands. The last column is not padded.
//
// Thread-safety: a value.
#ifndef CKPT_TOOLS_SRC_TEXT_TABLE_H_
#define CKPT_TOOLS_SRC_TEXT_TABLE_H_

#include <algorithm>
#include <string>
#include <vector>

namespace ckpt::tool {

class TextTable {
 public:
  explicit TextTable(std::string indent = "") : indent_(std::move(indent)) {}

  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  std::string Render() const {
    std::vector<size_t> width;
    for (const auto& r : rows_) {
      if (width.size() < r.size()) width.resize(r.size(), 0);
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = indent_;
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::string indent_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_TEXT_TABLE_H_
