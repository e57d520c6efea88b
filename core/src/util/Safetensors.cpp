// safetensors reader (mmap) and atomic writer.
#include "trainer/util/Safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"

#include "util/Files.h"
#include "util/SafetensorsHeader.h"

namespace trainer {

namespace {

struct DtypeName {
  const char* name;
  torch::Dtype dtype;
};
constexpr DtypeName kDtypes[] = {{"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
                                 {"F64", torch::kFloat64}, {"I64", torch::kInt64},   {"I32", torch::kInt32}};

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat info {};
  fstat(fd, &info);
  bytes_ = static_cast<size_t>(info.st_size);
  if (bytes_ < 8) {
    close(fd);
    throw InputError(
        fmt::format("{}: truncated safetensors file ({} bytes, the header length alone is 8)", path, bytes_));
  }
  data_ = mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (data_ == MAP_FAILED) throw InputError(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
  try {
    read_header();
  } catch (...) {
    munmap(data_, bytes_);  // the destructor does not run for a constructor that throws
    data_ = nullptr;
    throw;
  }
}

void SafetensorsReader::read_header() {
  const std::string& path = path_;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, data_, 8);
  if (header_bytes > bytes_ - 8) {
    throw InputError(
        fmt::format("{}: truncated safetensors file: header of {} bytes, file of {}", path, header_bytes, bytes_));
  }
  data_start_ = 8 + header_bytes;
  for (SafetensorsEntry& parsed : parse_safetensors_header(
           std::string_view(static_cast<const char*>(data_) + 8, header_bytes), bytes_ - data_start_, path)) {
    Entry e;
    e.name = std::move(parsed.name);
    for (const DtypeName& d : kDtypes) {
      if (parsed.dtype == d.name) e.dtype = d.dtype;
    }
    e.shape = std::move(parsed.shape);
    e.begin = parsed.begin;
    e.end = parsed.end;
    entries_.push_back(std::move(e));
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (data_ && data_ != MAP_FAILED) munmap(data_, bytes_);
}

const SafetensorsReader::Entry* SafetensorsReader::find(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

bool SafetensorsReader::contains(const std::string& name) const { return find(name) != nullptr; }

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

torch::Tensor SafetensorsReader::read(const std::string& name) const {
  const Entry* e = find(name);
  if (!e) throw InputError(fmt::format("{}: no tensor '{}'", path_, name));
  void* start = static_cast<char*>(data_) + data_start_ + e->begin;
  return torch::from_blob(start, e->shape, torch::TensorOptions().dtype(e->dtype)).clone();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<torch::Tensor> host;
  Json entries{{"__metadata__", {{"format", "pt"}}}};
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    host.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const char* dtype = nullptr;
    for (const DtypeName& d : kDtypes) {
      if (d.dtype == host.back().scalar_type()) dtype = d.name;
    }
    if (!dtype) throw std::invalid_argument(fmt::format("write_safetensors: '{}' has an unsupported dtype", name));
    const size_t bytes = static_cast<size_t>(host.back().numel()) * host.back().element_size();
    if (entries.contains(name)) throw std::invalid_argument(fmt::format("write_safetensors: '{}' given twice", name));
    entries[name] =
        Json{{"dtype", dtype}, {"shape", host.back().sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = entries.dump();
  while ((8 + header.size()) % 8 != 0) header += ' ';  // data starts 8-byte aligned
  // A file of this write's own (never one that exists, whatever its name),
  // renamed over `path` once whole.
  const FileBeside beside = create_file_beside(path);
  const std::string temporary = beside.path.string();
  FILE* out = fdopen(beside.fd, "wb");
  if (!out) {
    const int error = errno;
    close(beside.fd);
    std::remove(temporary.c_str());
    throw TrainingError(fmt::format("{}: cannot write: {}", path, std::strerror(error)));
  }
  const uint64_t header_bytes = header.size();
  bool ok =
      std::fwrite(&header_bytes, 8, 1, out) == 1 && std::fwrite(header.data(), 1, header.size(), out) == header.size();
  // Tests: TRAINER_FAULT_INJECT=disk-full makes the write fail half way, as a full disk would.
  const char* fault = std::getenv("TRAINER_FAULT_INJECT");
  const bool disk_full = fault && std::string(fault) == "disk-full";
  for (const torch::Tensor& t : host) {
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes == 0) continue;  // an empty tensor has no storage (fwrite's buffer must not be null)
    if (disk_full && ok) {
      std::fwrite(t.data_ptr(), 1, bytes / 2, out);
      errno = ENOSPC;
      ok = false;
    }
    ok = ok && std::fwrite(t.data_ptr(), 1, bytes, out) == bytes;
  }
  const int write_error = errno;
  ok = std::fflush(out) == 0 && ok;
  ok = fsync(fileno(out)) == 0 && ok;
  if (disk_full) errno = write_error;
  std::fclose(out);
  if (!ok) {
    const int error = errno;
    std::remove(temporary.c_str());  // a partial file is no use to anyone and takes the space
    throw TrainingError(fmt::format("{}: write failed: {}; it is as it was", path, std::strerror(error)));
  }
  std::error_code renamed;
  std::filesystem::rename(temporary, path, renamed);
  if (renamed) {
    std::remove(temporary.c_str());
    throw InputError(fmt::format("{}: cannot replace it ({})", path, renamed.message()));
  }
}

}  // namespace trainer
