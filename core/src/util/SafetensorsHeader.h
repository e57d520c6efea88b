// The safetensors header: parsed and checked against the file's size, free
// of LibTorch so that a fuzz target (tests/fuzz) reaches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  ///< one of F32 F16 BF16 F64 I64 I32
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  ///< byte range within the data section
};

/// Bytes per element of a supported safetensors dtype, 0 for any other.
size_t safetensors_element_bytes(std::string_view dtype);

/// The tensors of `header` (the JSON text after the 8-byte length) of a file
/// `path` whose data section holds `data_bytes`. InputError naming the file
/// and the tensor for malformed JSON, a repeated name, a missing or
/// mistyped field, an unsupported dtype, a shape that does not fit its byte
/// range, a range past the end of the file, or two ranges that overlap.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header, size_t data_bytes,
                                                       const std::string& path);

}  // namespace trainer
