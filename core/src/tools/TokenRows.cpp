// `trainer forward`'s token file (see TokenRows.h).
#include "tools/TokenRows.h"

#include <charconv>

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

std::vector<std::vector<int64_t>> parse_token_rows(const std::string& text, const std::string& file,
                                                   int64_t vocab_size) {
  std::vector<std::vector<int64_t>> rows;
  size_t line_start = 0;
  for (int64_t number = 1; line_start < text.size(); ++number) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::vector<int64_t> row;
    size_t at = line_start;
    int64_t column = 0;
    while (true) {
      while (at < line_end && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r')) ++at;
      if (at >= line_end) break;
      size_t end = at;
      while (end < line_end && text[end] != ' ' && text[end] != '\t' && text[end] != '\r') ++end;
      ++column;
      int64_t id = -1;
      const auto [stop, error] = std::from_chars(text.data() + at, text.data() + end, id);
      if (error != std::errc() || stop != text.data() + end || id < 0 || id >= vocab_size) {
        throw InputError(fmt::format("{}:{}: token {} '{}': expected an id in [0, {}) (the model's vocab_size)", file,
                                     number, column, text.substr(at, std::min<size_t>(end - at, 40)), vocab_size));
      }
      row.push_back(id);
      at = end;
    }
    line_start = line_end + 1;
    if (row.empty()) continue;
    if (!rows.empty() && row.size() != rows.front().size()) {
      throw InputError(
          fmt::format("{}:{}: {} ids, the first line has {}", file, number, row.size(), rows.front().size()));
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw InputError(fmt::format("{}: no token ids", file));
  return rows;
}

}  // namespace trainer
