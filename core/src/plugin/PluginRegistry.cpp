// Plugin discovery and loading with one error message per way a load fails.
#include "plugin/PluginRegistry.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>

#include <elf.h>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/version.h>

namespace trainer {

namespace fs = std::filesystem;

namespace {

// Deliberately leaked: a library must stay loaded until the process exits.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  return *libraries;
}

bool names_a_file(const std::string& name) {
  return name.find('/') != std::string::npos || (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0);
}

// dlopen maps a shared library without checking that the file holds what
// its headers describe: a truncated plugin would be a bus error, not an
// error message. So the ELF header and the extents it declares are read
// and checked against the file's size first.
void check_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code size_error;
  const uint64_t size = fs::file_size(path, size_error);
  if (!in || size_error) throw InputError(fmt::format("{}: cannot read plugin file", path));
  if (size == 0) throw InputError(fmt::format("{}: empty file (0 bytes), not a shared library", path));
  Elf64_Ehdr header{};
  if (size < sizeof(header) || !in.read(reinterpret_cast<char*>(&header), sizeof(header)) ||
      std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    throw InputError(fmt::format("{}: not an ELF shared library ({} bytes, no ELF header)", path, size));
  }
#if defined(__x86_64__)
  constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr int kMachine = EM_AARCH64;
#else
  const int kMachine = header.e_machine;
#endif
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_type != ET_DYN || header.e_machine != kMachine) {
    throw InputError(fmt::format("{}: an ELF file but not a 64-bit shared library for this machine", path));
  }
  uint64_t needed = header.e_phoff + uint64_t(header.e_phnum) * header.e_phentsize;
  if (header.e_shoff != 0)
    needed = std::max<uint64_t>(needed, header.e_shoff + uint64_t(header.e_shnum) * header.e_shentsize);
  if (needed > size || header.e_phentsize != sizeof(Elf64_Phdr)) {
    throw InputError(
        fmt::format("{}: truncated or damaged: its ELF headers need {} bytes, the file has {}", path, needed, size));
  }
  in.seekg(static_cast<std::streamoff>(header.e_phoff));
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    if (!in.read(reinterpret_cast<char*>(&segment), sizeof(segment))) {
      throw InputError(fmt::format("{}: truncated program headers", path));
    }
    if (segment.p_type == PT_LOAD && segment.p_offset + segment.p_filesz > size) {
      throw InputError(fmt::format("{}: truncated: a loadable segment ends at byte {}, the file has {}", path,
                                   segment.p_offset + segment.p_filesz, size));
    }
  }
}

// The permissions ("r-xp", ...) of the mapping of this process that holds
// `address`; "" when none does.
std::string mapping_permissions(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    unsigned long begin = 0, end = 0;
    char permissions[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, permissions) == 3 && at >= begin && at < end) {
      return permissions;
    }
  }
  return "";
}

// TRAINER_PLUGIN exports a pointer variable to the describe function. A
// library that exports a function of that name, or a null or stray pointer,
// would crash the process when called: each is named instead.
DescribeFn* checked_entry_point(const boost::dll::shared_library& library, const std::string& file) {
  const void* symbol = &library.get<char>(kEntryPoint);
  const std::string where = mapping_permissions(symbol);
  if (where.size() > 2 && where[2] == 'x') {
    throw InputError(
        fmt::format("{}: '{}' is a function, not the pointer TRAINER_PLUGIN exports; declare the entry "
                    "point with TRAINER_PLUGIN or TRAINER_DEFINE_PLUGIN",
                    file, kEntryPoint));
  }
  DescribeFn* describe = *static_cast<DescribeFn* const*>(symbol);
  const std::string target = describe ? mapping_permissions(reinterpret_cast<const void*>(describe)) : "";
  if (target.size() < 3 || target[2] != 'x') {
    throw InputError(fmt::format("{}: '{}' {} (declare it with TRAINER_PLUGIN or TRAINER_DEFINE_PLUGIN)", file,
                                 kEntryPoint, describe ? "points outside any code" : "is a null pointer"));
  }
  return describe;
}

LoadedPlugin load_library(const std::string& path) {
  std::error_code exists_error;
  if (!fs::exists(path, exists_error)) {
    throw InputError(fmt::format("{}: plugin file not found", path));
  }
  const std::string canonical = fs::canonical(path).string();
  if (!fs::is_regular_file(canonical)) throw InputError(fmt::format("{}: not a regular file", canonical));
  check_elf(canonical);
  boost::dll::shared_library library;
  boost::dll::fs::error_code error;
  library.load(canonical, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, error);
  if (error) {
    throw InputError(fmt::format("{}: cannot load plugin: {}", canonical, error.message()));
  }
  if (!library.has(kEntryPoint)) {
    throw InputError(
        fmt::format("{}: not a trainer plugin: it exports no '{}' entry point (declare one with TRAINER_PLUGIN)",
                    canonical, kEntryPoint));
  }
  DescribeFn* describe = checked_entry_point(library, canonical);
  const PluginDescriptor* descriptor = nullptr;
  try {
    descriptor = describe();
  } catch (const std::exception& error) {
    throw InputError(fmt::format("{}: the plugin's describe() threw: {}", canonical, error.what()));
  } catch (...) {
    throw InputError(
        fmt::format("{}: the plugin's describe() threw something that is not a std::exception", canonical));
  }
  if (descriptor == nullptr) {
    throw InputError(fmt::format("{}: the plugin's entry point returned no descriptor", canonical));
  }
  // abi_version is read first and alone: the rest of the layout is only
  // known once it matches.
  if (descriptor->abi_version != kAbiVersion) {
    throw InputError(
        fmt::format("{}: plugin ABI version {} does not match this trainer's ABI version {}; rebuild the plugin "
                    "against this trainer's SDK",
                    canonical, descriptor->abi_version, kAbiVersion));
  }
  if (descriptor->torch_version == nullptr || std::string(descriptor->torch_version) != TORCH_VERSION) {
    throw InputError(
        fmt::format("{}: plugin was built against LibTorch {}, this trainer uses LibTorch {}; rebuild the plugin",
                    canonical, descriptor->torch_version ? descriptor->torch_version : "(unknown)", TORCH_VERSION));
  }
  if (descriptor->name == nullptr || descriptor->create == nullptr ||
      static_cast<uint32_t>(descriptor->kind) > static_cast<uint32_t>(PluginKind::Optimizer)) {
    throw InputError(fmt::format("{}: plugin descriptor is incomplete (name, kind or factory)", canonical));
  }
  loaded_libraries().push_back(std::move(library));
  return LoadedPlugin{descriptor, canonical};
}

}  // namespace

namespace {
std::atomic<bool> g_checking_only{false};
}  // namespace

bool checking_only() { return g_checking_only.load(); }

CheckingOnly::CheckingOnly() { g_checking_only.store(true); }
CheckingOnly::~CheckingOnly() { g_checking_only.store(false); }

const char* kind_name(PluginKind kind) {
  switch (kind) {
    case PluginKind::Strategy:
      return "strategy";
    case PluginKind::Model:
      return "model";
    case PluginKind::Dataset:
      return "dataset";
    case PluginKind::Logger:
      return "logger";
    case PluginKind::Comm:
      return "comm";
    case PluginKind::Optimizer:
      return "optimizer";
  }
  return "unknown";
}

Component::~Component() = default;

const LoadedPlugin& PluginRegistry::add(const LoadedPlugin& plugin) {
  for (const LoadedPlugin& known : plugins_) {
    if (known.file == plugin.file) return known;
    if (known.descriptor->kind == plugin.descriptor->kind &&
        std::string(known.descriptor->name) == plugin.descriptor->name) {
      throw InputError(fmt::format("two {} plugins are named '{}': {} and {}", kind_name(plugin.descriptor->kind),
                                   plugin.descriptor->name, known.file, plugin.file));
    }
  }
  plugins_.push_back(plugin);
  return plugins_.back();
}

void PluginRegistry::discover(const std::vector<std::string>& directories) {
  for (const std::string& directory : directories) {
    std::error_code error;
    if (!fs::is_directory(directory, error)) continue;
    std::vector<std::string> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && name.rfind("trainer-", 0) == 0 && entry.path().extension() == ".so") {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());  // a fixed order makes duplicate errors reproducible
    for (const std::string& file : files) add(load_library(file));
  }
}

const LoadedPlugin& PluginRegistry::load_file(const std::string& path) { return add(load_library(path)); }

const LoadedPlugin& PluginRegistry::find(PluginKind kind, const std::string& name) {
  if (names_a_file(name)) {
    const LoadedPlugin& plugin = load_file(name);
    if (plugin.descriptor->kind != kind) {
      throw InputError(fmt::format("{}: is a {} plugin, expected a {} plugin", plugin.file,
                                   kind_name(plugin.descriptor->kind), kind_name(kind)));
    }
    return plugin;
  }
  std::vector<std::string> available;
  for (const LoadedPlugin& plugin : plugins_) {
    if (plugin.descriptor->kind != kind) continue;
    if (name == plugin.descriptor->name) return plugin;
    available.push_back(plugin.descriptor->name);
  }
  std::sort(available.begin(), available.end());
  throw InputError(fmt::format("unknown {} plugin '{}'; available: {}", kind_name(kind), name,
                               available.empty() ? "(none found)" : fmt::format("{}", fmt::join(available, ", "))));
}

std::vector<std::string> plugin_search_path(const std::vector<std::string>& explicit_dirs) {
  std::vector<std::string> dirs = explicit_dirs;
  if (const char* env = std::getenv("TRAINER_PLUGIN_PATH")) {
    std::string path = env;
    size_t start = 0;
    while (start <= path.size()) {
      const size_t end = std::min(path.find(':', start), path.size());
      if (end > start) dirs.push_back(path.substr(start, end - start));
      start = end + 1;
    }
  }
  const fs::path exe_dir = boost::dll::program_location().parent_path();
  dirs.push_back((exe_dir / ".." / "lib" / "trainer" / "plugins").lexically_normal().string());
  return dirs;
}

}  // namespace trainer
