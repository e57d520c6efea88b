// Checkpoint manifests (see Manifest.h).
#include "checkpoint/Manifest.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/Errors.h"
#include "util/Files.h"

namespace trainer::manifest {

namespace fs = std::filesystem;

Range canonical_chunk(size_t group, int64_t n, int rank, int world) {
  const int64_t c = (n + world - 1) / world;
  return Range{group, std::min(n, rank * c), std::min(n, (rank + 1) * c)};
}

namespace {

// A format-3 range as the manifest holds it: [group, begin, end] (validated).
Range range_of(const Json& range) {
  return Range{range[0].get<size_t>(), range[1].get<int64_t>(), range[2].get<int64_t>()};
}

}  // namespace

std::vector<std::vector<Range>> writers(const std::vector<std::vector<Range>>& held,
                                        const std::vector<int64_t>& group_numel, std::vector<Range>* problems) {
  std::vector<std::vector<Range>> out(held.size());
  problems->clear();
  for (size_t g = 0; g < group_numel.size(); ++g) {
    const int64_t n = group_numel[g];
    // Where the set of holders may change: +1 / -1 per rank at each bound.
    std::map<int64_t, std::vector<std::pair<size_t, int>>> bounds{{0, {}}, {n, {}}};
    for (size_t r = 0; r < held.size(); ++r) {
      for (const Range& range : held[r]) {
        if (range.group != g || range.size() <= 0) continue;
        if (range.begin < 0 || range.end > n) {
          problems->push_back(range);
          continue;
        }
        bounds[range.begin].emplace_back(r, 1);
        bounds[range.end].emplace_back(r, -1);
      }
    }
    std::vector<int> depth(held.size(), 0);  // per rank: its ranges covering the current segment
    std::vector<size_t> holders, run_holders;
    int64_t run_begin = 0;
    const auto close_run = [&](int64_t end) {
      if (end <= run_begin) return;
      if (run_holders.empty()) {
        problems->push_back(Range{g, run_begin, end});
        return;
      }
      const int64_t h = static_cast<int64_t>(run_holders.size());
      const int64_t part = (end - run_begin + h - 1) / h;
      for (int64_t j = 0; j < h; ++j) {
        const int64_t b = std::min(end, run_begin + j * part), e = std::min(end, run_begin + (j + 1) * part);
        if (e > b) out[run_holders[j]].push_back(Range{g, b, e});
      }
    };
    for (auto it = bounds.begin(); it != bounds.end() && it->first <= n; ++it) {
      for (const auto& [r, delta] : it->second) depth[r] += delta;
      holders.clear();
      for (size_t r = 0; r < depth.size(); ++r) {
        if (depth[r] > 0) holders.push_back(r);
      }
      if (holders != run_holders) {
        close_run(it->first);
        run_begin = it->first;
        run_holders = holders;
      }
    }
    close_run(n);
  }
  return out;
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
  // Optional: a model without a Hugging Face config writes no config.json,
  // nor did checkpoints written before it was checksummed, nor before they
  // held their recipe.toml.
  for (const auto& [key, expected] :
       {std::pair<const char*, const char*>{"config", "config.json"}, {"recipe", "recipe.toml"}}) {
    const Json* listed = json_find(manifest, key);
    if (!listed) continue;
    const Json& name = member(*listed, "name", file);
    if (!name.is_string() || name.get_ref<const std::string&>() != expected) {
      throw InputError(fmt::format("{}: '{}' must name {}", file.string(), key, expected));
    }
    integer_member(*listed, "bytes", 0, kMax, file);
    if (!member(*listed, "xxh3_128", file).is_string()) {
      throw InputError(fmt::format("{}: '{}' needs its 'xxh3_128' as a string", file.string(), key));
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
  if (member(manifest, "format", file) != kFormat) return;
  // Format 3: every element of every group in exactly one file.
  std::vector<std::vector<Range>> held;
  for (size_t r = 0; r < files.size(); ++r) {
    held.emplace_back();
    for (const Json& range : array_member(files[r], "ranges", file)) {
      if (!range.is_array() || range.size() != 3 || !json_is_int64(range[0]) || !json_is_int64(range[1]) ||
          !json_is_int64(range[2]) || range[0].get<int64_t>() < 0 ||
          range[0].get<int64_t>() >= static_cast<int64_t>(declared.size()) || range[1].get<int64_t>() < 0 ||
          range[2].get<int64_t>() <= range[1].get<int64_t>() ||
          range[2].get<int64_t>() > declared[range[0].get<size_t>()]) {
        throw InputError(
            fmt::format("{}: file {}'s 'ranges' must hold [group, begin, end] with 0 <= begin < end <= "
                        "the group's elements, got {}",
                        file.string(), r, range.dump()));
      }
      const Range next = range_of(range);
      if (!held.back().empty() &&
          std::tie(next.group, next.begin) < std::tie(held.back().back().group, held.back().back().end)) {
        throw InputError(fmt::format("{}: file {}'s 'ranges' must be ascending and disjoint", file.string(), r));
      }
      held.back().push_back(next);
    }
  }
  std::vector<Range> problems;
  const std::vector<std::vector<Range>> written = writers(held, declared, &problems);
  if (!problems.empty()) {
    throw InputError(fmt::format("{}: no file holds elements [{}, {}) of group {}", file.string(), problems[0].begin,
                                 problems[0].end, problems[0].group));
  }
  for (size_t r = 0; r < held.size(); ++r) {
    int64_t listed = 0, kept = 0;
    for (const Range& range : held[r]) listed += range.size();
    for (const Range& range : written[r]) kept += range.size();
    if (listed != kept) {
      throw InputError(fmt::format("{}: file {}'s 'ranges' overlap another file's", file.string(), r));
    }
  }
}

std::vector<std::vector<Range>> file_ranges(const Json& manifest, const fs::path& file) {
  const Json& files = member(manifest, "files", file);
  const Json& groups = member(manifest, "group_numel", file);
  const bool listed = member(manifest, "format", file) == kFormat;
  std::vector<std::vector<Range>> out;
  for (size_t r = 0; r < files.size(); ++r) {
    out.emplace_back();
    if (listed) {
      for (const Json& range : member(files[r], "ranges", file)) out.back().push_back(range_of(range));
      continue;
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const Range chunk =
          canonical_chunk(g, groups[g].get<int64_t>(), static_cast<int>(r), static_cast<int>(files.size()));
      if (chunk.size() > 0) out.back().push_back(chunk);
    }
  }
  return out;
}

Json read(const fs::path& dir) {
  const fs::path file = dir / "manifest.json";
  const std::optional<std::string> text = read_file(file);
  if (!text) throw InputError(fmt::format("{}: missing (not a complete checkpoint)", file.string()));
  Json manifest;
  try {
    manifest = json_parse(*text);
  } catch (const std::exception& error) {
    throw InputError(fmt::format("{}: malformed: {}", file.string(), error.what()));
  }
  if (const Json* format = json_find(manifest, "format"); format && (*format == kFormat || *format == kFormat2)) {
    // The manifest's own checksum first: a manifest edited or damaged is refused whole.
    const fs::path sidecar = dir / "manifest.xxh3";
    std::ifstream recorded_in(sidecar);
    std::string recorded;
    if (!(recorded_in >> recorded))
      throw InputError(fmt::format("{}: missing (the manifest's checksum)", sidecar.string()));
    const std::string actual = text_xxh3(*text);
    if (actual != recorded) {
      throw InputError(fmt::format("{}: checksum {} differs from {} in {} (the manifest was edited or damaged)",
                                   file.string(), actual, recorded, sidecar.string()));
    }
  }
  const Json* format = json_find(manifest, "format");
  if (!format || (*format != kFormat && *format != kFormat2 && *format != kFormat1)) {
    throw InputError(fmt::format("{}: not a {} (or {}, {}) manifest", file.string(), kFormat, kFormat2, kFormat1));
  }
  validate(manifest, file);
  return manifest;
}

namespace {
constexpr std::string_view kKeptPrefix = "recipe.until-step-", kKeptSuffix = ".toml";
}  // namespace

std::string kept_recipe_name(int64_t step) {
  return std::string(kKeptPrefix) + std::to_string(step) + std::string(kKeptSuffix);
}

std::optional<int64_t> step_of_digits(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (const char digit : digits) {
    if (digit < '0' || digit > '9') return std::nullopt;
    step = step * 10 + (digit - '0');
  }
  return step;
}

std::optional<int64_t> kept_recipe_step(const std::string& name) {
  const std::string_view view = name;
  if (view.size() < kKeptPrefix.size() + kKeptSuffix.size() || view.substr(0, kKeptPrefix.size()) != kKeptPrefix ||
      view.substr(view.size() - kKeptSuffix.size()) != kKeptSuffix) {
    return std::nullopt;
  }
  return step_of_digits(view.substr(kKeptPrefix.size(), view.size() - kKeptPrefix.size() - kKeptSuffix.size()));
}

}  // namespace trainer::manifest
