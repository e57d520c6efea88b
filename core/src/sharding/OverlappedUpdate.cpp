// The update behind the next forward (see trainer/sharding/OverlappedUpdate.h).
#include "trainer/sharding/OverlappedUpdate.h"

#include <optional>

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
    : spans_(unit_spans(units, groups)), device_(std::make_unique<UnitEvents>()) {
  device_->device = device;
  device_->pending.assign(spans_.size(), 0);
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    // High priority: the update's blocks go first where both streams have
    // work, so a unit's update is done before its forward asks for it.
    device_->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    device_->done.resize(spans_.size());
  }
#endif
}

void OverlappedUpdate::launch(OptimizerShards& shards, std::vector<torch::Tensor>& gradients, const UpdateArgs& args) {
  torch::NoGradGuard no_grad;
  join();  // the last update's units, should a forward have missed one
  const auto update_unit = [&](size_t u) {
    for (const UnitSpan& run : spans_[u]) {
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
    for (size_t u = 0; u < spans_.size(); ++u) {
      update_unit(u);
      device_->done[u].record(*device_->stream);
      device_->pending[u] = 1;
    }
    return;
  }
#endif
  for (size_t u = 0; u < spans_.size(); ++u) update_unit(u);
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
