// A small JSON reader for the formats the framework meets: Hugging Face
// config.json, safetensors headers, JSON-lines datasets and metrics.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainer {

/// A parsed JSON value. Objects keep their keys in file order.
class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  /// Parses one value (surrounding whitespace allowed). Throws
  /// std::runtime_error("column N: what was expected") on malformed text.
  static Json parse(std::string_view text);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  bool is_bool() const { return type_ == Type::Bool; }
  /// A number written without fraction or exponent that fits in int64.
  bool is_integer() const { return type_ == Type::Number && integral_; }

  bool as_bool() const { return boolean_; }
  double as_double() const { return number_; }
  int64_t as_int() const { return integer_; }
  const std::string& as_string() const { return string_; }
  const std::vector<Json>& items() const { return array_; }
  const std::vector<std::pair<std::string, Json>>& members() const { return object_; }

  /// The member named `key` of an object, or nullptr.
  const Json* find(const std::string& key) const;

 private:
  friend class JsonParser;
  Type type_ = Type::Null;
  bool boolean_ = false;
  bool integral_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  std::string string_;
  std::vector<Json> array_;
  std::vector<std::pair<std::string, Json>> object_;
};

/// `text` with JSON string escaping, without the quotes.
std::string json_escape(std::string_view text);

}  // namespace trainer
