// AdamW and gradient-norm arithmetic on flat fp32 buffers, shared by every
// strategy so that they differ only in which slice each rank updates.
#pragma once

#include <cstdint>

#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/Optimizer.h"

namespace trainer {

/// AdamW's settings besides the learning rate (UpdateArgs::lr): the adamw
/// optimizer plugin's recipe keys (also Muon's for the parameters it leaves to AdamW).
struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

/// First and second moments, same shape and device as the parameters.
struct AdamWState {
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
};

AdamWState adamw_init(const torch::Tensor& like);

/// One AdamW update of `params` in place, with torch.optim.AdamW's
/// arithmetic: decoupled decay p *= 1 - lr*wd (only when `decay`), moments,
/// bias correction by `step` (1-based), on the gradient times `grad_scale`
/// (the clipping coefficient). `grads` may be scaled in place. Which code
/// runs: contiguous fp32 buffers on CUDA, the project's kernel (ops/AdamW.cu:
/// one pass over parameters, gradients and moments, writing a bf16
/// `compute` in the same pass); other fp32 CUDA buffers (LibTorch 2.x),
/// LibTorch's fused AdamW kernel; plain fp32/fp64 CPU buffers, an element-wise
/// loop in torch.optim.AdamW's order, compiled without multiply-add
/// contraction; anything else, torch.optim.AdamW's single-tensor sequence of
/// tensor operations. Each path is element-wise, so any slicing of a buffer
/// into shards gives the same bits on that path; the project's kernel and
/// the CPU loop also agree with each other bit for bit (no contraction into
/// multiply-adds on either side), LibTorch's paths need not. `compute`, when given (same number of
/// elements), receives the updated parameters in its dtype: in the same
/// pass on CUDA, otherwise as a copy after the update.
void adamw_update(torch::Tensor params, const torch::Tensor& grads, AdamWState& state, const AdamWConfig& config,
                  bool decay, double lr, int64_t step, double grad_scale = 1.0,
                  const torch::Tensor& compute = torch::Tensor());

/// adamw_update where the moments are bf16 (an optimizer's bf16 state,
/// sharding/LowPrecisionState.h): on CUDA
/// one kernel pass (ops/AdamW.cu) that widens each element's moments,
/// updates them as adamw_update's kernel does and writes them back rounded
/// as stochastic_round rounds element first_index + i of `stream_m`
/// (exp_avg) and `stream_v` (exp_avg_sq): the bits of with_wide_state
/// around adamw_update, for 22 bytes an element instead of ~54. False,
/// having done nothing, where it does not apply (not CUDA, other dtypes or
/// layouts): the caller then takes with_wide_state.
bool adamw_update_bf16_state(torch::Tensor params, const torch::Tensor& grads, AdamWState& state,
                             const AdamWConfig& config, bool decay, double lr, int64_t step, double grad_scale,
                             const torch::Tensor& compute, uint64_t stream_m, uint64_t stream_v, int64_t first_index);

/// AdamW over one UpdateSlice whose state is (exp_avg, exp_avg_sq), of any
/// state dtype: bf16 moments by adamw_update_bf16_state where it applies,
/// else by adamw_update inside with_wide_state (LowPrecisionState.h), whose
/// bits it gives. Writes slice.compute where defined. What the adamw
/// optimizer's update() is, and Muon's for the parameters it leaves to AdamW.
void adamw_update_slice(UpdateSlice& slice, const AdamWConfig& config, const UpdateArgs& args);

/// Sum of squares of a flat buffer, returned on the host: fp32 sums over
/// fixed chunks of 2^16 elements added in fp64 (no fp64 copy of the buffer;
/// relative error ~1e-7). The chunking depends only on the buffer, so equal
/// buffers give equal bits. Strategies add these per buffer (and across
/// ranks) to get the norm.
double squared_norm(const torch::Tensor& flat);

/// The L2 norm of several flat buffers together: each one's squared_norm
/// (the same chunks) added in order in fp64 on the device, then one read:
/// the bits of adding squared_norm's results on the host, with one host
/// sync instead of one per buffer. 0 for none. The buffers share a device.
double total_norm(const std::vector<torch::Tensor>& flats);

/// The L2 norm of a gradient sharded across ranks: each rank passes the
/// parts it owns (disjoint across ranks, padding excluded); squares are
/// summed in fp64 and all-reduced (contract, point 5). Collective: every
/// rank calls it, also one that owns nothing, which passes its device (the
/// sum travels there). Without `device`, `owned` must not be empty at world
/// size > 1 (std::logic_error instead of a hang of the other ranks).
double sharded_norm(const std::vector<torch::Tensor>& owned, Comm& comm);
double sharded_norm(const std::vector<torch::Tensor>& owned, Comm& comm, torch::Device device);

/// torch.nn.utils.clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6),
/// capped at 1; 1 when max_norm <= 0 (clipping off).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace trainer
