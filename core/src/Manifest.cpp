// Checkpoint manifests (see Manifest.h).
#include "Manifest.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#define XXH_INLINE_ALL  // header-only: no library to link, on either machine
#include <xxhash.h>

#include "trainer/Errors.h"

namespace trainer::manifest {

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
  uint64_t hash = 0xcbf29ce484222325ULL;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i)
      hash = (hash ^ static_cast<unsigned char>(buffer[i])) * 0x100000001b3ULL;
  }
  return hash;
}

const Json& member(const Json& object, const char* key, const fs::path& file) {
  const Json* value = json_find(object, key);
  if (!value) throw InputError(fmt::format("{}: missing '{}'", file.string(), key));
  return *value;
}

int64_t integer_member(const Json& object, const char* key, int64_t low, int64_t high, const fs::path& file) {
  const Json& value = member(object, key, file);
  if (!json_is_int64(value) || value.get<int64_t>() < low || value.get<int64_t>() > high) {
    throw InputError(fmt::format("{}: '{}' must be an integer in [{}, {}]", file.string(), key, low, high));
  }
  return value.get<int64_t>();
}

const Json& array_member(const Json& object, const char* key, const fs::path& file) {
  const Json& value = member(object, key, file);
  if (!value.is_array()) throw InputError(fmt::format("{}: '{}' must be an array", file.string(), key));
  return value;
}

void validate(const Json& manifest, const fs::path& file) {
  constexpr int64_t kMax = int64_t(1) << 50;
  const fs::path dir = file.parent_path();
  const int64_t step = integer_member(manifest, "step", 0, kMax, file);
  integer_member(manifest, "applied_updates", 0, step, file);
  const int64_t world = integer_member(manifest, "world_size", 1, 1 << 20, file);
  if (dir.filename().string() != fmt::format("step-{:08d}", step)) {
    throw InputError(
        fmt::format("{}: 'step' is {} but the directory is {}", file.string(), step, dir.filename().string()));
  }
  for (const char* key : {"fingerprint", "strategy"}) {
    if (!member(manifest, key, file).is_string())
      throw InputError(fmt::format("{}: '{}' must be a string", file.string(), key));
  }
  const Json& files = array_member(manifest, "files", file);
  if (static_cast<int64_t>(files.size()) != world) {
    throw InputError(fmt::format("{}: {} files listed for world size {}", file.string(), files.size(), world));
  }
  for (size_t r = 0; r < files.size(); ++r) {
    // Only the names this format writes: a manifest never points outside its directory.
    const Json& name = member(files[r], "name", file);
    if (!name.is_string() || name.get_ref<const std::string&>() != fmt::format("rank-{:05d}.safetensors", r)) {
      throw InputError(fmt::format("{}: file {} must be named rank-{:05d}.safetensors", file.string(), r, r));
    }
    integer_member(files[r], "bytes", 0, kMax, file);
    const char* hash_key = member(manifest, "format", file) == kFormat1 ? "fnv1a" : "xxh3_128";
    if (!member(files[r], hash_key, file).is_string()) {
      throw InputError(fmt::format("{}: '{}' must be a string", file.string(), hash_key));
    }
  }
  const Json& groups = array_member(manifest, "group_numel", file);
  if (groups.empty() || groups.size() > 2)
    throw InputError(fmt::format("{}: 'group_numel' must list 1 or 2 groups", file.string()));
  std::vector<int64_t> declared, counted(groups.size(), 0);
  for (const Json& g : groups) {
    if (!json_is_int64(g) || g.get<int64_t>() < 0) {
      throw InputError(fmt::format("{}: 'group_numel' must hold counts", file.string()));
    }
    declared.push_back(g.get<int64_t>());
  }
  for (const Json& p : array_member(manifest, "parameters", file)) {
    if (!member(p, "name", file).is_string() || !member(p, "decay", file).is_boolean()) {
      throw InputError(fmt::format("{}: each parameter needs a string 'name' and a bool 'decay'", file.string()));
    }
    const int64_t numel = integer_member(p, "numel", 0, kMax, file);
    int64_t product = 1;
    for (const Json& d : array_member(p, "shape", file)) {
      if (!json_is_int64(d) || d.get<int64_t>() < 0 || d.get<int64_t>() > kMax) {
        throw InputError(fmt::format("{}: bad shape", file.string()));
      }
      product *= d.get<int64_t>();
      if (product > kMax) throw InputError(fmt::format("{}: bad shape", file.string()));
    }
    if (product != numel) {
      throw InputError(fmt::format("{}: parameter '{}' has shape of {} elements but numel {}", file.string(),
                                   member(p, "name", file).get_ref<const std::string&>(), product, numel));
    }
    const size_t group = member(p, "decay", file).get<bool>() || groups.size() == 1 ? 0 : 1;
    counted[group] += numel;
  }
  if (counted != declared) {
    throw InputError(fmt::format("{}: the parameters add up to [{}] elements per group, 'group_numel' says [{}]",
                                 file.string(), fmt::join(counted, ", "), fmt::join(declared, ", ")));
  }
}

Json read(const fs::path& dir) {
  const fs::path file = dir / "manifest.json";
  std::ifstream in(file);
  if (!in) throw InputError(fmt::format("{}: missing (not a complete checkpoint)", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  Json manifest;
  try {
    manifest = json_parse(text.str());
  } catch (const std::exception& error) {
    throw InputError(fmt::format("{}: malformed: {}", file.string(), error.what()));
  }
  if (const Json* format = json_find(manifest, "format"); format && *format == kFormat) {
    // The manifest's own checksum first: a manifest edited or damaged is refused whole.
    const fs::path sidecar = dir / "manifest.xxh3";
    std::ifstream recorded_in(sidecar);
    std::string recorded;
    if (!(recorded_in >> recorded))
      throw InputError(fmt::format("{}: missing (the manifest's checksum)", sidecar.string()));
    const std::string actual = text_xxh3(text.str());
    if (actual != recorded) {
      throw InputError(fmt::format("{}: checksum {} differs from {} in {} (the manifest was edited or damaged)",
                                   file.string(), actual, recorded, sidecar.string()));
    }
  }
  const Json* format = json_find(manifest, "format");
  if (!format || (*format != kFormat && *format != kFormat1)) {
    throw InputError(fmt::format("{}: not a {} (or {}) manifest", file.string(), kFormat, kFormat1));
  }
  validate(manifest, file);
  return manifest;
}

}  // namespace trainer::manifest
