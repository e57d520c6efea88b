// parse_toml: TOML text that TOML++ 3.3 would classify with undefined
// behaviour is refused with its place, or read as the same TOML; everything
// else reads as TOML++ reads it. Each case below reached
// __builtin_unreachable in TOML++ 3.3 (checked under UBSan).
#include "recipe/TomlText.h"

#include <gtest/gtest.h>

#include "trainer/Errors.h"

namespace trainer {
namespace {

// The InputError's message, or "" when parse_toml throws none.
std::string refusal(const std::string& text) {
  try {
    (void)parse_toml(text, "t.toml");
  } catch (const InputError& error) {
    return error.what();
  } catch (const toml::parse_error&) {
  }
  return "";
}

std::string value_of(const std::string& text, const char* key = "a") {
  const toml::table table = parse_toml(text, "t.toml");
  return table[key].value_or(std::string("(missing)"));
}

const char* const kE = "\xC3\xA9";  // U+00E9, two bytes

TEST(TomlTextTest, NonAsciiOutsideStringsAndCommentsIsRefusedWithItsPlace) {
  const std::string e = kE;
  EXPECT_EQ(refusal("a = 1" + e),
            "t.toml:1:6: a non-ASCII character outside a string or comment (TOML allows them only there)");
  EXPECT_EQ(refusal(e + " = 1").substr(0, 11), "t.toml:1:1:");
  EXPECT_EQ(refusal("[a" + e + "]").substr(0, 11), "t.toml:1:3:");
  EXPECT_EQ(refusal("a = 1979-05-27T07:32:00" + e).substr(0, 12), "t.toml:1:24:");
  // Columns count characters, as TOML++'s do: the bare é is column 9 (byte 10).
  EXPECT_EQ(refusal("a = \"" + e + "\" \n b = \"" + e + "\"" + e).substr(0, 12), "t.toml:2:9: ");
}

TEST(TomlTextTest, QuoteRunsCloseMultiLineStringsAsTomlDoes) {
  const std::string e = kE;
  // Up to two quotes before the closing three are content; what follows is
  // outside the string.
  EXPECT_EQ(refusal("a = \"\"\"x\"\"\"\"" + e).substr(0, 12), "t.toml:1:13:");
  EXPECT_EQ(refusal("a = '''x''''" + e).substr(0, 12), "t.toml:1:13:");
  EXPECT_EQ(refusal("a = \"\"\"x\"\"\"\"\"" + e).substr(0, 12), "t.toml:1:14:");
  EXPECT_EQ(value_of("a = \"\"\"x\"\"\"\"\"\nb = 1"), "x\"\"");
  EXPECT_EQ(value_of("a = '''x''''"), "x'");
  EXPECT_EQ(value_of("a = \"\"\"x\"\" " + e + "\"\"\""), "x\"\" " + e);
}

TEST(TomlTextTest, EscapesAndLineEndingBackslashes) {
  const std::string e = kE;
  // After a line-ending backslash the next character is read as itself.
  EXPECT_EQ(value_of("a = \"\"\"\\\n" + e + "x\"\"\""), e + "x");
  EXPECT_EQ(value_of("a = \"\"\"q \\  \n\n   \xF0\x9F\x98\x80!\"\"\""), "q \xF0\x9F\x98\x80!");
  EXPECT_EQ(value_of("a = \"\"\"\\\n  \\u00E9" + e + "\"\"\""), e + e);
  // An escaped non-ASCII character is no TOML escape.
  EXPECT_EQ(refusal("a = \"\"\"\\" + e + "\"\"\"").substr(0, 11), "t.toml:1:9:");
  // A backslash and a space, then more on the line, stays a TOML error.
  EXPECT_THROW(parse_toml("a = \"\"\"x\\ " + e + "\"\"\"", "t.toml"), toml::parse_error);
  // Single-line strings: an escaped quote does not end them; a backslash
  // escape of é is refused as in multi-line ones.
  EXPECT_EQ(value_of("a = \"\\\"" + e + "\""), "\"" + e);
  EXPECT_EQ(refusal("a = \"\\" + e + "\""), "t.toml:1:7: a backslash before a non-ASCII character (no TOML escape)");
}

TEST(TomlTextTest, NonAsciiInsideStringsCommentsAndKeysReads) {
  const std::string e = kE;
  const std::string text = "\xEF\xBB\xBF# " + e + "\na = \"" + e + "\" # " + e + "\nb = '" + e + "'\nc = \"\"\"\n" + e +
                           "\n\"\"\"\nd = '''" + e + "'''\n\"" + e + "\" = ['" + e + "', {k = \"" + e + "\"}]\n";
  const toml::table table = parse_toml(text, "t.toml");
  EXPECT_EQ(table["a"].value_or(std::string()), e);
  EXPECT_EQ(table["b"].value_or(std::string()), e);
  EXPECT_EQ(table["c"].value_or(std::string()), e + "\n");
  EXPECT_EQ(table["d"].value_or(std::string()), e);
  EXPECT_EQ(table[e][1]["k"].value_or(std::string()), e);
}

TEST(TomlTextTest, OtherErrorsAreTomlErrorsWithTheirPlace) {
  try {
    (void)parse_toml("a = 1\nb = = 2\n", "t.toml");
    FAIL() << "no parse_error";
  } catch (const toml::parse_error& error) {
    EXPECT_EQ(error.source().begin.line, 2u);
  }
}

}  // namespace
}  // namespace trainer
