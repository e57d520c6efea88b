// Checkpoint manifests: checksums, reading, and field-by-field validation.
// Free of LibTorch, so that the fuzz targets (tests/fuzz) reach it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/JsonSupport.h"

namespace trainer::manifest {

/// Format 2: XXH3-128 per file, and manifest.xxh3 beside the manifest with
/// the checksum of manifest.json itself. Format 1 (FNV-1a per file, the
/// manifest unchecked) is still read.
inline constexpr const char* kFormat = "trainer-checkpoint-2";
inline constexpr const char* kFormat1 = "trainer-checkpoint-1";

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

/// `object[key]`, or InputError naming `file` and the key.
const Json& member(const Json& object, const char* key, const std::filesystem::path& file);
/// An integer member in [low, high], or InputError.
int64_t integer_member(const Json& object, const char* key, int64_t low, int64_t high,
                       const std::filesystem::path& file);
/// An array member (the array), or InputError.
const Json& array_member(const Json& object, const char* key, const std::filesystem::path& file);

/// Every field resume and export rely on, checked before any is used: a
/// manifest edited by hand or damaged is an InputError naming the field,
/// never a crash or a silently wrong resume. `file` is DIR/manifest.json.
void validate(const Json& manifest, const std::filesystem::path& file);

/// DIR/manifest.json parsed, its checksum verified (format 2) and validated.
Json read(const std::filesystem::path& dir);

}  // namespace trainer::manifest
