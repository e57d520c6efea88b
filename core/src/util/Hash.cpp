// XXH3 (header-only: no library to link, on either machine) and the file
// checksums (see Hash.h).
#include "util/Hash.h"

#include <fstream>
#include <memory>

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace trainer {

namespace fs = std::filesystem;

std::string Hash128::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::string text_xxh3(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return Hash128{h.high64, h.low64}.hex();
}

std::string pieces_xxh3(const std::vector<std::string_view>& pieces) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  for (const std::string_view piece : pieces) XXH3_128bits_update(state.get(), piece.data(), piece.size());
  const XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return Hash128{h.high64, h.low64}.hex();
}

Hash128 file_xxh3(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  std::vector<char> buffer(1 << 20);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    XXH3_128bits_update(state.get(), buffer.data(), static_cast<size_t>(in.gcount()));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return Hash128{h.high64, h.low64};
}

// Format 1's per-file checksum.
uint64_t file_fnv1a(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t hash = kFnv1aOffset;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0)
    hash = fnv1a(buffer, static_cast<size_t>(in.gcount()), hash);
  return hash;
}

}  // namespace trainer
