// What the framework's readers of JSON share on top of nlohmann-json: the
// ordered document type (objects keep file order), parsing that refuses
// repeated keys, lookups that return nullptr instead of throwing.
// Including this header needs nlohmann-json (Debian nlohmann-json3-dev;
// link nlohmann_json::nlohmann_json).
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainer {

using Json = nlohmann::ordered_json;

/// The member `key` of `object`, or nullptr (also when `object` is not an object).
template <typename J>
const J* json_find(const J& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

/// A number written without fraction or exponent that fits in int64.
template <typename J>
bool json_is_int64(const J& value) {
  if (value.is_number_unsigned()) {
    return value.template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return value.is_number_integer();
}

/// Parses one JSON document. Throws std::runtime_error with nlohmann's
/// message (its "[json.exception...]" prefix dropped), also for an object
/// with a repeated key, which plain parsing would resolve silently by
/// keeping one of the values. J: Json (keys in file order) or, for objects
/// of very many keys (a tokenizer's vocabulary), nlohmann::json (sorted
/// keys, logarithmic lookup and insertion where ordered_json's are linear).
template <typename J>
J json_parse_as(std::string_view text) {
  std::vector<std::set<std::string>> keys;  // per open object
  std::string repeated;
  const typename J::parser_callback_t check = [&](int, typename J::parse_event_t event, J& parsed) {
    if (event == J::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == J::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == J::parse_event_t::key && !keys.empty() &&
               !keys.back().insert(parsed.template get<std::string>()).second && repeated.empty()) {
      repeated = parsed.template get<std::string>();
    }
    return true;
  };
  J value;
  try {
    value = J::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& error) {
    std::string what = error.what();
    const size_t prefix = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && prefix != std::string::npos) what = what.substr(prefix + 2);
    throw std::runtime_error(what);
  }
  if (!repeated.empty()) throw std::runtime_error("the key '" + repeated + "' appears twice in one object");
  return value;
}

inline Json json_parse(std::string_view text) { return json_parse_as<Json>(text); }

}  // namespace trainer
