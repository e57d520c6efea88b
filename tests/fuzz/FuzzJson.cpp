// libFuzzer target: the JSON reader every input path goes through (jsonl
// records, config.json, safetensors headers, manifests, metrics). Any input
// either parses or throws; it must never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>

#include "trainer/Json.h"

namespace {

// Touches every value, as the callers do.
size_t walk(const trainer::Json& value, int depth) {
  if (depth > 64) return 0;
  size_t n = value.as_string().size() + static_cast<size_t>(value.as_int() & 1) + (value.as_bool() ? 1 : 0);
  for (const trainer::Json& item : value.items()) n += walk(item, depth + 1);
  for (const auto& [key, member] : value.members()) n += key.size() + walk(member, depth + 1);
  if (value.is_object()) n += value.find("name") != nullptr;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const trainer::Json parsed = trainer::Json::parse(std::string_view(reinterpret_cast<const char*>(data), size));
    volatile size_t touched = walk(parsed, 0);
    (void)touched;
  } catch (const std::exception&) {
  }
  return 0;
}
