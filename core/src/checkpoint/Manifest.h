// Checkpoint manifests: checksums, reading, and field-by-field validation.
// Free of LibTorch, so that the fuzz targets (tests/fuzz) reach it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/util/JsonSupport.h"
#include "util/Hash.h"

namespace trainer::manifest {

/// Format 3: each file lists the ranges of the flat groups it holds
/// ("ranges": [[group, begin, end], ...], ascending; its tensor
/// "group<g>.<state>" is those of group g, one after the other), so any
/// split of the state among the ranks (replicated shards among them) can be
/// written once. Format 2 (the same checksums; file r holds the canonical
/// chunk r of every group) and format 1 (FNV-1a per file, the manifest
/// unchecked) are still read.
inline constexpr const char* kFormat = "trainer-checkpoint-3";
inline constexpr const char* kFormat2 = "trainer-checkpoint-2";
inline constexpr const char* kFormat1 = "trainer-checkpoint-1";

/// Elements [begin, end) of flat group `group`.
struct Range {
  size_t group = 0;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range& other) const { return group == other.group && begin == other.begin && end == other.end; }
};

/// Formats 1 and 2: rank r's chunk of a group of n elements, the r-th of
/// ceil(n / world) elements.
Range canonical_chunk(size_t group, int64_t n, int rank, int world);

/// Who writes what (checkpoints, final weights), from what every rank
/// holds (`held[r]`: rank r's ranges, possibly overlapping): every element
/// of the groups is written by exactly one of the ranks that hold it. A run
/// of elements held by the same ranks is split among them in rank order,
/// in parts of ceil(length / holders): full copies on every rank give the
/// canonical chunks, disjoint shards give each rank its own. Elements no
/// rank holds, or ranges outside their group, go to `problems` (none: the
/// layout is complete). Each rank's ranges come out ascending.
std::vector<std::vector<Range>> writers(const std::vector<std::vector<Range>>& held,
                                        const std::vector<int64_t>& group_numel, std::vector<Range>* problems);

/// The ranges each file of a validated manifest holds, in its order.
std::vector<std::vector<Range>> file_ranges(const Json& manifest, const std::filesystem::path& file);

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

/// The step N of a name's digits ("00000200" is 200): nullopt unless
/// `digits` is 1 to 18 decimal digits (any int64 step fits).
std::optional<int64_t> step_of_digits(std::string_view digits);

/// recipe.until-step-N.toml: the name under which a run resumed at step N
/// under another recipe keeps the recipe of the checkpoint it resumed.
std::string kept_recipe_name(int64_t step);
/// N of such a name; nullopt for any other name.
std::optional<int64_t> kept_recipe_step(const std::string& name);

}  // namespace trainer::manifest
