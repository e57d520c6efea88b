// A plugin's (or a core section's) recipe table after validation: each
// declared key with its value from the recipe, a --set override or its
// default, and where it came from for error messages.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trainer {

/// For KeySpec::min / max: no bound.
inline constexpr double kNoLimit = std::numeric_limits<double>::infinity();

/// The value types a recipe key may have.
enum class ValueType { Bool, Int, Float, String };

/// One declared recipe key. Plain data, so plugins declare their keys as a
/// constexpr array. `default_value` is a TOML literal ("8", "1e-3", "true",
/// "'cosine'"); nullptr makes the key required. Numbers are checked against
/// [min, max]; a String key with `choices` ("a|b|c") accepts only those.
struct KeySpec {
  const char* name;
  ValueType type;
  const char* default_value;
  const char* help;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  const char* choices = nullptr;
};

using Value = std::variant<bool, int64_t, double, std::string>;

/// The validated keys of one recipe table. Values are in the declaration
/// order of the KeySpecs. Copyable; holds no reference to the recipe.
class Options {
 public:
  struct Entry {
    std::string key;
    Value value;
    std::string origin;  ///< "recipe.toml:12:3", "--set", or "default"
  };

  Options() = default;
  Options(std::string section, std::string file, std::vector<Entry> entries);

  bool boolean(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double real(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  /// True when the recipe or a --set gave the key (it is not the default).
  bool is_set(const std::string& key) const;

  /// Throws InputError naming the file, origin, section and key: for checks a
  /// plugin makes beyond type and range (e.g. "must divide hidden_size").
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;

  const std::string& section() const { return section_; }
  const std::string& file() const { return file_; }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  const Entry& find(const std::string& key) const;

  std::string section_;
  std::string file_;
  std::vector<Entry> entries_;
};

}  // namespace trainer
