// `trainer new-plugin`'s class names: never a type the SDK declares (the
// generated source says `using namespace trainer`, so such a name would not
// compile), checked against the headers themselves.
#include "tools/NewPlugin.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "TestSupport.h"

namespace trainer {
namespace {

// Every class, struct, enum and alias name core/include declares, read from
// the headers: an identifier starting with a capital letter after one of
// the declaring keywords.
std::set<std::string> declared_in_headers() {
  std::set<std::string> names;
  const auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (const auto& entry : std::filesystem::recursive_directory_iterator(source_path("core/include"))) {
    if (entry.path().extension() != ".h") continue;
    const std::string text = read_file(entry.path().string());
    for (const std::string keyword : {"class", "struct", "enum", "using"}) {
      for (size_t at = text.find(keyword); at != std::string::npos; at = text.find(keyword, at + 1)) {
        if ((at > 0 && word_char(text[at - 1])) || at + keyword.size() >= text.size() ||
            !std::isspace(static_cast<unsigned char>(text[at + keyword.size()]))) {
          continue;  // part of a longer word
        }
        size_t begin = at + keyword.size();
        while (begin < text.size() && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
        if (text.compare(begin, 6, "class ") == 0) begin += 6;  // enum class
        size_t end = begin;
        while (end < text.size() && word_char(text[end])) ++end;
        if (end > begin && std::isupper(static_cast<unsigned char>(text[begin])))
          names.insert(text.substr(begin, end - begin));
      }
    }
  }
  return names;
}

// "KeySpec" -> "key-spec", as a user would write the type's name in a recipe.
std::string kebab(const std::string& camel) {
  std::string out;
  for (const char c : camel) {
    if (std::isupper(static_cast<unsigned char>(c)) && !out.empty()) out += '-';
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

TEST(NewPlugin, TheSdkTypeListIsTheHeadersOwn) {
  const std::set<std::string> headers = declared_in_headers();
  const std::set<std::string> listed(sdk_type_names().begin(), sdk_type_names().end());
  for (const std::string& name : headers) EXPECT_TRUE(listed.count(name)) << name << " is declared but not listed";
  EXPECT_GT(headers.size(), 40u);  // the scan found the SDK
}

TEST(NewPlugin, ClassNamesAvoidEverySdkType) {
  const std::set<std::string> sdk = declared_in_headers();
  for (const char* kind : {"strategy", "model", "dataset", "logger", "comm"}) {
    for (const std::string& type : sdk) {
      const std::string name = kebab(type);
      EXPECT_EQ(sdk.count(plugin_class_name(kind, name)), 0u) << kind << " " << name;
    }
  }
  EXPECT_EQ(plugin_class_name("dataset", "my-cache"), "MyCacheDataset");
  EXPECT_EQ(plugin_class_name("model", "fast-model"), "FastModel");
  EXPECT_EQ(plugin_class_name("logger", "logger"), "LoggerLogger");
  EXPECT_EQ(plugin_class_name("strategy", "sharded"), "ShardedStrategyPlugin");
  EXPECT_EQ(plugin_class_name("comm", "key-spec"), "KeySpecComm");
}

}  // namespace
}  // namespace trainer
