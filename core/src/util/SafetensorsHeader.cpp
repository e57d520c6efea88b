// The safetensors header (see SafetensorsHeader.h).
#include "util/SafetensorsHeader.h"

#include <algorithm>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {

size_t safetensors_element_bytes(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view text, size_t data_bytes,
                                                       const std::string& path) {
  Json header;
  try {
    header = json_parse(text);
  } catch (const std::exception& error) {
    throw InputError(fmt::format("{}: malformed safetensors header: {}", path, error.what()));
  }
  if (!header.is_object()) throw InputError(fmt::format("{}: malformed safetensors header: not an object", path));
  std::vector<SafetensorsEntry> entries;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    if (name == "__metadata__") continue;
    const Json* dtype = json_find(item.value(), "dtype");
    const Json* shape = json_find(item.value(), "shape");
    const Json* offsets = json_find(item.value(), "data_offsets");
    if (!dtype || !shape || !offsets || !dtype->is_string() || !shape->is_array() || !offsets->is_array() ||
        offsets->size() != 2) {
      throw InputError(fmt::format("{}: tensor '{}': header entry lacks dtype, shape or data_offsets", path, name));
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dtype->get<std::string>();
    const size_t element = safetensors_element_bytes(e.dtype);
    if (element == 0) throw InputError(fmt::format("{}: tensor '{}': unsupported dtype {}", path, name, e.dtype));
    constexpr int64_t kMax = int64_t(1) << 50;
    int64_t numel = 1;
    for (const Json& d : *shape) {
      const int64_t size = json_is_int64(d) ? d.get<int64_t>() : -1;
      if (size < 0 || size > kMax || (size > 0 && numel > kMax / size)) {
        throw InputError(
            fmt::format("{}: tensor '{}': shape must hold non-negative integers with a product up to "
                        "2^50",
                        path, name));
      }
      numel *= size;
      e.shape.push_back(size);
    }
    for (const Json& o : *offsets) {
      if (!json_is_int64(o) || o.get<int64_t>() < 0) {
        throw InputError(fmt::format("{}: tensor '{}': data_offsets must be non-negative integers", path, name));
      }
    }
    e.begin = static_cast<size_t>((*offsets)[0].get<int64_t>());
    e.end = static_cast<size_t>((*offsets)[1].get<int64_t>());
    const size_t expected = static_cast<size_t>(numel) * element;
    if (e.end < e.begin || e.end - e.begin != expected) {
      throw InputError(fmt::format("{}: tensor '{}': byte range [{}, {}) does not hold {} values of {}", path, name,
                                   e.begin, e.end, numel, e.dtype));
    }
    if (e.end > data_bytes) {
      throw InputError(fmt::format("{}: truncated safetensors file: tensor '{}' ends at data byte {}, the data at {}",
                                   path, name, e.end, data_bytes));
    }
    entries.push_back(std::move(e));
  }
  // Each byte belongs to at most one tensor: overlapping ranges mean a damaged or forged header.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw InputError(fmt::format("{}: tensors '{}' and '{}' overlap in the file", path, by_offset[i - 1]->name,
                                   by_offset[i]->name));
    }
  }
  return entries;
}

}  // namespace trainer
