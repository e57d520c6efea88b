// libFuzzer target: parse_toml on arbitrary bytes, under UBSan: TOML++ 3.3
// must never be handed text it classifies with undefined behaviour. Any
// input either reads or throws InputError or toml::parse_error; all-ASCII
// text reads exactly when TOML++ alone reads it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "recipe/TomlText.h"
#include "trainer/Errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bool read = false;
  try {
    (void)trainer::parse_toml(text, "fuzz.toml");
    read = true;
  } catch (const trainer::InputError&) {
  } catch (const toml::parse_error&) {
  }
  bool ascii = true;
  for (const unsigned char c : text) ascii = ascii && c < 0x80;
  if (ascii) {
    bool plain = false;
    try {
      (void)toml::parse(text, std::string_view("fuzz.toml"));
      plain = true;
    } catch (const toml::parse_error&) {
    }
    if (plain != read) __builtin_trap();
  }
  return 0;
}
