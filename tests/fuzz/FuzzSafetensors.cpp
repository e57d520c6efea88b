// libFuzzer target: the safetensors header, the JSON every weight file and
// checkpoint shard starts with. Any input either yields entries that fit
// the data section or throws InputError; it must never crash, hang or read
// out of bounds.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>

#include "util/SafetensorsHeader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    constexpr size_t kDataBytes = 1 << 20;
    const auto entries = trainer::parse_safetensors_header(std::string_view(reinterpret_cast<const char*>(data), size),
                                                           kDataBytes, "fuzz");
    for (const trainer::SafetensorsEntry& e : entries) {
      if (e.end > kDataBytes || e.begin > e.end) __builtin_trap();  // the contract the reader relies on
    }
  } catch (const std::exception&) {
  }
  return 0;
}
