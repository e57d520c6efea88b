// bf16 optimizer state with stochastic rounding (see trainer/sharding/LowPrecisionState.h).
#include "trainer/sharding/LowPrecisionState.h"

#include <algorithm>

#include "ops/Dispatch.h"

namespace trainer {

namespace {

constexpr int64_t kLow31 = 0x7fffffff;

// A 31-bit mix: every product stays below 2^62, so int64 tensors never overflow.
torch::Tensor mix(torch::Tensor x) {
  x = (x * 0x2c1b3c6d).bitwise_and_(kLow31);
  x = x.bitwise_xor(x.bitwise_right_shift(12));
  x = (x * 0x297a2d39).bitwise_and_(kLow31);
  return x.bitwise_xor(x.bitwise_right_shift(15));
}

}  // namespace

uint64_t state_stream(int64_t step, size_t which, size_t group) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(step);
  for (uint64_t v : {static_cast<uint64_t>(which) + 1, static_cast<uint64_t>(group) + 1}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h;
}

void stochastic_round(torch::Tensor dst, const torch::Tensor& src, uint64_t stream, int64_t first_index) {
  torch::NoGradGuard no_grad;
  const int64_t n = src.numel();
  if (n == 0) return;
#ifdef TRAINER_CUDA_KERNELS
  if (src.is_cuda() && dst.is_cuda() && src.scalar_type() == torch::kFloat32 && dst.scalar_type() == torch::kBFloat16 &&
      dst.is_contiguous() && dst.numel() == n) {
    const torch::Tensor values = src.contiguous();
    const ops::KernelLaunch launch("stochastic_round", {values, dst});
    ops::kernels::stochastic_round_bf16(values.data_ptr<float>(), dst.data_ptr(), n, stream, first_index,
                                        launch.stream());
    ops::check_launch("stochastic_round");
    return;
  }
#endif
  const auto longs = src.options().dtype(torch::kInt64);
  const torch::Tensor index = torch::arange(first_index, first_index + n, longs);
  const int64_t seed_low = static_cast<int64_t>(stream & kLow31);
  const int64_t seed_high = static_cast<int64_t>((stream >> 31) & kLow31);
  torch::Tensor x = mix(index.bitwise_and(kLow31).bitwise_xor(seed_low));
  x = mix(x.bitwise_xor(index.bitwise_right_shift(31)).bitwise_xor(seed_high));
  const torch::Tensor noise = x.bitwise_and(0xffff);
  const torch::Tensor bits = src.contiguous().view(torch::kInt32).to(torch::kInt64);  // sign-extended
  const torch::Tensor magnitude = bits.bitwise_and(kLow31);
  torch::Tensor rounded = (magnitude + noise).bitwise_and(0x7fff0000);
  rounded = torch::where(magnitude > 0x7f800000, magnitude, rounded);  // NaN stays NaN
  rounded = torch::where(bits < 0, rounded - (int64_t(1) << 31), rounded);
  dst.copy_(rounded.to(torch::kInt32).view(torch::kFloat32).view(dst.sizes()));
}

void with_wide_state(UpdateSlice& slice, int64_t step,
                     const std::function<void(UpdateSlice& part, int64_t begin, int64_t length)>& update) {
  const bool narrow = std::any_of(slice.state.begin(), slice.state.end(), [](const torch::Tensor& t) {
    return t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64;
  });
  const int64_t n = slice.values.numel();
  if (!narrow) {
    update(slice, 0, n);
    return;
  }
  // Chunks bound the fp32 copies (and the rounding's int64 temporaries).
  const int64_t chunk = slice.values.is_cuda() ? int64_t(1) << 24 : int64_t(1) << 20;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t length = std::min(chunk, n - begin);
    UpdateSlice part;
    part.group = slice.group;
    part.offset = slice.offset + begin;
    part.decay = slice.decay;
    part.values = slice.values.narrow(0, begin, length);
    part.gradient = slice.gradient.narrow(0, begin, length);
    if (slice.compute.defined()) part.compute = slice.compute.narrow(0, begin, length);
    for (const torch::Tensor& t : slice.state) part.state.push_back(t.narrow(0, begin, length).to(torch::kFloat32));
    update(part, begin, length);
    for (size_t k = 0; k < slice.state.size(); ++k) {
      torch::Tensor into = slice.state[k].narrow(0, begin, length);
      if (into.scalar_type() == torch::kFloat32) {
        into.copy_(part.state[k]);
      } else {
        stochastic_round(into, part.state[k], state_stream(step, k, slice.group), part.offset);
      }
    }
  }
}

}  // namespace trainer
