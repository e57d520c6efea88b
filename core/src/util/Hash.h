// The project's hashes, in one place. XXH3-128 for everything new; FNV-1a
// (64 bits) only where a format already recorded it: format-1 manifests'
// file checksums, the run fingerprint that checkpoints carry (so older
// checkpoints still resume), and summary.json's parameter_fnv1a_per_rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;

/// FNV-1a over `size` bytes, continuing from `hash` (kFnv1aOffset to start).
inline uint64_t fnv1a(const void* data, size_t size, uint64_t hash = kFnv1aOffset) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  return hash;
}
inline uint64_t fnv1a(std::string_view text, uint64_t hash = kFnv1aOffset) {
  return fnv1a(text.data(), text.size(), hash);
}

struct Hash128 {
  uint64_t high = 0, low = 0;
  std::string hex() const;  ///< 32 hex digits, high half first (xxHash's canonical order)
};

/// XXH3-128 of a file's bytes, read in 1 MiB pieces.
Hash128 file_xxh3(const std::filesystem::path& file);
/// XXH3-128 of `text`, as hex.
std::string text_xxh3(std::string_view text);
/// XXH3-128 of the pieces' bytes one after the other, as hex.
std::string pieces_xxh3(const std::vector<std::string_view>& pieces);
/// Format 1's per-file checksum (FNV-1a, 64 bits).
uint64_t file_fnv1a(const std::filesystem::path& file);

}  // namespace trainer
