// The JSON reader on the shapes it meets: nested objects, escapes, big
// integers, and malformed text with a column.
#include "trainer/Json.h"

#include <gtest/gtest.h>

namespace trainer {
namespace {

TEST(Json, ParsesNestedValues) {
  const Json v = Json::parse(R"( {"a": [1, -2.5e1, true, false, null], "b": {"c": "x\"\u00e9\ud83d\ude00"},
                                  "big": 9007199254740993} )");
  ASSERT_TRUE(v.is_object());
  const Json& a = *v.find("a");
  ASSERT_EQ(a.items().size(), 5u);
  EXPECT_TRUE(a.items()[0].is_integer());
  EXPECT_EQ(a.items()[0].as_int(), 1);
  EXPECT_FALSE(a.items()[1].is_integer());
  EXPECT_DOUBLE_EQ(a.items()[1].as_double(), -25.0);
  EXPECT_TRUE(a.items()[2].as_bool());
  EXPECT_FALSE(a.items()[3].as_bool());
  EXPECT_TRUE(a.items()[4].is_null());
  EXPECT_EQ(v.find("b")->find("c")->as_string(), "x\"\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("big")->as_int(), 9007199254740993LL);  // beyond double's 2^53
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.members().front().first, "a");  // file order kept
}

TEST(Json, MalformedTextNamesTheColumn) {
  for (const char* text : {"{\"a\": }", "[1, 2", "{\"a\" 1}", "\"open", "01x", "{} extra"}) {
    try {
      Json::parse(text);
      ADD_FAILURE() << text;
    } catch (const std::runtime_error& error) {
      EXPECT_EQ(std::string(error.what()).rfind("column ", 0), 0u) << error.what();
    }
  }
  EXPECT_EQ(json_escape("a\"b\n"), "a\\\"b\\n");
}

}  // namespace
}  // namespace trainer
