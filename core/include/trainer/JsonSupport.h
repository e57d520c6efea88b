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
inline const Json* json_find(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

/// A number written without fraction or exponent that fits in int64.
inline bool json_is_int64(const Json& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return value.is_number_integer();
}

/// Parses one JSON document. Throws std::runtime_error with nlohmann's
/// message (its "[json.exception...]" prefix dropped), also for an object
/// with a repeated key, which plain parsing would resolve silently by
/// keeping one of the values.
inline Json json_parse(std::string_view text) {
  std::vector<std::set<std::string>> keys;  // per open object
  std::string repeated;
  const Json::parser_callback_t check = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == Json::parse_event_t::key && !keys.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second && repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  Json value;
  try {
    value = Json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& error) {
    std::string what = error.what();
    const size_t prefix = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && prefix != std::string::npos) what = what.substr(prefix + 2);
    throw std::runtime_error(what);
  }
  if (!repeated.empty()) throw std::runtime_error("the key '" + repeated + "' appears twice in one object");
  return value;
}

}  // namespace trainer
