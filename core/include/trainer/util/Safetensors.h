// Reading and writing safetensors files (the Hugging Face weight format):
// an 8-byte header length, a JSON header of name -> dtype, shape, byte
// range, then the raw little-endian data.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace trainer {

/// A memory-mapped safetensors file. The header and every byte range are
/// checked on open: a truncated or malformed file is an InputError naming it.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;
  /// A CPU copy of tensor `name` in its stored dtype. InputError naming the
  /// tensor and file if it is missing.
  torch::Tensor read(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::string name;
    torch::Dtype dtype;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;
  };
  const Entry* find(const std::string& name) const;
  void read_header();  // the entries, from the mapped file

  std::string path_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t data_start_ = 0;
  std::vector<Entry> entries_;
};

/// Writes `tensors` (any device; float32/float16/bfloat16/float64/int64)
/// atomically: into PATH.tmp, flushed, then renamed over PATH.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace trainer
