// The ops' CUDA paths (the project's kernels, LibTorch's fused RMSNorm and
// AdamW) held to their CPU paths on the same inputs, values and gradients.
#include <gtest/gtest.h>

#include <torch/autograd.h>
#include <torch/cuda.h>

#include "trainer/AdamW.h"
#include "trainer/Model.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"

namespace trainer {
namespace {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const torch::Device kCuda(torch::kCUDA, 0);

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kCPU, torch::kFloat64), y = b.to(torch::kCPU, torch::kFloat64);
  return ((x - y).norm() / y.norm()).item<double>();
}

// Tolerances: fp32 kernels against fp32 composites differ by a few roundings
// (~1e-7 each); 1e-5 leaves room for different summation orders. In bf16 the
// kernels round once where the composites round after every step (relative
// 2^-9 each; gradients pass through several), so the two differ by a few
// bf16 roundings: 2e-2.
double tolerance(torch::Dtype dtype) { return dtype == torch::kBFloat16 ? 2e-2 : 1e-5; }

// Runs `op` on CPU and CUDA copies of `input`, backpropagates the same random
// gradient, and compares outputs and input gradients.
template <typename Op>
void compare_paths(const std::string& name, const torch::Tensor& input, torch::Dtype dtype, Op op) {
  const torch::Tensor cpu = input.to(dtype).detach().set_requires_grad(true);
  const torch::Tensor gpu = input.to(kCuda, dtype).detach().set_requires_grad(true);
  const std::vector<torch::Tensor> out_cpu = op(cpu), out_gpu = op(gpu);
  ASSERT_EQ(out_cpu.size(), out_gpu.size());
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < out_cpu.size(); ++i) {
    ASSERT_TRUE(out_gpu[i].is_cuda());
    EXPECT_LT(relative_error(out_gpu[i], out_cpu[i]), tolerance(dtype)) << name << " output " << i << " " << dtype;
    grads.push_back(torch::randn(out_cpu[i].sizes()).to(dtype));
  }
  torch::autograd::backward(out_cpu, grads);
  for (torch::Tensor& g : grads) g = g.to(kCuda);
  torch::autograd::backward(out_gpu, grads);
  EXPECT_LT(relative_error(gpu.grad(), cpu.grad()), tolerance(dtype)) << name << " gradient " << dtype;
}

TEST(OpsGpu, RmsNormFusedMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(0);
  const torch::Tensor w = torch::randn({512});
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    compare_paths("rms_norm", torch::randn({64, 512}), dtype, [&](const torch::Tensor& x) {
      return std::vector<torch::Tensor>{ops::rms_norm(x, w.to(x.device(), dtype), 1e-6)};
    });
  }
}

TEST(OpsGpu, SplitQkvRotaryKernelMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(1);
  const int64_t b = 2, t = 33, heads = 6, kv = 2, d = 64;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    // A view of a wider projection output, as the model passes it.
    const torch::Tensor wide = torch::randn({b, t, (heads + 2 * kv) * d + 16});
    compare_paths("split_qkv_rotary", wide, dtype, [&](const torch::Tensor& x) {
      const auto tables = ops::RotaryTables::make(t, d, 1e6, dtype, x.device());
      const ops::QkvHeads out = ops::split_qkv_rotary(x.narrow(-1, 8, (heads + 2 * kv) * d), heads, kv, tables);
      return std::vector<torch::Tensor>{out.q, out.k, out.v};
    });
  }
}

TEST(OpsGpu, SwiGluKernelMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(2);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    compare_paths("swiglu", torch::randn({3, 37, 2 * 301}) * 3, dtype,
                  [](const torch::Tensor& x) { return std::vector<torch::Tensor>{ops::swiglu(x)}; });
  }
}

TEST(OpsGpu, LinearCrossEntropySumMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(3);
  torch::Tensor labels = torch::randint(0, 3000, {257}, torch::kInt64);
  labels.index_put_({torch::arange(0, 257, 5)}, kIgnoreIndex);
  const torch::Tensor w = torch::randn({3000, 64}) * 0.2;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    compare_paths("linear_cross_entropy_sum", torch::randn({257, 64}), dtype, [&](const torch::Tensor& h) {
      return std::vector<torch::Tensor>{
          ops::linear_cross_entropy_sum(h, w.to(h.device(), dtype), labels.to(h.device()), /*chunk_rows=*/50)};
    });
  }
}

TEST(OpsGpu, FusedAdamWMatchesTheCpuUpdate) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  torch::Tensor cpu = torch::randn({100003}), gpu = cpu.to(kCuda);
  AdamWState cpu_state = adamw_init(cpu), gpu_state = adamw_init(gpu);
  for (int64_t step = 1; step <= 3; ++step) {
    const torch::Tensor grads = torch::randn({100003});
    adamw_update(cpu, grads.clone(), cpu_state, config, /*decay=*/true, 1e-3 * step, step, /*grad_scale=*/0.5);
    adamw_update(gpu, grads.to(kCuda), gpu_state, config, /*decay=*/true, 1e-3 * step, step, 0.5);
  }
  // Both compute in fp32; the fused kernel orders a few operations differently.
  EXPECT_LT(relative_error(gpu, cpu), 1e-6);
  EXPECT_LT(relative_error(gpu_state.exp_avg_sq, cpu_state.exp_avg_sq), 1e-5);
}

}  // namespace
}  // namespace trainer
