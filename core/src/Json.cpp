// Recursive-descent JSON parser (RFC 8259; \u escapes become UTF-8).
#include "trainer/Json.h"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace trainer {

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  Json document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("end of input after the value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw std::runtime_error(fmt::format("column {}: expected {}", pos_ + 1, expected));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) ++pos_;
  }
  bool consume(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Json parse_value(int depth) {
    if (depth > 256) fail("less nesting");
    skip_space();
    Json v;
    if (pos_ >= text_.size()) fail("a value");
    const char c = text_[pos_];
    if (c == '{') {
      v.type_ = Json::Type::Object;
      ++pos_;
      skip_space();
      if (consume("}")) return v;
      while (true) {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("a string key");
        std::string key = parse_string();
        skip_space();
        if (!consume(":")) fail("':'");
        v.object_.emplace_back(std::move(key), parse_value(depth + 1));
        skip_space();
        if (consume(",")) continue;
        if (consume("}")) return v;
        fail("',' or '}'");
      }
    }
    if (c == '[') {
      v.type_ = Json::Type::Array;
      ++pos_;
      skip_space();
      if (consume("]")) return v;
      while (true) {
        v.array_.push_back(parse_value(depth + 1));
        skip_space();
        if (consume(",")) continue;
        if (consume("]")) return v;
        fail("',' or ']'");
      }
    }
    if (c == '"') {
      v.type_ = Json::Type::String;
      v.string_ = parse_string();
      return v;
    }
    if (consume("true") || consume("false")) {
      v.type_ = Json::Type::Bool;
      v.boolean_ = text_[pos_ - 4] == 't';  // "true" is four characters, "false" five
      return v;
    }
    if (consume("null")) return v;
    return parse_number();
  }

  Json parse_number() {
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    bool integral = true;
    while (pos_ < text_.size()) {
      const char d = text_[pos_];
      if (d >= '0' && d <= '9') {
        ++pos_;
      } else if (d == '.' || d == 'e' || d == 'E' || d == '+' || (d == '-' && pos_ > start)) {
        integral = false;
        ++pos_;
      } else {
        break;
      }
    }
    const std::string token(text_.substr(start, pos_ - start));
    if (token.empty() || token == "-") fail("a value");
    char* end = nullptr;
    Json v;
    v.type_ = Json::Type::Number;
    v.number_ = std::strtod(token.c_str(), &end);
    if (*end != '\0') fail("a number");
    if (integral) {
      errno = 0;
      v.integer_ = std::strtoll(token.c_str(), &end, 10);
      v.integral_ = errno == 0;
    }
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a closing '\"'");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("no control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("an escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, code_point()); break;
        default: fail("a valid escape");
      }
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("four hex digits");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      value <<= 4;
      if (h >= '0' && h <= '9') value |= h - '0';
      else if (h >= 'a' && h <= 'f') value |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') value |= h - 'A' + 10;
      else fail("a hex digit");
    }
    return value;
  }

  uint32_t code_point() {
    uint32_t cp = hex4();
    if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
      if (!consume("\\u")) fail("a low surrogate");
      const uint32_t low = hex4();
      if (low < 0xDC00 || low >= 0xE000) fail("a low surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

Json Json::parse(std::string_view text) { return JsonParser(text).document(); }

const Json* Json::find(const std::string& key) const {
  for (const auto& [name, value] : object_) {
    if (name == key) return &value;
  }
  return nullptr;
}

std::string json_escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else out += c;
    }
  }
  return out;
}

}  // namespace trainer
