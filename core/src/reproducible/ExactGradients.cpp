// Fixed-point gradient accumulation for reproducible mode (see ExactGradients.h).
#include "reproducible/ExactGradients.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "ops/Dispatch.h"
#include "reproducible/ReproducibleMode.h"
#include "trainer/Errors.h"

namespace trainer {

namespace {

int ceil_log2(int64_t n) {
  int bits = 0;
  while ((int64_t(1) << bits) < n) ++bits;
  return bits;
}

constexpr int64_t kLimb = int64_t(1) << 32;

// Whether `slices` are the groups of `sizes` each whole: one fp32
// contiguous slice per group, in order, from offset 0, on `device`.
bool whole_groups(const std::vector<FlatSlice>& slices, const std::vector<int64_t>& sizes, torch::Device device) {
  if (slices.size() != sizes.size()) return false;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const FlatSlice& s = slices[g];
    if (s.group != g || s.offset != 0 || s.values.numel() != sizes[g] || s.values.scalar_type() != torch::kFloat32 ||
        !s.values.is_contiguous() || s.values.device() != device) {
      return false;
    }
  }
  return true;
}

}  // namespace

ExactGradients::ExactGradients(Model& model, int64_t atoms, torch::Device device, Strategy* strategy,
                               const std::string& strategy_name)
    : parameters_(model.parameters()), bits_(61 - ceil_log2(std::max<int64_t>(1, atoms))) {
  // Laid out as reduce() returns the sum: the decay group's parameters, then
  // the others, each in the model's order. reduce() then converts in place.
  offsets_.assign(parameters_.size(), 0);
  int64_t total = 0;
  std::vector<std::vector<int64_t>> group_starts;  // each non-empty group's parameters' starts in it
  for (const bool decay : {true, false}) {
    const int64_t group_start = total;
    std::vector<size_t> members;
    std::vector<int64_t> starts;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (parameters_[i].decay != decay) continue;
      layout_.push_back(i);
      offsets_[i] = total;
      members.push_back(i);
      starts.push_back(total - group_start);
      total += parameters_[i].tensor.numel();
    }
    if (decay) decay_elements_ = total;
    if (total > group_start) {  // reduce() leaves an empty group out
      group_parameters_.push_back(std::move(members));
      group_starts.push_back(std::move(starts));
    }
  }
  if (strategy != nullptr) {
    // The core writes the sum through the slices: views, or the run stops here.
    check_gradient_slices_are_views(*strategy, strategy_name);
    const std::vector<FlatSlice> slices = strategy->gradient_slices();
    std::vector<int64_t> sizes;
    for (const int64_t n : {decay_elements_, total - decay_elements_}) {
      if (n > 0) sizes.push_back(n);
    }
    limbs_ = whole_groups(slices, sizes, device);
    torch::NoGradGuard no_grad;
    for (const FlatSlice& slice : slices) {
      slice.values.zero_();  // the probe's NaN gone
      if (limbs_) strategy_.push_back(slice.values);
    }
  }
  const auto on = torch::TensorOptions().device(device);
  if (limbs_) {
    high_ = torch::zeros({total}, on.dtype(torch::kInt32));
  } else {
    accumulator_ = torch::zeros({total}, on.dtype(torch::kInt64));
  }
  largest_ = torch::zeros({static_cast<int64_t>(parameters_.size())},
                          torch::TensorOptions().dtype(torch::kFloat64).device(device));
  if (device.is_cuda()) scales_ = torch::zeros_like(largest_);
  if (limbs_ && device.is_cuda()) {
    for (const std::vector<int64_t>& starts : group_starts) {
      group_starts_.push_back(torch::tensor(starts, torch::kInt64).to(device));
    }
  }
  exponents_.assign(parameters_.size(), kUnknown);
  pending_.assign(parameters_.size(), kUnknown);
  calls_.assign(parameters_.size(), 0);
  // Tensor hooks run before the gradient is accumulated into .grad (or into
  // whatever buffer a strategy bound), once per backward with the sum of
  // every use of the parameter in the graph.
  for (size_t i = 0; i < parameters_.size(); ++i) {
    hook_handles_.push_back(parameters_[i].tensor.register_hook([this, i](const torch::Tensor& g) { add(i, g); }));
  }
  // After the accumulation: what autograd stored in .grad (the gradient
  // itself where nothing was bound, as the strategy binds nothing in exact
  // mode) is summed already, and is dropped at once.
  for (const NamedParameter& p : parameters_) {
    if (!p.tensor.requires_grad()) continue;
    std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(p.tensor);
    if (!node) continue;
    node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [dropping = dropping_, parameter = p.tensor](const torch::autograd::variable_list& outputs,
                                                     const torch::autograd::variable_list&) {
          if (dropping->load()) parameter.mutable_grad() = torch::Tensor();
          return outputs;
        }));
    accumulators_.push_back(std::move(node));
  }
}

ExactGradients::~ExactGradients() {
  dropping_->store(false);
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].tensor.remove_hook(hook_handles_[i]);
}

void ExactGradients::begin_pass(int64_t local_atoms) {
  local_atoms_ = local_atoms;
  torch::NoGradGuard no_grad;
  if (limbs_) {
    high_.zero_();
    for (const torch::Tensor& g : strategy_) g.zero_();  // +0.0f: every low limb 0
  } else {
    accumulator_.zero_();
  }
  largest_.zero_();
  if (scales_.defined()) {
    // The kernel reads each scale on the device: a CUDA graph captured in an
    // earlier pass adds with this pass's scales.
    std::vector<double> scales(exponents_.size(), 0.0);
    for (size_t i = 0; i < exponents_.size(); ++i) {
      if (exponents_[i] != kUnknown) scales[i] = std::ldexp(1.0, static_cast<int>(exponents_[i]));
    }
    scales_.copy_(torch::tensor(scales, torch::kFloat64));
  }
  calls_.assign(parameters_.size(), 0);
  nonfinite_ = false;
  armed_ = true;
}

void ExactGradients::add(size_t parameter, const torch::Tensor& gradient) {
  if (!armed_ || !gradient.defined()) return;
  torch::NoGradGuard no_grad;
  ++calls_[parameter];
  // Widening fp32 or bf16 to fp64 and scaling by a power of two are exact;
  // the one rounding is round() (half to even), the same wherever g lands.
  const double limit = std::ldexp(1.0, bits_);
#ifdef TRAINER_CUDA_KERNELS
  if (ops::use_kernels(gradient) && scales_.defined()) {
    const torch::Tensor g = gradient.detach().contiguous();
    const double* scale = scales_.data_ptr<double>() + parameter;
    double* largest = largest_.data_ptr<double>() + parameter;
    if (limbs_) {
      const torch::Tensor lo = low(offsets_[parameter], g.numel());
      const ops::KernelLaunch launch("fixed_point_add_limbs", {g, lo, high_, largest_, scales_});
      ops::kernels::fixed_point_add_limbs(ops::kernel_dtype(g), g.data_ptr(), lo.data_ptr<int32_t>(),
                                          high_.data_ptr<int32_t>() + offsets_[parameter], g.numel(), scale, limit,
                                          largest, launch.stream());
      ops::check_launch("fixed_point_add_limbs");
      return;
    }
    const ops::KernelLaunch launch("fixed_point_add", {g, accumulator_, largest_, scales_});
    ops::kernels::fixed_point_add(ops::kernel_dtype(g), g.data_ptr(),
                                  accumulator_.data_ptr<int64_t>() + offsets_[parameter], g.numel(), scale, limit,
                                  largest, launch.stream());
    ops::check_launch("fixed_point_add");
    return;
  }
#endif
  const int64_t exponent = exponents_[parameter];
  // kConvertChunk elements at a time: the fp64 and int64 temporaries stay a
  // few chunks, not several copies of the largest parameter (an embedding).
  const torch::Tensor flat = gradient.detach().reshape({-1});
  torch::Tensor largest = largest_.narrow(0, static_cast<int64_t>(parameter), 1);
  for (int64_t start = 0; start < flat.numel(); start += kConvertChunk) {
    const int64_t n = std::min(kConvertChunk, flat.numel() - start);
    const torch::Tensor wide = flat.narrow(0, start, n).to(torch::kFloat64);
    largest.copy_(torch::maximum(largest, wide.abs().max().reshape({1})));  // NaN stays NaN
    if (exponent == kUnknown) continue;                                     // this pass only measures M_p
    // Clamped so that an out-of-range value (the pass is then not accepted)
    // never reaches the integer conversion, and NaN (its largest is then
    // NaN: the step is non-finite) made 0 first, as the CUDA kernel's fmax
    // does: converting NaN to an integer is undefined.
    const torch::Tensor q = (wide * std::ldexp(1.0, static_cast<int>(exponent)))
                                .round_()
                                .nan_to_num_(0.0, limit, -limit)
                                .clamp_(-limit, limit)
                                .to(torch::kInt64);
    const int64_t at = offsets_[parameter] + start;
    if (limbs_) {
      store(at, n, combined(at, n).add_(q));
    } else {
      accumulator_.narrow(0, at, n).add_(q);
    }
  }
}

void ExactGradients::count_calls(const std::vector<int64_t>& change) {
  for (size_t i = 0; i < change.size() && i < calls_.size(); ++i) calls_[i] += change[i];
}

torch::Tensor ExactGradients::low(int64_t start, int64_t n) const {
  const bool decay = decay_elements_ > 0 && start < decay_elements_;
  const size_t group = decay || decay_elements_ == 0 ? 0 : 1;
  return strategy_[group].view(torch::kInt32).narrow(0, decay ? start : start - decay_elements_, n);
}

torch::Tensor ExactGradients::combined(int64_t start, int64_t n) const {
  // The low limb's 32 bits read as unsigned: int32 widened, then masked.
  const torch::Tensor lo = low(start, n).to(torch::kInt64).bitwise_and(kLimb - 1);
  return high_.narrow(0, start, n).to(torch::kInt64).mul_(kLimb).add_(lo);
}

void ExactGradients::store(int64_t start, int64_t n, const torch::Tensor& sums) {
  // sums = high 2^32 + low with low in [0, 2^32) (floor division: exact on
  // int64); |sums| < 2^62, so high fits int32. low is kept as the int32 of
  // the same 32 bits: low - 2^32 where low >= 2^31.
  const torch::Tensor high = sums.div(kLimb, "floor");
  torch::Tensor lo = sums - high * kLimb;
  lo.sub_(lo.ge(kLimb / 2).to(torch::kInt64).mul_(kLimb));
  high_.narrow(0, start, n).copy_(high);
  low(start, n).copy_(lo);
}

bool ExactGradients::end_pass(Comm& comm) {
  armed_ = false;
  const int64_t count = static_cast<int64_t>(parameters_.size());
  torch::Tensor everyone = largest_;
  if (comm.world_size() > 1) {
    // Max over ranks, from an all-gather: exact, whatever the order.
    everyone = torch::zeros({count * comm.world_size()}, largest_.options());
    comm.all_gather(largest_, everyone);
  }
  everyone = everyone.cpu().view({comm.world_size(), count});
  const auto all = everyone.accessor<double, 2>();
  bool accepted = true;
  for (int64_t i = 0; i < count; ++i) {
    // One contribution per backward, two where a parameter appears twice in
    // the graph: the bound that sizes the format (ExactGradients.h).
    if (calls_[i] > 2 * local_atoms_) {
      throw TrainingError(
          fmt::format("reproducible mode: parameter '{}' received {} gradients in one optimizer "
                      "step of {} backward passes on this rank; at most two per backward fit the "
                      "fixed-point format",
                      parameters_[i].name, calls_[i], local_atoms_));
    }
    double largest = 0.0;
    for (int r = 0; r < comm.world_size(); ++r) {
      const double m = all[r][i];
      largest = std::isnan(m) || std::isnan(largest) ? NAN : std::max(largest, m);
    }
    if (!std::isfinite(largest)) {
      nonfinite_ = true;
      continue;
    }
    if (largest == 0.0) {
      pending_[i] = exponents_[i];
      continue;
    }
    // largest in [2^e, 2^(e+1)): the chosen scale puts it in [2^(bits-5), 2^(bits-4)).
    const int64_t e = std::ilogb(largest);
    pending_[i] = bits_ - 5 - e;
    const int64_t top = exponents_[i] == kUnknown ? INT64_MIN : e + exponents_[i];
    if (top < bits_ - 9 || top > bits_ - 1) {
      exponents_[i] = pending_[i];
      accepted = false;
    }
  }
  return accepted || nonfinite_;
}

std::vector<torch::Tensor> ExactGradients::reduce(Comm& comm) {
  torch::NoGradGuard no_grad;
  if (!limbs_ && comm.world_size() > 1) comm.all_reduce_sum(accumulator_);
#ifdef TRAINER_CUDA_KERNELS
  // One rank's limb sums on CUDA: one launch per group converts every
  // parameter's (the chunked sequence below runs about eight LibTorch
  // launches per parameter: thousands a step).
  if (limbs_ && comm.world_size() == 1 && !group_starts_.empty() && ops::use_kernels(strategy_[0])) {
    for (size_t g = 0; g < strategy_.size(); ++g) {
      std::vector<double> scales;
      for (const size_t i : group_parameters_[g]) {
        scales.push_back(exponents_[i] == kUnknown ? 0.0 : std::ldexp(1.0, -static_cast<int>(exponents_[i])));
      }
      const torch::Tensor scale = torch::tensor(scales, torch::kFloat64).to(high_.device());
      const int64_t group_start = g == 0 ? 0 : decay_elements_;
      const torch::Tensor into = strategy_[g];
      const torch::Tensor high = high_.narrow(0, group_start, into.numel());
      const ops::KernelLaunch launch("fixed_point_limbs_to_float", {into, high, group_starts_[g], scale});
      ops::kernels::fixed_point_limbs_to_float(static_cast<int32_t*>(into.data_ptr()), high.data_ptr<int32_t>(),
                                               into.numel(), group_starts_[g].data_ptr<int64_t>(),
                                               static_cast<int>(scales.size()), scale.data_ptr<double>(),
                                               launch.stream());
      ops::check_launch("fixed_point_limbs_to_float");
    }
    exponents_ = pending_;
    return strategy_;
  }
#endif
  // The fp32 sums are written over the sums' own memory. Without limbs:
  // element k's fp32 value takes bytes [4k, 4k + 4) of the accumulator,
  // which hold int64 element k / 2 (rounded down), read before it is
  // overwritten: elements go in increasing order, a chunk at a time, each
  // chunk read whole into fp64 before any of it is written. No memory
  // beyond the accumulator and one chunk. With limbs: over element k's own
  // low limb (the strategy's gradient, as fp32), each chunk's int64 sums
  // made from both limbs and summed over ranks (int64, exact) first.
  const torch::Tensor whole =
      limbs_ ? torch::Tensor() : accumulator_.view(torch::kFloat32).narrow(0, 0, accumulator_.numel());
  const int64_t chunk = largest_.is_cuda() ? kDeviceConvertChunk : kConvertChunk;
  for (const size_t i : layout_) {
    const int64_t numel = parameters_[i].tensor.numel();
    const torch::Tensor into =
        limbs_ ? low(offsets_[i], numel).view(torch::kFloat32) : whole.narrow(0, offsets_[i], numel);
    if (exponents_[i] == kUnknown) {
      into.zero_();
      continue;
    }
    // int64 -> fp64 rounds only sums beyond 2^53, the power of two nothing,
    // -> fp32 (the copy) once more; all round to nearest, so equal integers
    // give equal bits.
    const double scale = std::ldexp(1.0, -static_cast<int>(exponents_[i]));
    for (int64_t start = 0; start < numel; start += chunk) {
      const int64_t n = std::min(chunk, numel - start);
      torch::Tensor sums = limbs_ ? combined(offsets_[i] + start, n) : accumulator_.narrow(0, offsets_[i] + start, n);
      if (limbs_ && comm.world_size() > 1) comm.all_reduce_sum(sums);
      into.narrow(0, start, n).copy_(sums.to(torch::kFloat64).mul_(scale));
    }
  }
  exponents_ = pending_;  // the next step's scales follow this step's contributions
  if (limbs_) return strategy_;
  std::vector<torch::Tensor> groups;
  if (decay_elements_ > 0) groups.push_back(whole.narrow(0, 0, decay_elements_));
  if (whole.numel() > decay_elements_)
    groups.push_back(whole.narrow(0, decay_elements_, whole.numel() - decay_elements_));
  return groups;
}

void ExactGradients::set_exponents(const std::vector<int64_t>& exponents) {
  if (exponents.size() != parameters_.size()) {
    throw std::invalid_argument(
        fmt::format("{} gradient exponents for {} parameters", exponents.size(), parameters_.size()));
  }
  exponents_ = exponents;
  pending_ = exponents;
}

}  // namespace trainer
