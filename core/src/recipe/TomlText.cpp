// TOML text in the form TOML++ 3.3 reads (see TomlText.h).
#include "recipe/TomlText.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "util/Files.h"

namespace trainer {

namespace {

bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The code point of the UTF-8 sequence at `at` and its length, or nothing
// when the bytes there are not one (TOML++ reports those itself).
std::optional<std::pair<char32_t, size_t>> decode(std::string_view text, size_t at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (length == 0 || lead > 0xF4 || at + length > text.size()) return std::nullopt;
  char32_t code = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    if (!continuation(text[at + k])) return std::nullopt;
    code = (code << 6) | (static_cast<unsigned char>(text[at + k]) & 0x3F);
  }
  return std::pair{code, length};
}

constexpr const char* kOutside = "a non-ASCII character outside a string or comment (TOML allows them only there)";
constexpr const char* kEscaped = "a backslash before a non-ASCII character (no TOML escape)";

struct Scan {
  std::string text;              // the input, with the rewrites above
  int64_t line = 0, column = 0;  // of the first refused character; line 0: none
  const char* why = kOutside;
};

// Walks strings and comments as TOML++ does: a run of 3 to 5 quotes closes a
// multi-line string (up to two of them content), one backslash escapes the
// next character, and in a multi-line basic string a backslash followed by
// whitespace skips spaces, tabs and line breaks.
Scan scan(std::string_view text) {
  enum class State { Plain, Comment, Basic, Literal, MultiBasic, MultiLiteral } state = State::Plain;
  Scan out;
  out.text.reserve(text.size());
  int64_t line = 1, column = 0;  // column in code points, as TOML++ counts
  const auto refuse = [&](const char* why) {
    out.line = line;
    out.column = column;
    out.why = why;
    return out;
  };
  const auto run_of = [&](size_t at, char quote) {
    size_t n = 0;
    while (at + n < text.size() && text[at + n] == quote) ++n;
    return n;
  };
  size_t i = text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  out.text.append(text.substr(0, i));
  // Copies text[i, i + n) and advances past it.
  const auto take = [&](size_t n) {
    for (size_t k = 0; k < n; ++k) {
      const char c = text[i + k];
      if (c == '\n') {
        ++line;
        column = 0;
      } else if (!continuation(c)) {
        ++column;
      }
    }
    out.text.append(text.substr(i, n));
    i += n;
  };
  while (i < text.size()) {
    const char c = text[i];
    const bool ascii = static_cast<unsigned char>(c) < 0x80;
    switch (state) {
      case State::Plain:
        if (!ascii) {
          ++column;
          return refuse(kOutside);
        }
        if (c == '#') {
          state = State::Comment;
        } else if (c == '"' || c == '\'') {
          const bool multi = run_of(i, c) >= 3;
          state =
              c == '"' ? (multi ? State::MultiBasic : State::Basic) : (multi ? State::MultiLiteral : State::Literal);
          take(multi ? 3 : 1);
          continue;
        }
        break;
      case State::Comment:
        if (c == '\n') state = State::Plain;
        break;
      case State::Basic:
      case State::Literal:
        if (c == '\n' || (c == '"' && state == State::Basic) || (c == '\'' && state == State::Literal)) {
          state = State::Plain;
        } else if (c == '\\' && state == State::Basic) {
          take(1);
          if (i < text.size() && static_cast<unsigned char>(text[i]) >= 0x80) {
            ++column;
            return refuse(kEscaped);
          }
          if (i < text.size() && text[i] != '\n') take(1);
          continue;
        }
        break;
      case State::MultiLiteral:
      case State::MultiBasic: {
        const char quote = state == State::MultiBasic ? '"' : '\'';
        if (c == quote) {
          const size_t run = run_of(i, quote);
          if (run >= 3) state = State::Plain;
          take(std::min<size_t>(run, 5));
          continue;
        }
        if (c != '\\' || state == State::MultiLiteral) break;
        take(1);
        if (i >= text.size()) continue;
        const char next = text[i];
        if (static_cast<unsigned char>(next) >= 0x80) {  // TOML++ asks "is it whitespace?"
          ++column;
          return refuse(kEscaped);
        }
        if (next != ' ' && next != '\t' && next != '\n' && next != '\r') {
          take(1);  // an escape such as \" or \\ or \u
          continue;
        }
        // A line-ending backslash: TOML++ asks of each character whether it
        // is whitespace, up to the first that is not.
        size_t end = i;
        while (end < text.size() && (text[end] == ' ' || text[end] == '\t' || text[end] == '\n' || text[end] == '\r')) {
          ++end;
        }
        take(end - i);
        if (i < text.size() && static_cast<unsigned char>(text[i]) >= 0x80) {
          const auto code = decode(text, i);
          if (!code) continue;  // not UTF-8: TOML++ refuses it before asking
          out.text += code->first > 0xFFFF ? fmt::format("\\U{:08X}", static_cast<uint32_t>(code->first))
                                           : fmt::format("\\u{:04X}", static_cast<uint32_t>(code->first));
          i += code->second;
          ++column;
        }
        continue;
      }
    }
    take(1);
  }
  return out;
}

}  // namespace

toml::table parse_toml(std::string_view text, const std::string& where) {
  const Scan scanned = scan(text);
  const auto refused = [&](int64_t line, int64_t column, const char* why) {
    return InputError(fmt::format("{}:{}:{}: {}", where, line, column, why));
  };
  if (scanned.line > 0) throw refused(scanned.line, scanned.column, scanned.why);
  // A second line of defence that does not depend on the scan above: the
  // same text with every non-ASCII character written as '$' (as wide as it
  // for TOML++'s columns) is all ASCII, so TOML++ reads it safely, and '$'
  // is valid TOML only inside strings and comments. Where it is read, so is
  // the text; where it fails on a '$', that character stood outside them.
  std::string ascii;
  std::vector<bool> placeholder;
  ascii.reserve(scanned.text.size());
  const bool bom = scanned.text.rfind("\xEF\xBB\xBF", 0) == 0;
  for (const char c : std::string_view(scanned.text).substr(bom ? 3 : 0)) {
    if (continuation(c)) continue;
    const bool wide = static_cast<unsigned char>(c) >= 0x80;
    ascii += wide ? '$' : c;
    placeholder.push_back(wide);
  }
  toml::table table;
  try {
    table = toml::parse(ascii, where);
  } catch (const toml::parse_error& error) {
    const toml::source_position at = error.source().begin;
    size_t offset = 0;
    for (uint32_t l = 1; l < at.line && offset != std::string::npos; ++l) {
      offset = ascii.find('\n', offset);
      if (offset != std::string::npos) ++offset;
    }
    if (at.line > 0 && at.column > 0 && offset != std::string::npos) offset += at.column - 1;
    if (at.line > 0 && at.column > 0 && offset < ascii.size() && placeholder[offset]) {
      throw refused(at.line, at.column, offset > 0 && ascii[offset - 1] == '\\' ? kEscaped : kOutside);
    }
    throw;  // the text fails no later than this did
  }
  const bool all_ascii = std::none_of(placeholder.begin(), placeholder.end(), [](bool p) { return p; });
  if (all_ascii && !bom) return table;  // the same text: read once
  return toml::parse(scanned.text, where);
}

toml::table parse_toml_file(const std::string& file, const char* what) {
  const std::optional<std::string> content = read_file(file);
  if (!content) throw InputError(fmt::format("{}: cannot read {}", file, what));
  return parse_toml(*content, file);
}

}  // namespace trainer
