// What the readers add to nlohmann-json (trainer/JsonSupport.h): file order
// kept, repeated keys refused at any depth, int64 bounds, nullptr lookups,
// and error messages without the library's exception prefix.
#include "trainer/util/JsonSupport.h"

#include <gtest/gtest.h>

namespace trainer {
namespace {

TEST(Json, ParsesInFileOrderWithExactIntegers) {
  const Json v = json_parse(R"( {"z": [1, -2.5e1, true, null], "a": {"c": "x\"\u00e9"}, "big": 9007199254740993} )");
  EXPECT_EQ(v.begin().key(), "z");  // file order, not sorted
  const Json& z = *json_find(v, "z");
  EXPECT_TRUE(json_is_int64(z[0]));
  EXPECT_FALSE(json_is_int64(z[1])) << "a number with a fraction or exponent is not an integer";
  EXPECT_EQ(json_find(*json_find(v, "a"), "c")->get<std::string>(), "x\"\xc3\xa9");
  EXPECT_EQ(json_find(v, "big")->get<int64_t>(), 9007199254740993LL);  // beyond double's 2^53
  EXPECT_EQ(json_find(v, "missing"), nullptr);
  EXPECT_EQ(json_find(z, "a"), nullptr) << "an array has no members";
  EXPECT_TRUE(json_is_int64(json_parse("9223372036854775807")));
  EXPECT_FALSE(json_is_int64(json_parse("9223372036854775808"))) << "above int64";
  EXPECT_FALSE(json_is_int64(json_parse("1e2")));
}

TEST(Json, RepeatedKeysAreRefusedAtEveryDepth) {
  for (const char* text :
       {R"({"a": 1, "a": 2})", R"({"x": {"b": 1, "c": 2, "b": 3}})", R"([{"k": 1}, {"k": 2, "k": 2}])"}) {
    try {
      json_parse(text);
      ADD_FAILURE() << text;
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find("appears twice"), std::string::npos) << error.what();
    }
  }
  // The same key in sibling objects is fine.
  EXPECT_NO_THROW(json_parse(R"([{"k": 1}, {"k": 2}, {"o": {"k": 3}, "k": 4}])"));
}

TEST(Json, MalformedTextNamesThePlace) {
  for (const char* text : {"{\"a\": }", "[1, 2", "{\"a\" 1}", "\"open", "01x", "{} extra", ""}) {
    try {
      json_parse(text);
      ADD_FAILURE() << text;
    } catch (const std::runtime_error& error) {
      const std::string what = error.what();
      EXPECT_EQ(what.find("[json.exception"), std::string::npos) << what;
      EXPECT_NE(what.find("column "), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace trainer
