// Flat parameter buffers and shard arithmetic.
#include "trainer/sharding/FlatParameters.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace trainer {

std::vector<ParameterGroup> flatten_parameters(const std::vector<NamedParameter>& params, torch::Device device,
                                               int64_t pad_to, torch::Dtype dtype,
                                               c10::optional<torch::Dtype> compute_dtype) {
  torch::NoGradGuard no_grad;
  std::vector<ParameterGroup> groups;
  for (const bool decay : {true, false}) {
    ParameterGroup group;
    group.decay = decay;
    for (size_t i = 0; i < params.size(); ++i) {
      const NamedParameter& p = params[i];
      if (p.decay != decay) continue;
      group.slots.push_back(ParameterSlot{p.name, p.tensor, group.numel, p.tensor.numel(), i});
      group.numel += p.tensor.numel();
    }
    if (group.slots.empty()) continue;
    group.padded_numel = (group.numel + pad_to - 1) / pad_to * pad_to;
    group.values = torch::zeros({group.padded_numel}, torch::TensorOptions().dtype(dtype).device(device));
    for (ParameterSlot& slot : group.slots) {
      group.values.narrow(0, slot.offset, slot.numel).copy_(slot.param.reshape(-1));
    }
    group.compute = compute_dtype.value_or(dtype) == dtype ? group.values : group.values.to(*compute_dtype);
    for (ParameterSlot& slot : group.slots) {
      slot.param.set_data(group.compute.narrow(0, slot.offset, slot.numel).view(slot.param.sizes()));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

void bind_gradients(ParameterGroup& group, const torch::Tensor& grads) {
  for (ParameterSlot& slot : group.slots) {
    slot.param.mutable_grad() = grads.narrow(0, slot.offset, slot.numel).view(slot.param.sizes());
  }
}

void sync_compute(ParameterGroup& group) {
  torch::NoGradGuard no_grad;
  if (separate_compute(group)) group.compute.copy_(group.values);
}

std::vector<std::vector<UnitSpan>> unit_spans(const std::vector<ParameterUnit>& units,
                                              const std::vector<ParameterGroup>& groups) {
  // Where each parameter lies, by its position in Model::parameters().
  struct Where {
    size_t group = 0;
    const ParameterSlot* slot = nullptr;
    int units = 0;
  };
  std::vector<Where> where;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ParameterSlot& slot : groups[g].slots) {
      if (slot.position >= where.size()) where.resize(slot.position + 1);
      where[slot.position] = Where{g, &slot, 0};
    }
  }
  std::vector<std::vector<UnitSpan>> out;
  for (const ParameterUnit& unit : units) {
    std::vector<UnitSpan> spans;
    for (size_t p : unit.parameters) {
      if (p >= where.size() || where[p].slot == nullptr) {
        throw std::invalid_argument(
            fmt::format("unit '{}' names parameter {}, which the model does not have", unit.name, p));
      }
      Where& w = where[p];
      ++w.units;
      const int64_t begin = w.slot->offset;
      // Parameters lie in model order within a group: a unit's are mostly back to back.
      auto joins = std::find_if(spans.begin(), spans.end(),
                                [&](const UnitSpan& span) { return span.group == w.group && span.end == begin; });
      if (joins == spans.end()) joins = spans.insert(spans.end(), UnitSpan{w.group, begin, begin, {}});
      joins->end += w.slot->numel;
      joins->slots.push_back(w.slot);
    }
    out.push_back(std::move(spans));
  }
  for (const Where& w : where) {
    if (w.slot != nullptr && w.units != 1) {
      throw std::invalid_argument(
          fmt::format("parameter '{}' lies in {} of the model's units, expected exactly one", w.slot->name, w.units));
    }
  }
  return out;
}

Shard shard_of(int64_t padded_numel, int rank, int world_size) {
  if (padded_numel % world_size != 0) {
    throw std::logic_error("shard_of: buffer size is not a multiple of the world size");
  }
  const int64_t numel = padded_numel / world_size;
  return Shard{rank * numel, numel};
}

Shard unpadded(const ParameterGroup& group, const Shard& shard) {
  // A shard wholly in the padding (shards are padded to 64-element
  // boundaries) holds nothing, placed at the group's end, so every slice
  // of it lies within the group.
  const int64_t begin = std::min(shard.offset, group.numel);
  const int64_t end = std::min(shard.offset + shard.numel, group.numel);
  return Shard{begin, end - begin};
}

}  // namespace trainer
