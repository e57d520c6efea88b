// TOML text read through TOML++ only in a form TOML++ 3.3 reads without
// undefined behaviour. Debian's TOML++ classifies whitespace with generated
// tables that reach __builtin_unreachable for most of U+00A1..U+FEFE; it asks
// that question of a non-ASCII character in two places: outside strings and
// comments (never valid TOML), and at the first character after a multi-line
// string's line-ending backslash (valid TOML). The first is refused here,
// naming the place; the second is handed on as the same character written
// as a \u escape, which TOML++ reads without asking.
#pragma once

#include <string>
#include <string_view>

#include <toml++/toml.h>

namespace trainer {

/// Parses `text` (called `where` in messages). Throws InputError
/// "where:line:column: a non-ASCII character outside a string or comment"
/// for text TOML++ could not read safely, toml::parse_error for any other
/// TOML error. A UTF-8 byte-order mark at the start is allowed.
toml::table parse_toml(std::string_view text, const std::string& where);

/// parse_toml on the contents of `file`; InputError "file: cannot read
/// <what>" when it cannot be read.
toml::table parse_toml_file(const std::string& file, const char* what);

}  // namespace trainer
