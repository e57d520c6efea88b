// The update behind the next forward (see trainer/sharding/OverlappedUpdate.h).
#include "trainer/sharding/OverlappedUpdate.h"

#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#ifdef TRAINER_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainer {

struct OverlappedUpdate::UnitEvents {
  torch::Device device = torch::kCPU;
  std::vector<char> pending;  // per unit: its update's event not waited for yet
#ifdef TRAINER_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> stream;
  std::vector<at::cuda::CUDAEvent> done;  // per unit
#endif
};

OverlappedUpdate::OverlappedUpdate() = default;
OverlappedUpdate::~OverlappedUpdate() = default;
OverlappedUpdate::OverlappedUpdate(OverlappedUpdate&&) noexcept = default;
OverlappedUpdate& OverlappedUpdate::operator=(OverlappedUpdate&&) noexcept = default;

OverlappedUpdate::OverlappedUpdate(const std::vector<ParameterUnit>& units, const std::vector<ParameterGroup>& groups,
                                   torch::Device device)
    : device_(std::make_unique<UnitEvents>()) {
  // Where each parameter lies: group and slot, by its position in Model::parameters().
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
  for (const ParameterUnit& unit : units) {
    std::vector<UnitRun> runs;
    for (size_t p : unit.parameters) {
      if (p >= where.size() || where[p].slot == nullptr) {
        throw std::invalid_argument(
            fmt::format("unit '{}' names parameter {}, which the model does not have", unit.name, p));
      }
      Where& w = where[p];
      ++w.units;
      const int64_t begin = w.slot->offset, end = w.slot->offset + w.slot->numel;
      // Parameters lie in model order within a group: a unit's are mostly back to back.
      bool joined = false;
      for (UnitRun& run : runs) {
        if (run.group == w.group && run.end == begin) {
          run.end = end;
          joined = true;
          break;
        }
      }
      if (!joined) runs.push_back(UnitRun{w.group, begin, end});
    }
    runs_.push_back(std::move(runs));
  }
  for (const Where& w : where) {
    if (w.slot != nullptr && w.units != 1) {
      throw std::invalid_argument(
          fmt::format("parameter '{}' lies in {} of the model's units, expected exactly one", w.slot->name, w.units));
    }
  }
  device_->device = device;
  device_->pending.assign(runs_.size(), 0);
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    // High priority: the update's blocks go first where both streams have
    // work, so a unit's update is done before its forward asks for it and
    // the forward's GEMMs fill what the bandwidth-bound update leaves.
    device_->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    device_->done.resize(runs_.size());
  }
#endif
}

void OverlappedUpdate::launch(OptimizerShards& shards, std::vector<torch::Tensor>& gradients, const UpdateArgs& args) {
  torch::NoGradGuard no_grad;
  join();  // the last update's units, should a forward have missed one
  const auto update_unit = [&](size_t u) {
    for (const UnitRun& run : runs_[u]) {
      shards.update_elements(args, run.group, run.begin, run.end);
      gradients.at(run.group).narrow(0, run.begin, run.end - run.begin).zero_();
    }
  };
#ifdef TRAINER_CUDA_KERNELS
  if (device_ && device_->stream) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_->device.index());
    at::cuda::CUDAEvent ready;
    ready.record(current);  // the gradients summed, the norm taken
    ready.block(*device_->stream);
    const c10::cuda::CUDAStreamGuard on_update_stream(*device_->stream);
    for (size_t u = 0; u < runs_.size(); ++u) {
      update_unit(u);
      device_->done[u].record(*device_->stream);
      device_->pending[u] = 1;
    }
    return;
  }
#endif
  for (size_t u = 0; u < runs_.size(); ++u) update_unit(u);
}

void OverlappedUpdate::before_unit(size_t unit) {
  if (!device_ || unit >= device_->pending.size() || !device_->pending[unit]) return;
#ifdef TRAINER_CUDA_KERNELS
  device_->done[unit].block(c10::cuda::getCurrentCUDAStream(device_->device.index()));
#endif
  device_->pending[unit] = 0;
}

void OverlappedUpdate::join() {
  if (!device_) return;
  for (size_t u = 0; u < device_->pending.size(); ++u) before_unit(u);
}

}  // namespace trainer
