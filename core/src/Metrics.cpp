// A small reader for the flat JSON objects the jsonl logger writes.
#include "Metrics.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

namespace {

class LineParser {
 public:
  LineParser(const std::string& text, const std::string& where) : text_(text), where_(where) {}

  MetricsRow parse() {
    MetricsRow row;
    expect('{');
    skip_space();
    if (peek() == '}') return row;
    while (true) {
      const std::string key = string();
      expect(':');
      skip_space();
      if (peek() == '"') {
        string();
      } else if (match("true")) {
        row[key] = 1.0;
      } else if (match("false")) {
        row[key] = 0.0;
      } else if (match("null")) {
        row[key] = std::numeric_limits<double>::quiet_NaN();
      } else {
        row[key] = number();
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      skip_space();
      if (pos_ != text_.size()) fail("text after the closing brace");
      return row;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw InputError(fmt::format("{}: malformed metrics record at column {}: {}", where_, pos_ + 1, what));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }
  bool match(const char* word) {
    const std::string w = word;
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\\') ++pos_;
      if (pos_ < text_.size()) out += text_[pos_++];
    }
    if (peek() != '"') fail("unterminated string");
    ++pos_;
    return out;
  }
  double number() {
    const char* begin = text_.c_str() + pos_;
    char* end = nullptr;
    const double value = std::strtod(begin, &end);
    if (end == begin) fail("expected a number, string, true, false or null");
    pos_ += static_cast<size_t>(end - begin);
    return value;
  }

  const std::string& text_;
  std::string where_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<MetricsRow> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open metrics file", path));
  std::vector<MetricsRow> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(LineParser(line, fmt::format("{}:{}", path, number)).parse());
  }
  return rows;
}

}  // namespace trainer
