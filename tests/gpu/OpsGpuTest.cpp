// The ops' CUDA paths (the project's kernels, LibTorch's fused RMSNorm and
// AdamW) held to their CPU paths on the same inputs, values and gradients.
#include <cmath>
#include <limits>

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

// The fused softmax kernel against the fp64 CPU path, for the loss and both
// gradients, at a vocabulary that is not a multiple of 4 (the kernel's
// scalar path) and one that is (its vector loads), with -inf logits in a
// row (a masked vocabulary entry) that must not turn the row's loss NaN.
TEST(OpsGpu, LinearCrossEntropyKernelGivesTheLossAndBothGradients) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  for (const int64_t vocab : {3001, 3000}) {
    torch::Tensor labels = torch::randint(0, vocab, {300}, torch::kInt64);
    labels.index_put_({torch::arange(0, 300, 7)}, kIgnoreIndex);
    const torch::Tensor hidden = torch::randn({300, 64}), weight = torch::randn({vocab, 64}) * 0.2;
    auto run = [&](torch::Device device, torch::Dtype dtype) {
      const torch::Tensor h = hidden.to(device, dtype).detach().set_requires_grad(true);
      const torch::Tensor w = weight.to(device, dtype).detach().set_requires_grad(true);
      const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, labels.to(device), /*chunk_rows=*/64);
      (loss * 0.5).backward();
      return std::vector<torch::Tensor>{loss.detach(), h.grad(), w.grad()};
    };
    const std::vector<torch::Tensor> reference = run(torch::kCPU, torch::kFloat64);
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const std::vector<torch::Tensor> gpu = run(kCuda, dtype);
      // bf16 inputs round the GEMM operands (2^-9 relative) before fp32 accumulation: 2e-2, as above.
      const char* names[] = {"loss", "hidden gradient", "weight gradient"};
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_LT(relative_error(gpu[i], reference[i]), tolerance(dtype)) << names[i] << " " << dtype << " vocab " << vocab;
      }
    }
  }
  // A weight row of -inf against hidden rows of ones: logit -inf in every row
  // (without gradients: the kernel's loss-only path).
  const torch::Tensor h = torch::ones({2, 4}, torch::TensorOptions().device(kCuda));
  torch::Tensor w = torch::zeros({8, 4}, torch::TensorOptions().device(kCuda));
  w[3].fill_(-std::numeric_limits<float>::infinity());
  const torch::Tensor labels = torch::tensor({1, 2}, torch::kInt64).to(kCuda);
  const double loss = ops::linear_cross_entropy_sum(h, w, labels).item<double>();
  EXPECT_NEAR(loss, 2 * std::log(7.0), 1e-5) << "a -inf logit counts as probability 0";
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
