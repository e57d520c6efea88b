// The ops' CUDA paths (the project's kernels, LibTorch's fused RMSNorm for fp32 and
// AdamW) held to their CPU paths on the same inputs, values and gradients.
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>

#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "gpu/GpuTestSupport.h"
#include "ops/Dispatch.h"
#include "reproducible/ExactGradients.h"
#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/ops/Attention.h"
#include "trainer/ops/Embedding.h"
#include "trainer/ops/Linear.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/LowPrecisionState.h"

namespace trainer {
namespace {

using testing::kCuda;

// The project's cuBLASLt GEMMs on or off for a scope (process-wide).
struct LtGemms {
  explicit LtGemms(bool on) : before_(ops::lt_gemms_enabled()) { ops::set_lt_gemms(on); }
  ~LtGemms() { ops::set_lt_gemms(before_); }
  LtGemms(const LtGemms&) = delete;
  LtGemms& operator=(const LtGemms&) = delete;

 private:
  bool before_;
};

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

// The project's RMSNorm kernels (bf16) against fp64 autograd of the
// definition on the same bf16 values: the output, the input gradient and
// the weight gradient, at widths of a partial warp (896), of whole warps
// (2048) and at the kernels' largest (4096), over 208 rows; then a width
// they do not take (LibTorch's kernels then). Tolerance: each result is
// computed in fp32 from exact bf16 inputs and rounded to bf16 once
// (2^-9 relative at most); 5e-3 is twice that in norm.
// The weight gradient, a two-stage sum in an order fixed by the shape, is
// the same bits every run; added into a bound fp32 buffer, it is the bf16
// result before its rounding (rounded, the same bits), and adds up over
// micro-steps.
TEST(OpsGpu, RmsNormKernelsMatchFp64) {
  REQUIRE_CUDA();
  torch::manual_seed(16);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const double eps = 1e-6;
  for (const int64_t width : {896, 2048, 4096, 4104}) {
    const torch::Tensor xs = (torch::randn({2, 104, width}) * 3).to(bf16), ws = (torch::randn({width}) + 1).to(bf16);
    const torch::Tensor dy = torch::randn({2, 104, width}).to(bf16);
    const torch::Tensor x64 = xs.to(torch::kCPU, torch::kFloat64).requires_grad_(true);
    const torch::Tensor w64 = ws.to(torch::kCPU, torch::kFloat64).requires_grad_(true);
    const torch::Tensor y64 = x64 / torch::sqrt(x64.pow(2).mean(-1, true) + eps) * w64;
    y64.backward(dy.to(torch::kCPU, torch::kFloat64));
    auto run = [&]() {
      const torch::Tensor x = xs.clone().requires_grad_(true), w = ws.clone().requires_grad_(true);
      const torch::Tensor y = ops::rms_norm(x, w, eps);
      y.backward(dy);
      return std::vector<torch::Tensor>{y, x.grad(), w.grad()};
    };
    const std::vector<torch::Tensor> first = run(), second = run();
    const torch::Tensor expected[] = {y64, x64.grad(), w64.grad()};
    const char* names[] = {"output", "input gradient", "weight gradient"};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(first[i].scalar_type(), torch::kBFloat16) << names[i];
      EXPECT_LT(relative_error(first[i], expected[i]), 5e-3) << names[i] << ", width " << width;
      if (width <= 4096) {
        EXPECT_TRUE(torch::equal(first[i], second[i])) << names[i] << " differs between runs, width " << width;
      }
    }
    const torch::Tensor w = ws.clone().requires_grad_(true);
    const torch::Tensor buffer = torch::zeros({width}, bf16.dtype(torch::kFloat32));
    w.mutable_grad() = buffer;
    ops::rms_norm(xs, w, eps).backward(dy);
    EXPECT_EQ(w.grad().data_ptr(), buffer.data_ptr());
    if (width <= 4096) {
      EXPECT_TRUE(torch::equal(buffer.to(torch::kBFloat16), first[2])) << "bound buffer, width " << width;
      const torch::Tensor once = buffer.clone();
      ops::rms_norm(xs, w, eps).backward(dy);
      EXPECT_TRUE(torch::equal(buffer, once * 2)) << "a second micro-step adds the same sum";
    }
    EXPECT_LT(relative_error(buffer.to(torch::kBFloat16), expected[2] * (width <= 4096 ? 2 : 1)), 5e-3);
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

// bf16 rows on 16-byte boundaries take the vector kernels (eight pairs a
// thread), others the scalar ones: the same values placed both ways give
// the same bits, forward (q/k/v read from an aligned or a one-element-off
// view) and backward (incoming gradients aligned or one element off), so
// which path runs never changes a result (reproducible mode relies on it).
TEST(OpsGpu, RotaryVectorAndScalarKernelsGiveTheSameBits) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const int64_t b = 2, t = 33, heads = 6, kv = 2, d = 64, width = (heads + 2 * kv) * d;
  const auto options = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const torch::Tensor values = torch::randn({b, t, width}).to(options);
  const auto tables = ops::RotaryTables::make(t, d, 1e6, torch::kBFloat16, kCuda);
  // A contiguous copy of `like` whose data starts `offset` elements into a buffer.
  auto placed = [&](const torch::Tensor& like, int64_t offset) {
    torch::Tensor flat = torch::zeros({like.numel() + 8}, options).narrow(0, offset, like.numel());
    torch::Tensor out = flat.view(like.sizes());
    out.copy_(like);
    return out;
  };
  std::vector<torch::Tensor> grads;
  for (const int64_t h : {heads, kv, kv}) grads.push_back(torch::randn({b, t, h, d}).to(options));
  auto run = [&](int64_t offset) {
    const torch::Tensor wide = torch::zeros({b, t, width + 8}, options);
    wide.narrow(-1, offset, width).copy_(values);
    const torch::Tensor leaf = wide.detach().set_requires_grad(true);
    const ops::QkvHeads out = ops::split_qkv_rotary(leaf.narrow(-1, offset, width), heads, kv, tables);
    std::vector<torch::Tensor> incoming;
    for (const torch::Tensor& g : grads) incoming.push_back(placed(g, offset));
    const torch::Tensor grad = torch::autograd::grad({out.q, out.k, out.v}, {leaf}, incoming)[0];
    return std::vector<torch::Tensor>{out.q, out.k, out.v, grad.narrow(-1, offset, width)};
  };
  const std::vector<torch::Tensor> vector_path = run(0), scalar_path = run(1);
  const char* names[] = {"q", "k", "v", "gradient"};
  for (size_t i = 0; i < vector_path.size(); ++i) {
    EXPECT_TRUE(torch::equal(vector_path[i], scalar_path[i])) << names[i];
  }
  EXPECT_GT(vector_path[0].abs().sum().item<double>(), 0.0);  // not two empty results
}

// Packed documents: per-token tables (positions restarting at each
// document) through the kernel, which indexes them by token.
TEST(OpsGpu, PerTokenRotaryKernelMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(2);
  const int64_t b = 2, t = 33, heads = 6, kv = 2, d = 64;
  const torch::Tensor positions =
      torch::cat({torch::arange(20), torch::arange(13), torch::arange(5), torch::arange(28)}).view({b, t});
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    compare_paths("split_qkv_rotary per token", torch::randn({b, t, (heads + 2 * kv) * d}), dtype,
                  [&](const torch::Tensor& x) {
                    const auto tables =
                        ops::RotaryTables::make(t, d, 1e6, dtype, x.device()).at_positions(positions.to(x.device()));
                    const ops::QkvHeads out = ops::split_qkv_rotary(x, heads, kv, tables);
                    return std::vector<torch::Tensor>{out.q, out.k, out.v};
                  });
  }
}

// Attention within documents: SDPA with the document mask on CUDA against
// the CPU path, values and the gradient of q (k and v through the same
// kernel).
TEST(OpsGpu, DocumentAttentionMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(3);
  const int64_t b = 2, heads = 4, kv = 2, t = 40, d = 64;
  const torch::Tensor documents =
      torch::cat({torch::full({17}, 0), torch::full({20}, 1), torch::full({3}, 2), torch::full({40}, 0)})
          .view({b, t})
          .to(torch::kInt64);
  const torch::Tensor k = torch::randn({b, kv, t, d}), v = torch::randn({b, kv, t, d});
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    compare_paths("document_causal_attention", torch::randn({b, heads, t, d}), dtype, [&](const torch::Tensor& q) {
      return std::vector<torch::Tensor>{ops::document_causal_attention(
          q, k.to(q.device(), dtype), v.to(q.device(), dtype), documents.to(q.device()))};
    });
  }
}

// Packed documents through the variable-length flash kernel (bf16, grouped
// k/v heads read in place) against the masked path in fp32 on the same GPU:
// values and the gradients of q, k and v. Rows with several documents, a
// row that is one document, a one-token document; seq not a multiple of
// the kernel's tiles. Tolerance: bf16 inputs and output (2^-9 relative each)
// through a softmax and two products, as tolerance(kBFloat16) allows.
TEST(OpsGpu, VariableLengthAttentionMatchesTheMaskedPath) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const int64_t b = 3, heads = 14, kv = 2, t = 150, d = 64;
  const torch::Tensor ids = torch::cat({torch::full({70}, 0), torch::full({1}, 1), torch::full({79}, 2),
                                        torch::full({150}, 0), torch::full({40}, 0), torch::full({110}, 1)})
                                .view({b, t})
                                .to(torch::kInt64);
  const ops::DocumentLayout layout = ops::document_layout(ids);
  ASSERT_EQ(layout.offsets.size(0), 7);
  const auto leaf = [](const torch::Tensor& x, torch::Dtype dtype) {
    return x.to(kCuda, dtype).detach().set_requires_grad(true);
  };
  // Heads split from [batch, seq, heads, dim], as the models do.
  const torch::Tensor q0 = torch::randn({b, t, heads, d}), k0 = torch::randn({b, t, kv, d}),
                      v0 = torch::randn({b, t, kv, d}), g = torch::randn({b, heads, t, d});
  const torch::Tensor q = leaf(q0, torch::kBFloat16), k = leaf(k0, torch::kBFloat16), v = leaf(v0, torch::kBFloat16);
  const torch::Tensor out =
      ops::document_causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     ops::DocumentLayout{ids.to(kCuda), layout.offsets.to(kCuda), layout.longest});
  const torch::Tensor q32 = leaf(q0.to(torch::kBFloat16), torch::kFloat32),
                      k32 = leaf(k0.to(torch::kBFloat16), torch::kFloat32),
                      v32 = leaf(v0.to(torch::kBFloat16), torch::kFloat32);
  const torch::Tensor reference =
      ops::document_causal_attention(q32.transpose(1, 2), k32.transpose(1, 2), v32.transpose(1, 2), ids.to(kCuda));
  ASSERT_EQ(out.sizes(), reference.sizes());
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  // The variable-length kernel ran (not the mask): its node lies a few views below the output.
  bool flash = false;
  std::vector<torch::autograd::Node*> nodes = {out.grad_fn().get()};
  for (int depth = 0; depth < 6 && !flash; ++depth) {
    std::vector<torch::autograd::Node*> next;
    for (torch::autograd::Node* node : nodes) {
      if (node == nullptr) continue;
      flash = flash || node->name().find("FlashAttention") != std::string::npos;
      for (const auto& edge : node->next_edges()) next.push_back(edge.function.get());
    }
    nodes = next;
  }
  EXPECT_TRUE(flash) << "the output's graph has no flash attention node: " << out.grad_fn()->name();
  EXPECT_LT(relative_error(out, reference), tolerance(torch::kBFloat16));
  out.backward(g.to(kCuda, torch::kBFloat16));
  reference.backward(g.to(kCuda, torch::kBFloat16).to(torch::kFloat32));
  EXPECT_LT(relative_error(q.grad(), q32.grad()), tolerance(torch::kBFloat16)) << "q";
  EXPECT_LT(relative_error(k.grad(), k32.grad()), tolerance(torch::kBFloat16)) << "k";
  EXPECT_LT(relative_error(v.grad(), v32.grad()), tolerance(torch::kBFloat16)) << "v";
  // The documents matter: plain causal attention over the rows differs.
  const torch::Tensor causal = ops::causal_attention(q32.transpose(1, 2), k32.transpose(1, 2), v32.transpose(1, 2));
  EXPECT_GT(relative_error(causal, reference), 0.1);
}

TEST(OpsGpu, SwiGluKernelMatchesTheCpuPath) {
  REQUIRE_CUDA();
  torch::manual_seed(2);
  // Width 301: the scalar path; 1288: 16-byte packs in every dtype, more
  // than one block per row; 70000 rows: more rows than the grid's y extent.
  const std::vector<std::vector<int64_t>> shapes = {{3, 37, 2 * 301}, {3, 37, 2 * 1288}, {70000, 2 * 8}};
  for (const auto& shape : shapes) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
      compare_paths("swiglu", torch::randn(shape) * 3, dtype,
                    [](const torch::Tensor& x) { return std::vector<torch::Tensor>{ops::swiglu(x)}; });
    }
  }
}

// bf16 weights whose .grad are views of one fp32 buffer (as the strategies
// bind them): the GEMM adds each micro-step's weight gradient into them in
// fp32. Reference: sum over micro-steps of dY^T X in fp64 from the same bf16
// values. bf16 x bf16 products are exact in fp32 and 2 x 300 of them are
// summed in fp32: relative error a few 1e-7, so 1e-5; a bf16 rounding of each
// micro-step's gradient (the unfused path) would show as ~2e-3. Through
// LibTorch's GEMMs and through the project's cuBLASLt calls alike.
TEST(OpsGpu, LinearAddsWeightGradientsIntoBoundFp32Buffers) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const int64_t in = 64, rows_a = 48, rows_b = 80, tokens = 300;
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  for (const bool lt : {false, true}) {
    const LtGemms library(lt);
    for (const bool stacked : {true, false}) {
      const int64_t rows = stacked ? rows_a + rows_b : rows_a;
      const torch::Tensor flat = (torch::randn({rows * in}) * 0.1).to(bf16);
      const torch::Tensor buffer = torch::zeros({rows * in}, bf16.dtype(torch::kFloat32));
      std::vector<torch::Tensor> weights;
      for (const auto& [offset, r] : std::vector<std::pair<int64_t, int64_t>>{{0, rows_a}, {rows_a, rows_b}}) {
        if (offset + r > rows) break;
        torch::Tensor w = flat.narrow(0, offset * in, r * in).view({r, in}).detach().requires_grad_(true);
        w.mutable_grad() = buffer.narrow(0, offset * in, r * in).view({r, in});
        weights.push_back(w);
      }
      torch::Tensor expected = torch::zeros({rows, in}, torch::kFloat64);
      for (int micro = 0; micro < 2; ++micro) {
        const torch::Tensor x = torch::randn({tokens, in}).to(bf16);
        const torch::Tensor dy = torch::randn({tokens, rows}).to(bf16);
        ops::linear(x, weights).backward(dy);
        expected += dy.to(torch::kCPU, torch::kFloat64).t().mm(x.to(torch::kCPU, torch::kFloat64));
      }
      for (const torch::Tensor& w : weights) {
        const void* bound = buffer.data_ptr<float>() + (w.data_ptr<at::BFloat16>() - flat.data_ptr<at::BFloat16>());
        EXPECT_EQ(static_cast<const void*>(w.grad().data_ptr()), bound) << "the bound buffer was replaced";
      }
      EXPECT_LT(relative_error(buffer.view({rows, in}), expected), 1e-5)
          << (stacked ? "stacked" : "one weight") << (lt ? ", cuBLASLt" : ", LibTorch");
    }
  }
  // Unbound: autograd's own bf16 gradient, as before.
  torch::Tensor w = (torch::randn({rows_a, in}) * 0.1).to(bf16).requires_grad_(true);
  const torch::Tensor x = torch::randn({tokens, in}).to(bf16);
  const torch::Tensor dy = torch::randn({tokens, rows_a}).to(bf16);
  ops::linear(x, {w}).backward(dy);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
  EXPECT_LT(relative_error(w.grad(), dy.to(torch::kCPU, torch::kFloat64).t().mm(x.to(torch::kCPU, torch::kFloat64))),
            tolerance(torch::kBFloat16));
}

// FP8 linear layers on for a scope (ops::set_fp8_linear is process-wide).
struct Fp8On {
  Fp8On() { ops::set_fp8_linear(true); }
  ~Fp8On() {
    ops::set_fp8_linear(false);
    ops::set_fp8_rowwise_scaling(false);
  }
  Fp8On(const Fp8On&) = delete;
  Fp8On& operator=(const Fp8On&) = delete;
};

// The linear layers' compute for a test's pass: bf16, FP8 per tensor or FP8 per row.
enum class Compute { bf16, tensorwise, rowwise };
const char* name_of(Compute c) {
  return c == Compute::bf16 ? "bf16" : c == Compute::tensorwise ? "fp8 tensorwise" : "fp8 rowwise";
}
void set_compute(Compute c) {
  ops::set_fp8_linear(c != Compute::bf16);
  ops::set_fp8_rowwise_scaling(c == Compute::rowwise);
}

// Each row's error relative to that row's norm, the worst row's (rows with a zero reference left out).
double worst_row_error(const torch::Tensor& got, const torch::Tensor& expected) {
  const torch::Tensor x = got.to(torch::kCPU, torch::kFloat64).reshape({-1, got.size(-1)});
  const torch::Tensor y = expected.to(torch::kCPU, torch::kFloat64).reshape({-1, got.size(-1)});
  const torch::Tensor norms = y.norm(2, {1});
  const torch::Tensor errors = (x - y).norm(2, {1}) / norms;
  return errors.masked_select(norms > 0).max().item<double>();
}

// training.precision = "fp8": the linear layers' products in E4M3 (forward)
// and E5M2 x E4M3 (input and weight gradients), held to an fp64 reference.
// Tolerances from the formats: a cast rounds to 3 (E4M3) or 2 (E5M2)
// mantissa bits, a relative error of at most 2^-4 or 2^-3 per element. A
// dot product of independent errors is off by about the root sum of its
// operands' errors relative to its size: at most sqrt(2) 2^-4 forward and
// sqrt(2^-6 + 2^-8) for both gradients. bf16 alone rounds at 2^-9, so
// an error above 4e-3 shows the FP8 path ran.
TEST(OpsGpu, Fp8LinearIsWithinFp8Precision) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available()) << "a CUDA build with LibTorch >= 2.9 has FP8 linear layers";
  const Fp8On on;
  torch::manual_seed(8);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64); };
  const int64_t tokens = 256, in = 512, out = 384;
  const torch::Tensor x = torch::randn({2, tokens / 2, in}).to(bf16).requires_grad_(true);
  const torch::Tensor w = (torch::randn({out, in}) * 0.05).to(bf16).requires_grad_(true);
  const torch::Tensor b = (torch::randn({out}) * 0.1).to(bf16).requires_grad_(true);
  const torch::Tensor y = ops::linear(x, {w}, {b});
  const torch::Tensor expected = f64(x).matmul(f64(w).t()) + f64(b);
  const double forward = relative_error(y, expected);
  EXPECT_LT(forward, std::sqrt(2.0) * 0.0625);
  EXPECT_GT(forward, 4e-3) << "no FP8 rounding: the bf16 path ran";
  const torch::Tensor dy = torch::randn({2, tokens / 2, out}).to(bf16);
  y.backward(dy);
  const double dx = relative_error(x.grad(), f64(dy).matmul(f64(w)));
  EXPECT_LT(dx, std::sqrt(std::pow(2.0, -6) + std::pow(2.0, -8)));
  EXPECT_GT(dx, 4e-3) << "no FP8 rounding in the input gradient";
  const torch::Tensor dw_expected = f64(dy).reshape({tokens, out}).t().mm(f64(x).reshape({tokens, in}));
  const double dw = relative_error(w.grad(), dw_expected);
  EXPECT_LT(dw, std::sqrt(std::pow(2.0, -6) + std::pow(2.0, -8)));
  EXPECT_GT(dw, 4e-3) << "no FP8 rounding in the weight gradient";
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
  // The bias gradient is a bf16 sum.
  EXPECT_LT(relative_error(b.grad(), f64(dy).reshape({tokens, out}).sum(0)), tolerance(torch::kBFloat16));
  {
    // A weight whose .grad a strategy bound to an fp32 buffer: each
    // micro-step's FP8 weight gradient is added there in fp32 (two
    // micro-steps: twice the product, to FP8's precision, in the same buffer).
    const torch::Tensor wb = w.detach().clone().requires_grad_(true);
    const torch::Tensor buffer = torch::zeros({out, in}, bf16.dtype(torch::kFloat32));
    wb.mutable_grad() = buffer;
    for (int micro = 0; micro < 2; ++micro) ops::linear(x.detach(), {wb}, {}).backward(dy);
    EXPECT_EQ(wb.grad().data_ptr(), buffer.data_ptr());
    const double accumulated = relative_error(buffer, 2 * dw_expected);
    EXPECT_LT(accumulated, std::sqrt(std::pow(2.0, -6) + std::pow(2.0, -8)));
    EXPECT_GT(accumulated, 4e-3) << "no FP8 rounding in the bound weight gradient";
  }

  torch::NoGradGuard no_grad;
  // All zeros: scale 1, the product exactly the bias.
  EXPECT_TRUE(torch::equal(ops::linear(torch::zeros({tokens, in}, bf16), {w}, {b}), b.expand({tokens, out})));
  // A NaN anywhere in the input reaches the output instead of a silent zero scale.
  torch::Tensor poisoned = torch::randn({tokens, in}).to(bf16);
  poisoned[3][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(torch::isfinite(ops::linear(poisoned, {w})).all().item<bool>());
  // A value far beyond E4M3's range (448) is scaled, not saturated: the product holds.
  const torch::Tensor large = torch::randn({tokens, in}).to(bf16) * 1e4;
  EXPECT_LT(relative_error(ops::linear(large, {w}), f64(large).mm(f64(w).t())), std::sqrt(2.0) * 0.0625);
  // Dimensions that are not multiples of 16 stay bf16: LibTorch's own linear, bit for bit.
  const torch::Tensor odd = torch::randn({tokens + 3, in}).to(bf16);
  EXPECT_TRUE(torch::equal(ops::linear(odd, {w}), torch::linear(odd, w)));
}

// training.fp8_scaling = "rowwise": every token of x and dY and every
// channel of W has its own scale. Tokens whose magnitudes span 2^-12 ..
// 2^12 in x and 2^-20 .. 2^20 in dY (outliers beside ordinary ones), and
// weights whose rows and columns span 2^-4 .. 2^4, keep FP8's precision row
// by row (the bounds of Fp8LinearIsWithinFp8Precision, per row). One scale
// per tensor loses the small tokens: they fall below the smallest
// subnormal, 2^-9 for E4M3 (whose largest value is 448, a range of 2^17.8
// against x's 2^24) and 2^-16 for E5M2 (largest 57344: 2^31.8 against dY's
// 2^40). The weight gradient is bf16's, bit for bit.
TEST(OpsGpu, Fp8RowwiseScalingKeepsEveryTokensPrecision) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  torch::manual_seed(21);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64); };
  const int64_t tokens = 256, in = 512, out = 384;
  const auto spread = [](int64_t n, int64_t period, int64_t half) {
    return torch::pow(2.0, (torch::arange(n) % period - half).to(torch::kFloat64));
  };
  const torch::Tensor xs = (torch::randn({tokens, in}, torch::kFloat64) * spread(tokens, 25, 12).unsqueeze(1)).to(bf16);
  const torch::Tensor dys =
      (torch::randn({tokens, out}, torch::kFloat64) * spread(tokens, 41, 20).unsqueeze(1)).to(bf16);
  const torch::Tensor ws =
      (torch::randn({out, in}, torch::kFloat64) * 0.05 * spread(out, 9, 4).unsqueeze(1) * spread(in, 9, 4).unsqueeze(0))
          .to(bf16);
  auto run = [&](Compute c) {
    set_compute(c);
    const torch::Tensor x = xs.clone().requires_grad_(true), w = ws.clone().requires_grad_(true);
    const torch::Tensor y = ops::linear(x, {w});
    y.backward(dys);
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const std::vector<torch::Tensor> rowwise = run(Compute::rowwise), tensorwise = run(Compute::tensorwise),
                                   plain = run(Compute::bf16);
  const torch::Tensor y_expected = f64(xs).mm(f64(ws).t()), dx_expected = f64(dys).mm(f64(ws));
  const double forward_bound = std::sqrt(2.0) * 0.0625,
               gradient_bound = std::sqrt(std::pow(2.0, -6) + std::pow(2.0, -8));
  EXPECT_LT(worst_row_error(rowwise[0], y_expected), forward_bound);
  EXPECT_LT(worst_row_error(rowwise[1], dx_expected), gradient_bound);
  EXPECT_GT(relative_error(rowwise[0], y_expected), 4e-3) << "no FP8 rounding in the output: the bf16 path ran";
  EXPECT_GT(relative_error(rowwise[1], dx_expected), 4e-3) << "no FP8 rounding in the input gradient";
  // What one scale per tensor does to the same data: the small tokens are lost.
  EXPECT_GT(worst_row_error(tensorwise[0], y_expected), 0.5);
  EXPECT_GT(worst_row_error(tensorwise[1], dx_expected), 0.5);
  EXPECT_TRUE(torch::equal(rowwise[2], plain[2])) << "the weight gradient is not bf16's";

  set_compute(Compute::rowwise);
  // With a bias (the scaled GEMM adds it), and into a bound fp32 buffer: the bf16 GEMM's fp32 accumulation.
  const torch::Tensor x = torch::randn({tokens, in}).to(bf16), w = (torch::randn({out, in}) * 0.05).to(bf16);
  const torch::Tensor b = (torch::randn({out}) * 0.1).to(bf16);
  EXPECT_LT(relative_error(ops::linear(x, {w}, {b}), f64(x).mm(f64(w).t()) + f64(b)), forward_bound);
  const torch::Tensor wb = w.clone().requires_grad_(true);
  const torch::Tensor buffer = torch::zeros({out, in}, bf16.dtype(torch::kFloat32));
  wb.mutable_grad() = buffer;
  const torch::Tensor dy = torch::randn({tokens, out}).to(bf16);
  for (int micro = 0; micro < 2; ++micro) ops::linear(x, {wb}).backward(dy);
  EXPECT_EQ(wb.grad().data_ptr(), buffer.data_ptr());
  // bf16 operands, fp32 products summed in fp32: far inside bf16's own rounding.
  EXPECT_LT(relative_error(buffer, 2 * f64(dy).t().mm(f64(x))), 1e-5);
  torch::NoGradGuard no_grad;
  // A NaN in one token reaches that token's output, and only its.
  torch::Tensor poisoned = x.clone();
  poisoned[3][7] = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor finite = torch::isfinite(ops::linear(poisoned, {w})).all(1).to(torch::kCPU);
  EXPECT_FALSE(finite[3].item<bool>());
  EXPECT_EQ(finite.sum().item<int64_t>(), tokens - 1);
  // A token of zeros: scale 1, exactly the bias.
  torch::Tensor zero_row = x.clone();
  zero_row[5].zero_();
  EXPECT_TRUE(torch::equal(ops::linear(zero_row, {w}, {b})[5], b));
}

// The FP8 casts' vector kernels (16-byte loads; a tile of 64 rows x 128
// columns a block for the transposed casts) and their scalar kernels (taken for data 2 bytes off
// alignment) give the same bits: the forward, input and weight gradients of
// a linear layer whose input, weight and output gradient start aligned and
// then one element off.
TEST(OpsGpu, Fp8VectorAndScalarKernelsGiveTheSameBits) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  torch::manual_seed(9);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  // Tiles cut at the edge: 208 rows are not a multiple of 64, 320 columns (dy) and 208 (x^T's rows) not of 128.
  const int64_t tokens = 208, in = 256, out = 320;
  const torch::Tensor xs = torch::randn({tokens, in}).to(bf16), ws = (torch::randn({out, in}) * 0.05).to(bf16);
  const torch::Tensor dys = torch::randn({tokens, out}).to(bf16);
  // A contiguous copy of `like` whose data starts `offset` elements into a buffer.
  auto placed = [&](const torch::Tensor& like, int64_t offset) {
    torch::Tensor t = torch::zeros({like.numel() + 8}, bf16).narrow(0, offset, like.numel()).view(like.sizes());
    t.copy_(like);
    return t;
  };
  auto run = [&](int64_t offset) {
    const torch::Tensor x = placed(xs, offset).detach().requires_grad_(true);
    const torch::Tensor w = placed(ws, offset).detach().requires_grad_(true);
    const torch::Tensor y = ops::linear(x, {w});
    y.backward(placed(dys, offset));
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  // Rowwise scaling leaves the weight gradient to bf16's GEMM on the
  // operands as given (no cast of ours runs), and cuBLAS picks its kernel,
  // and so its summation order, by the operands' alignment: there the
  // weight gradient is held to the bf16 path's at the same alignment.
  set_compute(Compute::bf16);
  const std::vector<torch::Tensor> bf16_aligned = run(0), bf16_shifted = run(1);
  for (const Compute c : {Compute::tensorwise, Compute::rowwise}) {
    set_compute(c);
    const std::vector<torch::Tensor> vector_path = run(0), scalar_path = run(1);
    const char* names[] = {"output", "input gradient", "weight gradient"};
    for (size_t i = 0; i < vector_path.size(); ++i) {
      if (c == Compute::rowwise && i == 2) {
        EXPECT_TRUE(torch::equal(vector_path[i], bf16_aligned[i])) << names[i] << ", " << name_of(c);
        EXPECT_TRUE(torch::equal(scalar_path[i], bf16_shifted[i])) << names[i] << ", " << name_of(c);
        continue;
      }
      EXPECT_TRUE(torch::equal(vector_path[i], scalar_path[i])) << names[i] << ", " << name_of(c);
    }
    // And FP8 ran: the output is off bf16's product by FP8's rounding.
    EXPECT_GT(relative_error(vector_path[0], xs.to(torch::kFloat64).mm(ws.to(torch::kFloat64).t())), 4e-3)
        << name_of(c);
  }
}

// The amax SwiGLU's kernels compute of what they write, offered to the FP8
// cast that reads it next, gives the bits of the cast's own amax pass: a
// layer feeding SwiGLU and one reading it, forward and both gradients,
// against the same layers with an exact copy (x * 1) on each side of SwiGLU,
// which no kernel offers an amax for.
TEST(OpsGpu, Fp8AmaxOfferedBySwiGluGivesTheSameBits) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  torch::manual_seed(11);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t tokens = 256, in = 512, inter = 384, out = 256;
  const torch::Tensor xs = torch::randn({tokens, in}).to(bf16), w1s = (torch::randn({2 * inter, in}) * 0.05).to(bf16);
  const torch::Tensor w2s = (torch::randn({out, inter}) * 0.05).to(bf16), dy = torch::randn({tokens, out}).to(bf16);
  auto run = [&](bool copies) {
    const torch::Tensor x = xs.clone().requires_grad_(true), w1 = w1s.clone().requires_grad_(true),
                        w2 = w2s.clone().requires_grad_(true);
    torch::Tensor h = ops::linear(x, {w1});
    if (copies) h = h * 1;  // backward: SwiGLU's input gradient copied before the first layer's cast
    torch::Tensor s = ops::swiglu(h);
    if (copies) s = s * 1;
    const torch::Tensor y = ops::linear(s, {w2});
    y.backward(dy);
    return std::vector<torch::Tensor>{y, x.grad(), w1.grad(), w2.grad()};
  };
  const std::vector<torch::Tensor> offered = run(false), own = run(true);
  for (size_t i = 0; i < offered.size(); ++i) EXPECT_TRUE(torch::equal(offered[i], own[i])) << "output " << i;
  // FP8 ran: the product is off the fp64 one by FP8's rounding, not bf16's.
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64); };
  const torch::Tensor h64 = f64(xs).mm(f64(w1s).t());
  const torch::Tensor s64 = torch::silu(h64.narrow(1, 0, inter)) * h64.narrow(1, inter, inter);
  EXPECT_GT(relative_error(offered[0], s64.mm(f64(w2s).t())), 4e-3);
}

#ifdef TRAINER_CUDA_KERNELS
// The offer itself: SwiGLU's output's largest magnitude, exactly, taken
// once; refused for a copy, and for the output once written in place.
TEST(OpsGpu, SwiGluOffersItsOutputsAmaxOnce) {
  REQUIRE_CUDA();
  const Fp8On on;
  torch::manual_seed(12);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  const torch::Tensor h = torch::randn({64, 2 * 96}).to(bf16) * 3;
  const torch::Tensor s = ops::swiglu(h);
  const torch::Tensor amax = ops::take_fp8_amax(s);
  ASSERT_TRUE(amax.defined());
  EXPECT_EQ(amax.item<float>(), s.abs().max().to(torch::kFloat32).item<float>());
  EXPECT_FALSE(ops::take_fp8_amax(s).defined()) << "an offer is taken once";
  const torch::Tensor copied = ops::swiglu(h);
  EXPECT_FALSE(ops::take_fp8_amax(copied.clone()).defined());
  EXPECT_FALSE(ops::take_fp8_amax(copied).defined()) << "a mismatched take withdraws the offer";
  const torch::Tensor changed = ops::swiglu(h);
  changed.mul_(1000);
  EXPECT_FALSE(ops::take_fp8_amax(changed).defined()) << "written in place after the offer";
  torch::Tensor poisoned = h.clone();
  poisoned[5][3] = std::numeric_limits<float>::quiet_NaN();
  const torch::Tensor nan_out = ops::swiglu(poisoned);
  const torch::Tensor nan_amax = ops::take_fp8_amax(nan_out);
  ASSERT_TRUE(nan_amax.defined());
  EXPECT_TRUE(std::isnan(nan_amax.item<float>()));
}
#endif

#if defined(TRAINER_CUDA_KERNELS) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9))
// The FP8 weight gradient's GEMM adds into its fp32 accumulator itself
// (cuBLASLt with beta 1): d = d0 + s_a s_b A B^T, against fp64. Tolerance:
// each product of two FP8 values is exact, but Hopper's FP8 tensor cores
// keep about 14 bits in their partial sums before the fp32 promotion
// (DeepSeek-V3 report, section 3.3.2); 2^-11 of the sum of magnitudes
// allows eight such roundings, while a lost d0 (beta 0), a wrong scale or a
// wrong layout is off by more than 10% of it. Two E5M2 operands, which
// cuBLASLt does not multiply, are refused without a launch.
TEST(OpsGpu, Fp8GemmAddsIntoItsAccumulator) {
  REQUIRE_CUDA();
  torch::manual_seed(10);
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat32);
  const int64_t rows = 384, cols = 512, inner = 256;
  const torch::Tensor a = torch::randn({rows, inner}, f32).to(at::kFloat8_e5m2);
  const torch::Tensor b = (torch::randn({cols, inner}, f32) * 8).to(at::kFloat8_e4m3fn);
  const torch::Tensor a_scale = torch::full({}, 0.5, f32), b_scale = torch::full({}, 0.25, f32);
  const torch::Tensor d0 = torch::randn({rows, cols}, f32) * 100;
  const torch::Tensor d = d0.clone();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  ASSERT_EQ(
      ops::kernels::fp8_gemm_accumulate(a.data_ptr(), true, a_scale.data_ptr<float>(), b.data_ptr(), false,
                                        b_scale.data_ptr<float>(), d.data_ptr<float>(), rows, cols, inner, stream),
      ops::kernels::GemmResult::done);
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat32).to(torch::kCPU, torch::kFloat64); };
  const torch::Tensor expected = f64(d0) + f64(a).mm(f64(b).t()) * 0.125;
  const torch::Tensor bound = (f64(d0).abs() + f64(a).abs().mm(f64(b).abs().t()) * 0.125) * std::pow(2.0, -11);
  EXPECT_TRUE(((f64(d) - expected).abs() <= bound).all().item<bool>())
      << "largest error " << (f64(d) - expected).abs().max().item<double>();
  const torch::Tensor before = d.clone();
  EXPECT_EQ(
      ops::kernels::fp8_gemm_accumulate(a.data_ptr(), true, a_scale.data_ptr<float>(), a.data_ptr(), true,
                                        a_scale.data_ptr<float>(), d.data_ptr<float>(), rows, rows, inner, stream),
      ops::kernels::GemmResult::unsupported);
  EXPECT_TRUE(torch::equal(d, before));
}

// ops::lt_gemm (kernels::bf16_gemm): d = A B + beta d in every layout the
// linear layers and the head use (A or B stored transposed), d bf16 or fp32,
// beta 0 (d never read: NaN there must not show) and 1, against an fp64
// product of the same bf16 values. bf16 products are exact in fp32 and 72
// of them are summed in fp32 (relative 72 x 2^-24 of the sum of
// magnitudes); a bf16 d rounds once more (2^-8 relative, half an ulp being
// 2^-9): the bounds 2^-11 of the magnitudes, plus 2^-8 of the result in bf16.
// A bf16 d with beta 1 is refused (cuBLASLt's result was off by more than
// that bound), with nothing written.
// Shapes off the tiles (200 x 136 x 72). Operands it cannot take are refused
// with nothing written, and so is everything with the switch off.
TEST(OpsGpu, LtGemmGivesTheFp64ProductInEveryLayout) {
  REQUIRE_CUDA();
  torch::manual_seed(11);
  const LtGemms library(true);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t rows = 200, cols = 136, inner = 72;
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kCPU).to(torch::kFloat64); };
  for (const bool a_t : {false, true}) {
    for (const bool b_t : {false, true}) {
      for (const torch::Dtype out : {torch::kBFloat16, torch::kFloat32}) {
        for (const float beta : {0.0f, 1.0f}) {
          const torch::Tensor a = a_t ? torch::randn({inner, rows}, bf16) : torch::randn({rows, inner}, bf16);
          const torch::Tensor b = b_t ? torch::randn({cols, inner}, bf16) : torch::randn({inner, cols}, bf16);
          const torch::Tensor d0 = (torch::randn({rows, cols}, bf16) * 10).to(out);
          torch::Tensor d = d0.clone();
          if (beta == 0.0f) d.fill_(std::numeric_limits<float>::quiet_NaN());
          const std::string what = std::string(a_t ? "A^T" : "A") + (b_t ? " B^T" : " B") +
                                   (out == torch::kFloat32 ? " into fp32" : " into bf16") +
                                   (beta == 0.0f ? ", beta 0" : ", beta 1");
          if (out == torch::kBFloat16 && beta != 0.0f) {
            EXPECT_FALSE(ops::lt_gemm(d, a, a_t, b, b_t, beta)) << what;
            EXPECT_TRUE(torch::equal(d, d0)) << what << ": a refused product wrote";
            continue;
          }
          ASSERT_TRUE(ops::lt_gemm(d, a, a_t, b, b_t, beta)) << what;
          const torch::Tensor A = a_t ? f64(a).t() : f64(a), B = b_t ? f64(b).t() : f64(b);
          const torch::Tensor expected = A.mm(B) + f64(d0) * beta;
          torch::Tensor bound = (A.abs().mm(B.abs()) + f64(d0).abs() * beta) * std::pow(2.0, -11);
          if (out == torch::kBFloat16) bound = bound + expected.abs() * std::pow(2.0, -8);
          const torch::Tensor error = (f64(d) - expected).abs();
          EXPECT_TRUE((error <= bound).all().item<bool>()) << what << ": largest error " << error.max().item<double>();
        }
      }
    }
  }
  const torch::Tensor a = torch::randn({rows, inner}, bf16), b = torch::randn({inner, cols}, bf16);
  const torch::Tensor d = torch::zeros({rows, cols}, bf16.dtype(torch::kFloat32));
  const torch::Tensor strided = torch::randn({inner, rows}, bf16).t();  // A, not contiguous
  EXPECT_FALSE(ops::lt_gemm(d, strided, false, b, false, 0.0f));
  EXPECT_FALSE(ops::lt_gemm(d, a.to(torch::kFloat16), false, b, false, 0.0f));
  EXPECT_FALSE(ops::lt_gemm(d, a, false, torch::randn({inner + 1, cols}, bf16), false, 0.0f));  // shapes disagree
  EXPECT_FALSE(ops::lt_gemm(d.to(torch::kFloat16), a, false, b, false, 0.0f));
  {
    const LtGemms off(false);
    EXPECT_FALSE(ops::lt_gemm(d, a, false, b, false, 0.0f));
  }
  EXPECT_TRUE(torch::equal(d, torch::zeros_like(d))) << "a refused product wrote";
}

// training.gemm_library = "cublaslt-timed": at a shape's first call the
// fastest of the heuristic's first eight algorithms that writes the
// first-ranked one's bits, so every result has the untimed path's bits.
// The shapes of a 0.5B step (the head's input gradient, whose fastest
// candidate on an H100 is a split-K kernel with other bits; a forward; an
// fp32 weight gradient added with beta 1), each timed call twice (the
// choice made, then kept); the input operands are never written.
TEST(OpsGpu, TimedLtGemmKeepsTheFirstAlgorithmsBits) {
  REQUIRE_CUDA();
  torch::manual_seed(12);
  const LtGemms library(true);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  struct Case {
    const char* what;
    int64_t rows, cols, inner;
    bool a_t, b_t;
    torch::Dtype out;
    float beta;
  };
  const Case cases[] = {{"head input gradient", 2048, 896, 151936, false, false, torch::kBFloat16, 0.0f},
                        {"gate/up forward", 8192, 9728, 896, false, true, torch::kBFloat16, 0.0f},
                        {"down weight gradient", 896, 4864, 8192, true, false, torch::kFloat32, 1.0f}};
  const auto bits = [](const torch::Tensor& t) {
    return t.view(t.scalar_type() == torch::kFloat32 ? torch::kInt32 : torch::kInt16);
  };
  for (const Case& c : cases) {
    const torch::Tensor a = c.a_t ? torch::randn({c.inner, c.rows}, bf16) : torch::randn({c.rows, c.inner}, bf16);
    const torch::Tensor b = c.b_t ? torch::randn({c.cols, c.inner}, bf16) : torch::randn({c.inner, c.cols}, bf16);
    const torch::Tensor a0 = a.clone(), b0 = b.clone();
    const torch::Tensor d0 = torch::randn({c.rows, c.cols}, bf16).to(c.out);
    torch::Tensor first = d0.clone();
    ASSERT_TRUE(ops::lt_gemm(first, a, c.a_t, b, c.b_t, c.beta)) << c.what;
    ops::set_lt_gemm_timing(true);
    torch::Tensor timed = d0.clone(), again = d0.clone();
    const bool ran = ops::lt_gemm(timed, a, c.a_t, b, c.b_t, c.beta) && ops::lt_gemm(again, a, c.a_t, b, c.b_t, c.beta);
    ops::set_lt_gemm_timing(false);
    ASSERT_TRUE(ran) << c.what;
    EXPECT_TRUE(torch::equal(bits(timed), bits(first))) << c.what << ": the timed choice wrote other bits";
    EXPECT_TRUE(torch::equal(bits(again), bits(first))) << c.what << ": the kept choice wrote other bits";
    EXPECT_TRUE(torch::equal(bits(a), bits(a0)) && torch::equal(bits(b), bits(b0))) << c.what << ": an operand changed";
  }
}

// SwiGLU's output cast to E4M3 and written transposed by one kernel
// (recomputed in swiglu_linear's FP8 backward) is LibTorch's own cast
// (round to nearest even) of the bf16 output swiglu's kernel writes, scaled
// by a power of two that keeps every value in range: byte for byte. 208
// rows and 320 columns cut the kernel's 64 x 128 tiles at both edges.
// Shapes the kernel does not take are refused with nothing written.
TEST(OpsGpu, SwiGluFp8TransposedCastIsLibTorchsCastOfItsOutput) {
  REQUIRE_CUDA();
  torch::manual_seed(13);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t rows = 208, width = 320;
  const torch::Tensor gate_up = torch::randn({rows, 2 * width}).to(bf16);
  const torch::Tensor inverse_scale = torch::full({}, 0.125, bf16.dtype(torch::kFloat32));
  torch::NoGradGuard no_grad;
  const torch::Tensor h = ops::swiglu(gate_up);
  ASSERT_LT(h.abs().max().item<float>() * 8, 448.0f) << "the scaled values fit E4M3 without saturating";
  const torch::Tensor expected = (h.to(torch::kFloat32) * 8).to(at::kFloat8_e4m3fn).t().contiguous();
  const torch::Tensor out = torch::zeros({width, rows}, bf16.dtype(torch::kUInt8));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  ASSERT_TRUE(ops::kernels::swiglu_fp8_transposed(gate_up.data_ptr(), rows, width, inverse_scale.data_ptr<float>(),
                                                  out.data_ptr(), stream));
  EXPECT_TRUE(torch::equal(out, expected.view(torch::kUInt8)));
  EXPECT_GT(out.count_nonzero().item<int64_t>(), rows * width / 2);
  const torch::Tensor untouched = torch::zeros({width, rows - 4}, bf16.dtype(torch::kUInt8));
  EXPECT_FALSE(ops::kernels::swiglu_fp8_transposed(gate_up.data_ptr(), rows - 4, width, inverse_scale.data_ptr<float>(),
                                                   untouched.data_ptr(), stream));
  EXPECT_EQ(untouched.count_nonzero().item<int64_t>(), 0);
}

// The fused backward of swiglu_linear's FP8 path writes what its two
// kernels write, from one read of gate/up and the output gradient: the
// gate/up gradient and its amax as swiglu_backward's, the forward's output
// cast transposed as swiglu_fp8_transposed's, byte for byte; tiles cut at
// both edges as above. Shapes and addresses the kernel does not take are
// refused with nothing written.
TEST(OpsGpu, SwiGluBackwardFp8TransposedWritesWhatItsTwoKernelsWrite) {
  REQUIRE_CUDA();
  torch::manual_seed(19);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t rows = 208, width = 320;
  const torch::Tensor gate_up = torch::randn({rows, 2 * width}).to(bf16), dh = torch::randn({rows, width}).to(bf16);
  const torch::Tensor inverse_scale = torch::full({}, 0.125, bf16.dtype(torch::kFloat32));
  const auto f32 = bf16.dtype(torch::kFloat32), u8 = bf16.dtype(torch::kUInt8);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const torch::Tensor d_expected = torch::empty_like(gate_up), amax_expected = torch::empty({1}, f32);
  const torch::Tensor t_expected = torch::zeros({width, rows}, u8);
  ops::kernels::swiglu_backward(ops::kernels::Dtype::BFloat16, gate_up.data_ptr(), dh.data_ptr(), d_expected.data_ptr(),
                                rows, width, amax_expected.data_ptr<float>(), stream);
  ASSERT_TRUE(ops::kernels::swiglu_fp8_transposed(gate_up.data_ptr(), rows, width, inverse_scale.data_ptr<float>(),
                                                  t_expected.data_ptr(), stream));
  const torch::Tensor d = torch::zeros_like(gate_up), amax = torch::full({1}, 1e30, f32);
  const torch::Tensor t = torch::zeros({width, rows}, u8);
  ASSERT_TRUE(ops::kernels::swiglu_backward_fp8_transposed(gate_up.data_ptr(), dh.data_ptr(), d.data_ptr(), rows, width,
                                                           inverse_scale.data_ptr<float>(), t.data_ptr(),
                                                           amax.data_ptr<float>(), stream));
  EXPECT_TRUE(torch::equal(d, d_expected));
  EXPECT_TRUE(torch::equal(t, t_expected));
  EXPECT_EQ(amax.item<float>(), amax_expected.item<float>());
  EXPECT_EQ(amax.item<float>(), d.abs().max().to(torch::kFloat32).item<float>()) << "the amax of what it wrote";
  EXPECT_GT(t.count_nonzero().item<int64_t>(), rows * width / 2);
  EXPECT_GT(d.count_nonzero().item<int64_t>(), rows * width);
  // Without an amax: the same bytes.
  const torch::Tensor d2 = torch::zeros_like(gate_up), t2 = torch::zeros({width, rows}, u8);
  ASSERT_TRUE(ops::kernels::swiglu_backward_fp8_transposed(gate_up.data_ptr(), dh.data_ptr(), d2.data_ptr(), rows,
                                                           width, inverse_scale.data_ptr<float>(), t2.data_ptr(),
                                                           nullptr, stream));
  EXPECT_TRUE(torch::equal(d2, d_expected));
  EXPECT_TRUE(torch::equal(t2, t_expected));
  // Refused: rows not a multiple of 8; an output gradient off 16-byte alignment.
  const torch::Tensor d3 = torch::zeros_like(gate_up), t3 = torch::zeros({width, rows}, u8);
  EXPECT_FALSE(ops::kernels::swiglu_backward_fp8_transposed(gate_up.data_ptr(), dh.data_ptr(), d3.data_ptr(), rows - 4,
                                                            width, inverse_scale.data_ptr<float>(), t3.data_ptr(),
                                                            nullptr, stream));
  const torch::Tensor dh_storage = torch::randn({rows * width + 1}).to(bf16);
  EXPECT_FALSE(ops::kernels::swiglu_backward_fp8_transposed(
      gate_up.data_ptr(), dh_storage.narrow(0, 1, rows * width).data_ptr(), d3.data_ptr(), rows, width,
      inverse_scale.data_ptr<float>(), t3.data_ptr(), nullptr, stream));
  EXPECT_EQ(d3.count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ(t3.count_nonzero().item<int64_t>(), 0);
}

// The norm's output cast to E4M3 and written transposed by one kernel
// (from the input and each row's reciprocal RMS, in norm_linear's FP8
// backward) is LibTorch's own cast of the bf16 output rms_norm's kernel
// writes, byte for byte; tiles cut at both edges as above. Shapes the
// kernel does not take are refused with nothing written. The forward
// offers its output's amax, exactly.
TEST(OpsGpu, RmsNormFp8TransposedCastIsLibTorchsCastOfItsOutput) {
  REQUIRE_CUDA();
  const Fp8On on;
  torch::manual_seed(17);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t rows = 208, width = 320;
  const torch::Tensor x = torch::randn({rows, width}).to(bf16), w = (torch::randn({width}) * 0.5 + 1).to(bf16);
  const torch::Tensor inverse_scale = torch::full({}, 0.125, bf16.dtype(torch::kFloat32));
  torch::NoGradGuard no_grad;
  const ops::RmsNormForward f = ops::rms_norm_forward(x, w, 1e-6);
  const torch::Tensor amax = ops::take_fp8_amax(f.y);
  ASSERT_TRUE(amax.defined()) << "the forward offers its output's amax";
  EXPECT_EQ(amax.item<float>(), f.y.abs().max().to(torch::kFloat32).item<float>());
  EXPECT_TRUE(torch::equal(f.y, ops::rms_norm(x, w, 1e-6)));
  ASSERT_LT(f.y.abs().max().item<float>() * 8, 448.0f) << "the scaled values fit E4M3 without saturating";
  const torch::Tensor expected = (f.y.to(torch::kFloat32) * 8).to(at::kFloat8_e4m3fn).t().contiguous();
  const torch::Tensor out = ops::rms_norm_fp8_transposed(x, w, f.rstd, inverse_scale);
  ASSERT_TRUE(out.defined());
  EXPECT_TRUE(torch::equal(out.view(torch::kUInt8), expected.view(torch::kUInt8)));
  EXPECT_GT(out.view(torch::kUInt8).count_nonzero().item<int64_t>(), rows * width / 2);
  const torch::Tensor untouched = torch::zeros({width, rows - 4}, bf16.dtype(torch::kUInt8));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  EXPECT_FALSE(ops::kernels::rms_norm_fp8_transposed(x.data_ptr(), w.data_ptr(), f.rstd.data_ptr<float>(), rows - 4,
                                                     width, inverse_scale.data_ptr<float>(), untouched.data_ptr(),
                                                     stream));
  EXPECT_EQ(untouched.count_nonzero().item<int64_t>(), 0);
}

// Without an input gradient, the FP8 backward casts dY only transposed
// (for the weight gradient): the same scale and bytes, so the weight
// gradient is bit for bit the one computed beside an input gradient.
TEST(OpsGpu, Fp8WeightGradientIsTheSameWithoutAnInputGradient) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  torch::manual_seed(15);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const torch::Tensor xs = torch::randn({208, 256}).to(bf16), ws = (torch::randn({320, 256}) * 0.05).to(bf16);
  const torch::Tensor dy = torch::randn({208, 320}).to(bf16);
  torch::Tensor dw[2];
  for (const bool input_gradient : {false, true}) {
    const torch::Tensor x = xs.clone().requires_grad_(input_gradient), w = ws.clone().requires_grad_(true);
    ops::linear(x, {w}).backward(dy);
    EXPECT_EQ(x.grad().defined(), input_gradient);
    dw[input_gradient] = w.grad();
  }
  EXPECT_TRUE(torch::equal(dw[0], dw[1]));
  const torch::Tensor expected = dy.to(torch::kFloat64).t().mm(xs.to(torch::kFloat64));
  EXPECT_GT(relative_error(dw[0], expected), 4e-3) << "no FP8 rounding in the weight gradient";
}

// An FP8 forward keeps its weights' transposed cast for backward
// (fp8_keeps_transposed_weights) instead of casting them again there: the
// same bytes, so the same outputs and gradients bit for bit, for linear
// over stacked weights and for swiglu_linear; and the cast is held from
// forward to backward (a byte a weight element), not made and dropped.
TEST(OpsGpu, Fp8KeptTransposedWeightsGiveTheSameBits) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  torch::manual_seed(21);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t tokens = 208, in = 256, out = 320;
  const torch::Tensor xs = torch::randn({tokens, in}).to(bf16), gs = torch::randn({tokens, 2 * in}).to(bf16);
  const torch::Tensor w1s = (torch::randn({out / 2, in}) * 0.05).to(bf16),
                      w2s = (torch::randn({out / 2, in}) * 0.05).to(bf16);
  const torch::Tensor dy = torch::randn({tokens, out}).to(bf16);
  const auto allocated = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device()).allocated_bytes[0].current;
  };
  struct Result {
    std::vector<torch::Tensor> bits;
    int64_t held = 0;  // bytes allocated by the forward and live until backward, beyond its output
  };
  const auto run = [&](bool keep, bool swiglu) {
    ops::set_fp8_keeps_transposed_weights(keep);
    const torch::Tensor x = (swiglu ? gs : xs).clone().requires_grad_(true);
    const torch::Tensor w1 = w1s.clone().requires_grad_(true), w2 = w2s.clone().requires_grad_(true);
    torch::cuda::synchronize();
    const int64_t before = allocated();
    const torch::Tensor y = swiglu ? ops::swiglu_linear(x, {w1, w2}) : ops::linear(x, {w1, w2});
    torch::cuda::synchronize();
    Result r;
    r.held = allocated() - before - static_cast<int64_t>(y.nbytes());
    y.backward(dy);
    r.bits = {y, x.grad(), w1.grad(), w2.grad()};
    return r;
  };
  for (const bool swiglu : {false, true}) {
    // The one-time allocations (cuBLASLt's workspace) before measuring.
    run(false, swiglu);
    run(true, swiglu);
    const Result recast = run(false, swiglu), kept = run(true, swiglu);
    for (size_t i = 0; i < kept.bits.size(); ++i) {
      EXPECT_TRUE(torch::equal(kept.bits[i], recast.bits[i])) << "tensor " << i << (swiglu ? ", swiglu_linear" : "");
    }
    // The stacked weights' cast, 1 byte an element (the allocator rounds to 512 bytes).
    EXPECT_GE(kept.held - recast.held, out * in) << (swiglu ? "swiglu_linear" : "linear");
    EXPECT_LE(kept.held - recast.held, out * in + 1024) << (swiglu ? "swiglu_linear" : "linear");
  }
  ops::set_fp8_keeps_transposed_weights(true);
}

// Within an Fp8WeightReuse scope (the training loop's: a step's
// micro-steps), each forward after the first over the same weights casts
// them from the first's kept entry: the same outputs and gradients bit for
// bit as casting afresh each time, for linear over weights lying back to
// back in one storage and for swiglu_linear, one reuse a later forward.
// None where the stacked weights are a concatenated copy (two storages),
// none outside a scope; and weights written inside the scope (their version
// counter) are cast again, with the new values' bits: a stale entry would
// give the old weights' product. The same with Keep::both (the cast as laid
// out kept too, training.fp8_weight_casts = "both"); what a scope holds
// until it closes is one transposed cast of the stacked weights (a byte an
// element), and with Keep::both the cast as laid out beside it.
TEST(OpsGpu, Fp8WeightCastsReusedWithinAStepGiveTheSameBits) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  const Fp8On on;
  ops::set_fp8_keeps_transposed_weights(true);
  torch::manual_seed(22);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t tokens = 208, in = 256, out = 320, micro_steps = 3;  // tiles cut at the edges
  const torch::Tensor flat = (torch::randn({out, in}) * 0.05).to(bf16);
  std::vector<torch::Tensor> xs, gs, dys;
  for (int64_t m = 0; m < micro_steps; ++m) {
    xs.push_back(torch::randn({tokens, in}).to(bf16));
    gs.push_back(torch::randn({tokens, 2 * in}).to(bf16));
    dys.push_back(torch::randn({tokens, out}).to(bf16));
  }
  const auto allocated = [] {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device()).allocated_bytes[0].current;
  };
  using Keep = ops::Fp8WeightReuse::Keep;
  struct Result {
    std::vector<torch::Tensor> bits;
    int64_t reused = 0;
    int64_t kept_bytes = 0;  // device memory the scope released when it closed
  };
  // `write`: the weights scaled in place after the first micro-step.
  const auto run = [&](bool scoped, bool swiglu, bool separate, bool write, Keep keep) {
    const torch::Tensor storage = flat.clone();
    torch::Tensor w1 = storage.narrow(0, 0, out / 2), w2 = storage.narrow(0, out / 2, out / 2);
    w1 = (separate ? w1.clone() : w1.detach()).requires_grad_(true);
    w2 = (separate ? w2.clone() : w2.detach()).requires_grad_(true);
    std::optional<ops::Fp8WeightReuse> scope;
    if (scoped) scope.emplace(keep);
    const int64_t before = ops::Fp8WeightReuse::reused();
    Result r;
    for (int64_t m = 0; m < micro_steps; ++m) {
      const torch::Tensor x = (swiglu ? gs[m] : xs[m]).clone().requires_grad_(true);
      const torch::Tensor y = swiglu ? ops::swiglu_linear(x, {w1, w2}) : ops::linear(x, {w1, w2});
      y.backward(dys[m]);
      r.bits.insert(r.bits.end(), {y, x.grad()});
      if (write && m == 0) {
        const torch::NoGradGuard no_grad;
        w1.mul_(1.5);
        w2.mul_(1.5);
      }
    }
    r.bits.insert(r.bits.end(), {w1.grad(), w2.grad()});
    r.reused = ops::Fp8WeightReuse::reused() - before;
    torch::cuda::synchronize();
    const int64_t held = allocated();
    scope.reset();
    torch::cuda::synchronize();
    r.kept_bytes = held - allocated();
    return r;
  };
  for (const Keep keep : {Keep::transposed, Keep::both}) {
    const int64_t layouts = keep == Keep::both ? 2 : 1;
    for (const bool swiglu : {false, true}) {
      for (const bool write : {false, true}) {
        const std::string what = std::string(swiglu ? "swiglu_linear" : "linear") + (write ? ", weights written" : "") +
                                 (keep == Keep::both ? ", both kept" : "");
        const Result fresh = run(false, swiglu, false, write, keep), reused = run(true, swiglu, false, write, keep),
                     copied = run(true, swiglu, true, write, keep);
        EXPECT_EQ(fresh.reused, 0) << what;
        EXPECT_EQ(reused.reused, write ? micro_steps - 2 : micro_steps - 1) << what;
        EXPECT_EQ(copied.reused, 0) << what << ", weights in two storages";
        // The kept casts (a byte a weight element each), their amax and
        // scale (the allocator rounds each to 512 bytes); nothing kept for copies.
        EXPECT_GE(reused.kept_bytes, layouts * out * in) << what;
        EXPECT_LE(reused.kept_bytes, layouts * out * in + 2048) << what;
        EXPECT_EQ(copied.kept_bytes, 0) << what << ", weights in two storages";
        ASSERT_EQ(reused.bits.size(), fresh.bits.size());
        for (size_t i = 0; i < fresh.bits.size(); ++i) {
          EXPECT_TRUE(torch::equal(reused.bits[i], fresh.bits[i])) << what << ", tensor " << i;
          EXPECT_TRUE(torch::equal(copied.bits[i], fresh.bits[i])) << what << ", tensor " << i << " (two storages)";
        }
      }
    }
  }
  {
    const ops::Fp8WeightReuse scope;
    EXPECT_THROW(ops::Fp8WeightReuse{}, c10::Error) << "scopes do not nest";
  }
}

// swiglu_linear is linear_of(swiglu, ...) bit for bit: in FP8 (where its
// backward casts SwiGLU's output from gate_up directly), with the weight
// gradient returned or added into a bound fp32 buffer, and in bf16.
TEST(OpsGpu, SwiGluLinearGivesTheBitsOfLinearOf) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  torch::manual_seed(14);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t tokens = 208, inter = 320, out = 256;  // tiles cut at the edges, as above
  const torch::Tensor gs = torch::randn({2, tokens / 2, 2 * inter}).to(bf16),
                      ws = (torch::randn({out, inter}) * 0.05).to(bf16);
  const torch::Tensor dy = torch::randn({2, tokens / 2, out}).to(bf16);
  const ops::InputFunction swiglu = [](const torch::Tensor& s, const std::vector<torch::Tensor>&) {
    return ops::swiglu(s);
  };
  auto run = [&](bool fused, bool bound) {
    const torch::Tensor g = gs.clone().requires_grad_(true), w = ws.clone().requires_grad_(true);
    if (bound) w.mutable_grad() = torch::zeros({out, inter}, bf16.dtype(torch::kFloat32));
    const torch::Tensor y = fused ? ops::swiglu_linear(g, {w}) : ops::linear_of(swiglu, g, {}, {w});
    y.backward(dy);
    return std::vector<torch::Tensor>{y, g.grad(), w.grad()};
  };
  const char* names[] = {"output", "gate/up gradient", "weight gradient"};
  for (const Compute c : {Compute::tensorwise, Compute::rowwise, Compute::bf16}) {
    set_compute(c);
    for (const bool bound : {false, true}) {
      const std::vector<torch::Tensor> general = run(false, bound), fused = run(true, bound);
      for (size_t i = 0; i < general.size(); ++i) {
        EXPECT_TRUE(torch::equal(general[i], fused[i]))
            << names[i] << ", " << name_of(c) << (bound ? ", bound buffer" : "");
      }
      if (c == Compute::tensorwise && !bound) {
        const torch::Tensor h = ops::swiglu(gs).to(torch::kFloat64);
        const torch::Tensor dw = dy.to(torch::kFloat64).reshape({tokens, out}).t().mm(h.reshape({tokens, inter}));
        EXPECT_GT(relative_error(fused[2], dw), 4e-3) << "no FP8 rounding in the weight gradient";
      }
      if (c == Compute::rowwise && !bound) {
        const torch::Tensor y = ops::swiglu(gs).to(torch::kFloat64).matmul(ws.to(torch::kFloat64).t());
        EXPECT_GT(relative_error(fused[0], y), 4e-3) << "no FP8 rounding in the output";
      }
    }
  }
  set_compute(Compute::bf16);
}

// norm_linear is linear_of(rms_norm, ...) bit for bit: in FP8 (where its
// backward casts the norm's output from x directly) and in bf16 (where it
// recomputes the output with the forward's kernel), with the gradients
// returned or added into bound fp32 buffers. There the norm's weight
// gradient goes into its buffer in fp32 (linear_of's general path hands
// autograd a bf16 one): rounded to bf16, the same bits.
TEST(OpsGpu, NormLinearGivesTheBitsOfLinearOf) {
  REQUIRE_CUDA();
  ASSERT_TRUE(ops::fp8_linear_available());
  torch::manual_seed(18);
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const int64_t tokens = 208, in = 320, out = 256;
  const double eps = 1e-6;
  const torch::Tensor xs = torch::randn({2, tokens / 2, in}).to(bf16), ns = (torch::randn({in}) * 0.2 + 1).to(bf16),
                      ws = (torch::randn({out, in}) * 0.05).to(bf16);
  const torch::Tensor dy = torch::randn({2, tokens / 2, out}).to(bf16);
  const ops::InputFunction norm = [eps](const torch::Tensor& s, const std::vector<torch::Tensor>& p) {
    return ops::rms_norm(s, p[0], eps);
  };
  auto run = [&](bool fused, bool bound) {
    const torch::Tensor x = xs.clone().requires_grad_(true), n = ns.clone().requires_grad_(true),
                        w = ws.clone().requires_grad_(true);
    if (bound) {
      w.mutable_grad() = torch::zeros({out, in}, bf16.dtype(torch::kFloat32));
      n.mutable_grad() = torch::zeros({in}, bf16.dtype(torch::kFloat32));
    }
    const torch::Tensor y = fused ? ops::norm_linear(x, n, eps, {w}) : ops::linear_of(norm, x, {n}, {w});
    y.backward(dy);
    return std::vector<torch::Tensor>{y, x.grad(), w.grad(), n.grad()};
  };
  const char* names[] = {"output", "input gradient", "weight gradient", "norm weight gradient"};
  for (const Compute c : {Compute::tensorwise, Compute::rowwise, Compute::bf16}) {
    set_compute(c);
    for (const bool bound : {false, true}) {
      const std::vector<torch::Tensor> general = run(false, bound), fused = run(true, bound);
      for (size_t i = 0; i < general.size(); ++i) {
        const torch::Tensor f = bound && i == 3 ? fused[i].to(torch::kBFloat16).to(torch::kFloat32) : fused[i];
        EXPECT_TRUE(torch::equal(general[i], f)) << names[i] << ", " << name_of(c) << (bound ? ", bound buffer" : "");
      }
      if (c == Compute::tensorwise && !bound) {
        const torch::Tensor h = ops::rms_norm(xs, ns, eps).to(torch::kFloat64).reshape({tokens, in});
        const torch::Tensor dw = dy.to(torch::kFloat64).reshape({tokens, out}).t().mm(h);
        EXPECT_GT(relative_error(fused[2], dw), 4e-3) << "no FP8 rounding in the weight gradient";
      }
      if (c == Compute::rowwise && !bound) {
        const torch::Tensor y = ops::rms_norm(xs, ns, eps).to(torch::kFloat64).matmul(ws.to(torch::kFloat64).t());
        EXPECT_GT(relative_error(fused[0], y), 4e-3) << "no FP8 rounding in the output";
      }
    }
  }
  set_compute(Compute::bf16);
}
#endif

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

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
// Given the target count, the head selects the target rows without a host
// sync (nonzero_static), so a CUDA graph can hold it (training.cuda_graphs),
// and computes the same bits as when it counts them itself. LibTorch's sync
// check (set to error) shows both: counting syncs, the given count does
// not, in forward and backward, with deterministic algorithms (reproducible
// mode's) and without.
TEST(OpsGpu, LinearCrossEntropyGivenItsTargetCountNeverSyncs) {
  REQUIRE_CUDA();
  torch::manual_seed(6);
  torch::Tensor labels = torch::randint(0, 3000, {257}, torch::kInt64);
  labels.index_put_({torch::arange(0, 257, 5)}, kIgnoreIndex);
  const int64_t count = labels.ne(kIgnoreIndex).sum().item<int64_t>();
  const torch::Tensor hidden = torch::randn({257, 64}).to(kCuda, torch::kBFloat16);
  const torch::Tensor weight = (torch::randn({3000, 64}) * 0.2).to(kCuda, torch::kBFloat16);
  const torch::Tensor on_device = labels.to(kCuda);
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  for (const bool exact : {false, true}) {
    at::globalContext().setDeterministicAlgorithms(exact, false);
    std::vector<std::vector<torch::Tensor>> results;
    for (const int64_t given : {int64_t(-1), count}) {
      const torch::Tensor h = hidden.detach().set_requires_grad(true);
      const torch::Tensor w = weight.detach().set_requires_grad(true);
      torch::cuda::synchronize();
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
      bool synced = false;
      try {
        const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, on_device, /*chunk_rows=*/64, given);
        (loss * 0.5).backward();
        results.push_back({loss.detach(), h.grad(), w.grad()});
      } catch (const c10::Error&) {
        synced = true;
      }
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
      EXPECT_EQ(synced, given < 0) << "given count " << given << ", deterministic " << exact;
      if (synced) {
        const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, on_device, /*chunk_rows=*/64, given);
        (loss * 0.5).backward();
        results.push_back({loss.detach(), h.grad(), w.grad()});
      }
    }
    ASSERT_EQ(results.size(), 2u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(torch::equal(results[0][i], results[1][i])) << i << ", deterministic " << exact;
    }
  }
  at::globalContext().setDeterministicAlgorithms(deterministic, false);
}
#endif

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
    // A bf16 weight whose .grad a strategy bound to an fp32 buffer: the head
    // adds its gradient there in fp32, once (micro-steps accumulate).
    {
      const torch::Tensor h = hidden.to(kCuda, torch::kBFloat16);
      const torch::Tensor w = weight.to(kCuda, torch::kBFloat16).detach().set_requires_grad(true);
      const torch::Tensor buffer = torch::zeros({vocab, 64}, h.options().dtype(torch::kFloat32));
      w.mutable_grad() = buffer;
      // The head's fp32 weight gradient is written by its first chunk's GEMM,
      // never zeroed: a freed block of NaN of its size, which the caching
      // allocator hands out again, must not reach it.
      torch::full({vocab, 64}, std::numeric_limits<float>::quiet_NaN(), h.options().dtype(torch::kFloat32));
      for (int micro = 0; micro < 2; ++micro) {
        (ops::linear_cross_entropy_sum(h, w, labels.to(kCuda), /*chunk_rows=*/64) * 0.5).backward();
      }
      EXPECT_EQ(w.grad().data_ptr(), buffer.data_ptr());
      EXPECT_LT(relative_error(buffer, 2 * reference[2]), tolerance(torch::kBFloat16))
          << "bound fp32 .grad, vocab " << vocab;
    }
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      const std::vector<torch::Tensor> gpu = run(kCuda, dtype);
      // bf16 inputs round the GEMM operands (2^-9 relative) before fp32 accumulation: 2e-2, as above.
      const char* names[] = {"loss", "hidden gradient", "weight gradient"};
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_LT(relative_error(gpu[i], reference[i]), tolerance(dtype))
            << names[i] << " " << dtype << " vocab " << vocab;
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

// ops::embedding on CUDA: the forward is torch::embedding's; the weight
// gradient goes into a bound fp32 buffer, summed in fp32 (no bf16 dense
// gradient in between: bf16 would be off by ~2^-9), the same bits every
// time (a stable order for repeated tokens); unbound, or with gradient
// fusion off (reproducible mode), torch::embedding's own backward.
TEST(OpsGpu, EmbeddingAddsItsGradientIntoABoundFp32Buffer) {
  REQUIRE_CUDA();
  torch::manual_seed(9);
  const int64_t vocab = 1000, dim = 64;
  const auto bf16 = torch::TensorOptions().device(kCuda).dtype(torch::kBFloat16);
  const torch::Tensor weight = (torch::randn({vocab, dim}) * 0.1).to(bf16);
  const torch::Tensor ids = torch::randint(0, 50, {3, 200}, torch::kInt64).to(kCuda);  // ~12 repeats a token
  const torch::Tensor start = torch::randn({vocab, dim}, bf16.dtype(torch::kFloat32));
  std::vector<torch::Tensor> dys;
  for (int micro = 0; micro < 2; ++micro) dys.push_back(torch::randn({3, 200, dim}).to(bf16));
  // Two micro-steps into a buffer holding `start`; the buffer afterwards.
  const auto run = [&](bool fusion) {
    ops::set_gradient_fusion(fusion);
    const torch::Tensor w = weight.detach().requires_grad_(true);
    const torch::Tensor buffer = start.clone();
    w.mutable_grad() = buffer;
    for (const torch::Tensor& dy : dys) {
      const torch::Tensor out = ops::embedding(w, ids);
      EXPECT_TRUE(torch::equal(out, torch::embedding(weight, ids)));
      out.backward(dy);
    }
    ops::set_gradient_fusion(true);
    EXPECT_EQ(w.grad().data_ptr(), buffer.data_ptr()) << "the bound buffer was replaced";
    return buffer;
  };
  torch::Tensor expected = start.to(torch::kCPU, torch::kFloat64);
  for (const torch::Tensor& dy : dys) {
    expected.index_add_(0, ids.reshape({-1}).cpu(), dy.reshape({-1, dim}).to(torch::kCPU, torch::kFloat64));
  }
  const torch::Tensor fused = run(true);
  // fp32 sums of at most ~40 terms a row, each addition rounding at 2^-24: under 1e-5.
  EXPECT_LT(relative_error(fused, expected), 1e-5);
  EXPECT_TRUE(torch::equal(fused, run(true))) << "repeated tokens summed in another order";
  // Gradient fusion off: autograd adds torch::embedding's bf16 gradient, micro-step by micro-step.
  torch::Tensor unfused = start.clone();
  for (const torch::Tensor& dy : dys) {
    const torch::Tensor w = weight.detach().requires_grad_(true);
    torch::embedding(w, ids).backward(dy);
    unfused += w.grad().to(torch::kFloat32);
  }
  EXPECT_TRUE(torch::equal(run(false), unfused));
  // Unbound: torch::embedding's gradient, bit for bit.
  const torch::Tensor a = weight.detach().requires_grad_(true), b = weight.detach().requires_grad_(true);
  ops::embedding(a, ids).backward(dys[0]);
  torch::embedding(b, ids).backward(dys[0]);
  ASSERT_TRUE(a.grad().defined());
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
}

// The CUDA update (the project's kernel) against the CPU loop, bit for bit:
// on a buffer whose length is not a multiple of 4 (vector and scalar
// paths), on a slice one element off alignment (scalar path only), and with
// the bf16 compute copy written in the same pass, which must equal the
// updated fp32 parameters rounded to bf16.
TEST(OpsGpu, FusedAdamWMatchesTheCpuUpdate) {
  REQUIRE_CUDA();
  torch::manual_seed(4);
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  for (const int64_t offset : {0, 1}) {
    const int64_t n = 100003;
    const torch::Tensor initial = torch::randn({n + offset});
    torch::Tensor cpu = initial.clone(), gpu_buffer = initial.to(kCuda);
    torch::Tensor gpu = gpu_buffer.narrow(0, offset, n);
    torch::Tensor cpu_view = cpu.narrow(0, offset, n);
    AdamWState cpu_state = adamw_init(cpu_view), gpu_state = adamw_init(gpu);
    const torch::Tensor compute = torch::zeros({n}, gpu.options().dtype(torch::kBFloat16));
    for (int64_t step = 1; step <= 3; ++step) {
      const torch::Tensor grads = torch::randn({n});
      adamw_update(cpu_view, grads.clone(), cpu_state, config, /*decay=*/true, 1e-3 * step, step, /*grad_scale=*/0.5);
      adamw_update(gpu, grads.to(kCuda), gpu_state, config, /*decay=*/true, 1e-3 * step, step, 0.5, compute);
    }
    // The same operations in the same order, none contracted into an FMA on
    // either side (the kernel's _rn intrinsics, the CPU loop's
    // -ffp-contract=off), IEEE division and square root on both: the same
    // bits, on the vector path (offset 0) and the scalar one (offset 1).
    EXPECT_TRUE(torch::equal(gpu.cpu(), cpu_view))
        << "offset " << offset << ": relative difference " << relative_error(gpu, cpu_view);
    EXPECT_TRUE(torch::equal(gpu_state.exp_avg.cpu(), cpu_state.exp_avg)) << "offset " << offset;
    EXPECT_TRUE(torch::equal(gpu_state.exp_avg_sq.cpu(), cpu_state.exp_avg_sq)) << "offset " << offset;
    EXPECT_TRUE(torch::equal(compute, gpu.to(torch::kBFloat16))) << "offset " << offset;
  }
}

// bf16 state's stochastic rounding: the CUDA kernel against the CPU path's
// int64 tensor arithmetic, bit for bit, on values of every kind (normal,
// subnormal, near the largest float, zero, infinities, NaN) and at element
// indices past 2^31 (the hash's high half). Then one AdamW step of each
// device on bf16 state through with_wide_state: the same state bits.
TEST(OpsGpu, StochasticRoundingKernelGivesTheCpuBits) {
  REQUIRE_CUDA();
  torch::manual_seed(9);
  const int64_t n = 200001;
  torch::Tensor values = torch::randn({n}) * torch::pow(2.0, 40.0 * torch::rand({n}) - 20.0);
  values.narrow(0, 0, 1000).mul_(1e-39);  // subnormals
  values.narrow(0, 1000, 1000).mul_(0).add_(3.4e38).mul_(torch::rand({1000}).add(0.99));
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials); ++i) values[static_cast<int64_t>(2000 + i)] = specials[i];
  for (const int64_t first : {int64_t(0), int64_t(5) << 31}) {
    for (const uint64_t stream : {state_stream(1, 0, 0), state_stream(77, 1, 3)}) {
      torch::Tensor cpu = torch::empty({n}, torch::kBFloat16),
                    gpu = torch::empty({n}, values.options().dtype(torch::kBFloat16).device(kCuda));
      stochastic_round(cpu, values, stream, first);
      stochastic_round(gpu, values.to(kCuda), stream, first);
      // NaN stays NaN; which NaN pattern is each conversion's own (LibTorch's
      // vectorised CPU conversion writes 0xffff, its scalar one 0x7fc0).
      const torch::Tensor nan = values.isnan();
      EXPECT_TRUE(torch::equal(cpu.isnan(), nan));
      EXPECT_TRUE(torch::equal(gpu.cpu().isnan(), nan));
      const torch::Tensor want = cpu.view(torch::kInt16).masked_fill(nan, 0),
                          got = gpu.cpu().view(torch::kInt16).masked_fill(nan, 0);
      EXPECT_TRUE(torch::equal(want, got))
          << "first " << first << ": " << want.ne(got).sum().item<int64_t>() << " of " << n << " differ";
      // The rounding is up or down to a neighbour: never further than one bf16 step.
      const torch::Tensor finite = values.abs().lt(3.3e38);
      const torch::Tensor gap = (gpu.cpu().to(torch::kFloat64) - values.to(torch::kFloat64)).abs();
      EXPECT_TRUE(gap.le(values.to(torch::kFloat64).abs() * std::ldexp(1.0, -7) + 1e-40)
                      .logical_or(finite.logical_not())
                      .all()
                      .item<bool>());
    }
  }
  // A bf16-state AdamW step (the state written back through the kernel).
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  std::vector<torch::Tensor> states;
  for (const torch::Device device : {torch::Device(torch::kCPU), kCuda}) {
    torch::manual_seed(3);
    UpdateSlice slice;
    slice.group = 1;
    slice.offset = 12345;
    slice.values = torch::randn({n}).to(device);
    slice.gradient = torch::randn({n}).to(device);
    slice.state = {torch::zeros({n}, slice.values.options().dtype(torch::kBFloat16)),
                   torch::zeros({n}, slice.values.options().dtype(torch::kBFloat16))};
    for (int64_t step = 1; step <= 2; ++step) {
      with_wide_state(slice, step, [&](UpdateSlice& s, int64_t, int64_t) {
        AdamWState state{s.state.at(0), s.state.at(1)};
        adamw_update(s.values, s.gradient, state, config, true, 1e-3, step, 1.0, s.compute);
      });
    }
    states.push_back(torch::cat(
        {slice.values.cpu(), slice.state[0].cpu().to(torch::kFloat32), slice.state[1].cpu().to(torch::kFloat32)}));
  }
  EXPECT_TRUE(torch::equal(states[0], states[1])) << "relative difference " << relative_error(states[1], states[0]);
}

// bf16 state's one-pass update (adamw_update_bf16_state) against the
// widened path it replaces (with_wide_state: fp32 copies, adamw_update's
// kernel, stochastic_round; itself held to the CPU's bits above): the same
// bits of parameters, both moments and the compute copy, over three steps,
// on more elements than one of with_wide_state's CUDA chunks (2^24), on the
// vector path (aligned buffers) and the scalar one (one element off), with
// and without a compute copy. The CPU is left to with_wide_state (false).
TEST(OpsGpu, Bf16StateAdamWGivesTheBitsOfTheWidenedPath) {
  REQUIRE_CUDA();
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  const int64_t n = (int64_t(1) << 24) + 1003;
  for (const int64_t offset : {0, 1}) {
    for (const bool with_compute : {true, false}) {
      torch::manual_seed(21);
      const auto fp32 = torch::TensorOptions().device(kCuda);
      const torch::Tensor values = torch::randn({n + offset}, fp32);
      const torch::Tensor exp_avg = (torch::randn({n + offset}, fp32) * 1e-3).to(torch::kBFloat16);
      const torch::Tensor exp_avg_sq = (torch::randn({n + offset}, fp32) * 1e-3).square().to(torch::kBFloat16);
      // slices[0]: the widened path; slices[1]: the one-pass kernel.
      std::vector<UpdateSlice> slices(2);
      for (UpdateSlice& slice : slices) {
        slice.group = 2;
        slice.offset = 777 + offset;
        slice.decay = true;
        slice.values = values.clone().narrow(0, offset, n);
        slice.state = {exp_avg.clone().narrow(0, offset, n), exp_avg_sq.clone().narrow(0, offset, n)};
        if (with_compute) slice.compute = torch::empty({n + offset}, fp32.dtype(torch::kBFloat16)).narrow(0, offset, n);
      }
      for (int64_t step = 1; step <= 3; ++step) {
        const torch::Tensor grads = torch::randn({n + offset}, fp32).narrow(0, offset, n);
        slices[0].gradient = grads;
        with_wide_state(slices[0], step, [&](UpdateSlice& part, int64_t, int64_t) {
          AdamWState state{part.state.at(0), part.state.at(1)};
          adamw_update(part.values, part.gradient, state, config, true, 1e-3 * step, step, 0.5, part.compute);
        });
        UpdateSlice& fused = slices[1];
        AdamWState state{fused.state.at(0), fused.state.at(1)};
        ASSERT_TRUE(adamw_update_bf16_state(fused.values, grads, state, config, true, 1e-3 * step, step, 0.5,
                                            fused.compute, state_stream(step, 0, fused.group),
                                            state_stream(step, 1, fused.group), fused.offset));
      }
      const std::string at = "offset " + std::to_string(offset) + (with_compute ? ", compute copy" : "");
      EXPECT_TRUE(torch::equal(slices[1].values, slices[0].values)) << at;
      EXPECT_TRUE(torch::equal(slices[1].state[0], slices[0].state[0])) << at;
      EXPECT_TRUE(torch::equal(slices[1].state[1], slices[0].state[1])) << at;
      if (with_compute) {
        EXPECT_TRUE(torch::equal(slices[1].compute, slices[0].compute)) << at;
      }
      EXPECT_FALSE(torch::equal(slices[1].values, values.narrow(0, offset, n))) << "nothing was updated";
    }
  }
  // Not CUDA: nothing done, false.
  torch::Tensor p = torch::zeros({8}), g = torch::ones({8});
  AdamWState cpu{torch::zeros({8}, torch::kBFloat16), torch::zeros({8}, torch::kBFloat16)};
  EXPECT_FALSE(adamw_update_bf16_state(p, g, cpu, config, true, 1e-3, 1, 1.0, torch::Tensor(), 1, 2, 0));
  EXPECT_TRUE(torch::equal(p, torch::zeros({8})));
}

// Reproducible mode's fused fixed-point kernel (ops/FixedPoint.cu) against
// the CPU path's LibTorch sequence: the same integers, so the same sum, the
// same largest magnitude and the same scales, for fp32 and bf16 gradients.
class Pushed : public Model {
 public:
  Pushed(torch::Device device, torch::Dtype dtype)
      : w_(torch::zeros({300, 7}, torch::TensorOptions().device(device).dtype(dtype)).requires_grad_()) {}
  std::vector<NamedParameter> parameters() override { return {{"w", w_, true}}; }
  LossSum forward(const Batch&) override { return {}; }
  int64_t vocab_size() const override { return 1; }
  void push(const torch::Tensor& c) { (w_ * c.to(w_.device(), w_.scalar_type())).sum().backward(); }

 private:
  torch::Tensor w_;
};

// A strategy holding Pushed's gradient whole, one fp32 group: ExactGradients
// then keeps its sums as limbs, the low one in this buffer.
class WholeGradient : public Strategy {
 public:
  explicit WholeGradient(torch::Device device) : gradient_(torch::zeros({300 * 7}, torch::device(device))) {}
  void setup(Model&, Comm&, const StrategyEnv&) override {}
  void backward(const torch::Tensor& loss, const MicroStep&) override { loss.backward(); }
  double reduce_gradients_and_norm() override { return 0.0; }
  void apply_update(const UpdateArgs&) override {}
  void discard_gradients() override {}
  MemoryReport memory() const override { return {}; }
  std::vector<FlatSlice> gradient_slices() const override { return {FlatSlice{0, 0, gradient_}}; }
  std::vector<FlatSlice> parameter_slices() const override { return {}; }
  std::vector<StateSlice> state_slices() override { return {}; }
  void state_loaded() override {}

 private:
  torch::Tensor gradient_;
};

// Also the limbs (fixed_point_add_limbs on CUDA, ATen's arithmetic on the
// CPU): all four give the same sums.
TEST(OpsGpu, FixedPointKernelGivesTheCpuPathsSum) {
  REQUIRE_CUDA();
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(4);
    std::vector<torch::Tensor> parts;
    for (int i = 0; i < 16; ++i)
      parts.push_back(torch::randn({300, 7}) * torch::pow(2.0, -30.0 * torch::rand({300, 7})));
    std::vector<torch::Tensor> sums;
    std::vector<std::vector<int64_t>> scales;
    for (const bool limbs : {false, true}) {
      for (const torch::Device device : {torch::Device(torch::kCPU), kCuda}) {
        Pushed model(device, dtype);
        WholeGradient strategy(device);
        ExactGradients exact(model, 16, device, limbs ? &strategy : nullptr, "whole");
        ASSERT_EQ(exact.sums_in_strategy(), limbs) << device;
        for (int pass = 0; pass < 2; ++pass) {
          exact.begin_pass(16);
          for (const torch::Tensor& c : parts) model.push(c);
          if (exact.end_pass(*comm)) break;
        }
        const torch::Tensor sum = exact.reduce(*comm).at(0);
        // With limbs the sum is converted in the strategy's own memory.
        EXPECT_EQ(sum.data_ptr() == strategy.gradient_slices()[0].values.data_ptr(), limbs) << device;
        sums.push_back(sum.cpu());
        scales.push_back(exact.exponents());
      }
    }
    for (size_t k = 1; k < sums.size(); ++k) {
      EXPECT_EQ(scales[0], scales[k]) << dtype << " arm " << k;
      EXPECT_TRUE(torch::equal(sums[0], sums[k])) << dtype << " arm " << k;
    }
  }
}

// The fixed-point kernel's limb variant (ExactGradients' limbs: sum = high
// 2^32 + low, the low limb's bits unsigned) adds what the int64 variant
// adds, bit for bit: starting sums of both signs up to 2^61 (and the limb
// edges 0, -1, +-2^31, +-2^32), contributions up to 2^42 (so carries and
// borrows cross the limbs), fp32 and bf16 gradients with a NaN-free
// largest magnitude the same. The low limb's storage is fp32 memory in
// ExactGradients; here plain int32.
TEST(OpsGpu, FixedPointLimbKernelAddsWhatTheInt64KernelAdds) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  const int64_t n = 100003;
  constexpr int64_t kLimb = int64_t(1) << 32;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor g = (torch::randn({n}) * torch::pow(2.0, -20.0 * torch::rand({n}))).to(kCuda, dtype);
    torch::Tensor start = torch::randint(-(int64_t(1) << 61), int64_t(1) << 61, {n}, torch::kInt64);
    start.narrow(0, 0, 9).copy_(torch::tensor(
        {int64_t(0), int64_t(-1), kLimb / 2, -kLimb / 2, kLimb, -kLimb, kLimb - 1, -kLimb - 1, kLimb / 2 - 1}));
    const torch::Tensor whole = start.to(kCuda);
    const torch::Tensor high_cpu = start.div(kLimb, "floor");
    const torch::Tensor low_cpu = start - high_cpu * kLimb;  // [0, 2^32): its int32 bits, below
    torch::Tensor high = high_cpu.to(torch::kInt32).to(kCuda);
    torch::Tensor low = (low_cpu - low_cpu.ge(kLimb / 2).to(torch::kInt64) * kLimb).to(torch::kInt32).to(kCuda);
    const auto f64 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat64);
    const torch::Tensor largest_whole = torch::zeros({1}, f64), largest_limbs = torch::zeros({1}, f64);
    const torch::Tensor scale = torch::full({1}, std::ldexp(1.0, 40), f64);  // read on the device
    const double limit = std::ldexp(1.0, 50);
    const auto kernel_dtype = dtype == torch::kFloat32 ? ops::kernels::Dtype::Float32 : ops::kernels::Dtype::BFloat16;
    ops::kernels::fixed_point_add(kernel_dtype, g.data_ptr(), whole.data_ptr<int64_t>(), n, scale.data_ptr<double>(),
                                  limit, largest_whole.data_ptr<double>(), stream);
    ops::kernels::fixed_point_add_limbs(kernel_dtype, g.data_ptr(), low.data_ptr<int32_t>(), high.data_ptr<int32_t>(),
                                        n, scale.data_ptr<double>(), limit, largest_limbs.data_ptr<double>(), stream);
    const torch::Tensor sums =
        high.cpu().to(torch::kInt64) * kLimb + low.cpu().to(torch::kInt64).bitwise_and(kLimb - 1);
    EXPECT_TRUE(torch::equal(sums, whole.cpu())) << dtype;
    EXPECT_FALSE(torch::equal(whole.cpu(), start)) << "nothing was added";
    EXPECT_FALSE(torch::equal(high.cpu().to(torch::kInt64), high_cpu)) << "no carry crossed the limbs";
    EXPECT_EQ(largest_whole.item<double>(), largest_limbs.item<double>()) << dtype;
    // Gradient and limbs one element off 16-byte alignment take the scalar
    // path (the aligned ones above the vector path): the same sums.
    const auto shifted = [&](const torch::Tensor& like) {
      torch::Tensor t = torch::empty({n + 1}, like.options().device(kCuda)).narrow(0, 1, n);
      t.copy_(like);
      return t;
    };
    const torch::Tensor g_shifted = shifted(g), high_shifted = shifted(high_cpu.to(torch::kInt32));
    const torch::Tensor low_shifted =
        shifted((low_cpu - low_cpu.ge(kLimb / 2).to(torch::kInt64) * kLimb).to(torch::kInt32));
    const torch::Tensor largest_shifted = torch::zeros({1}, f64);
    ops::kernels::fixed_point_add_limbs(kernel_dtype, g_shifted.data_ptr(), low_shifted.data_ptr<int32_t>(),
                                        high_shifted.data_ptr<int32_t>(), n, scale.data_ptr<double>(), limit,
                                        largest_shifted.data_ptr<double>(), stream);
    EXPECT_TRUE(torch::equal(high_shifted.cpu(), high.cpu())) << dtype;
    EXPECT_TRUE(torch::equal(low_shifted.cpu(), low.cpu())) << dtype;
    EXPECT_EQ(largest_shifted.item<double>(), largest_limbs.item<double>()) << dtype;
    // A scale of 0 only measures: the sums stay, the largest magnitude still grows.
    const torch::Tensor before = whole.clone(), zero = torch::zeros({1}, f64), largest = torch::zeros({1}, f64);
    ops::kernels::fixed_point_add(kernel_dtype, g.data_ptr(), whole.data_ptr<int64_t>(), n, zero.data_ptr<double>(),
                                  limit, largest.data_ptr<double>(), stream);
    EXPECT_TRUE(torch::equal(whole, before)) << dtype;
    EXPECT_EQ(largest.item<double>(), largest_whole.item<double>()) << dtype;
  }
}

// reduce()'s one-launch conversion of a group's limb sums to fp32, in place,
// against the CPU path's LibTorch sequence (int64 -> fp64, times 2^-s, ->
// fp32): parameters of 1 to 70,000 elements and one of none, sums of both
// signs up to 2^61 (beyond 2^53 the fp64 conversion rounds), the limb
// edges, and a parameter with no scale yet (+0 whatever its limbs hold).
TEST(OpsGpu, FixedPointLimbsConvertToTheCpuPathsFp32) {
  REQUIRE_CUDA();
  torch::manual_seed(6);
  constexpr int64_t kLimb = int64_t(1) << 32;
  const std::vector<int64_t> sizes = {1, 70000, 0, 33, 4096, 5, 12345};
  const std::vector<int64_t> exponents = {40, 20, 7, ExactGradients::kUnknown, 61, -3, 30};
  std::vector<int64_t> starts;
  int64_t n = 0;
  for (const int64_t size : sizes) {
    starts.push_back(n);
    n += size;
  }
  torch::Tensor sums = torch::randint(-(int64_t(1) << 61), int64_t(1) << 61, {n}, torch::kInt64);
  // Small magnitudes too (exact in fp64), and the limb edges.
  sums.narrow(0, 1, 20000).div_(int64_t(1) << 30, "trunc");
  sums.narrow(0, 0, 9).copy_(torch::tensor(
      {int64_t(0), int64_t(-1), kLimb / 2, -kLimb / 2, kLimb, -kLimb, kLimb - 1, -kLimb - 1, kLimb / 2 - 1}));
  const torch::Tensor high_cpu = sums.div(kLimb, "floor");
  const torch::Tensor low_cpu = sums - high_cpu * kLimb;
  torch::Tensor high = high_cpu.to(torch::kInt32).to(kCuda);
  torch::Tensor low = (low_cpu - low_cpu.ge(kLimb / 2).to(torch::kInt64) * kLimb).to(torch::kInt32).to(kCuda);
  std::vector<double> scales;
  torch::Tensor expected = torch::empty({n}, torch::kFloat32);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const bool known = exponents[k] != ExactGradients::kUnknown;
    scales.push_back(known ? std::ldexp(1.0, -static_cast<int>(exponents[k])) : 0.0);
    torch::Tensor into = expected.narrow(0, starts[k], sizes[k]);
    if (!known) {
      into.zero_();
    } else {
      into.copy_(sums.narrow(0, starts[k], sizes[k]).to(torch::kFloat64).mul_(scales.back()));
    }
  }
  const torch::Tensor starts_device = torch::tensor(starts, torch::kInt64).to(kCuda);
  const torch::Tensor scales_device = torch::tensor(scales, torch::kFloat64).to(kCuda);
  ops::kernels::fixed_point_limbs_to_float(
      low.data_ptr<int32_t>(), high.data_ptr<int32_t>(), n, starts_device.data_ptr<int64_t>(),
      static_cast<int>(sizes.size()), scales_device.data_ptr<double>(), c10::cuda::getCurrentCUDAStream().stream());
  const torch::Tensor got = low.view(torch::kFloat32).cpu();
  EXPECT_TRUE(torch::equal(got.view(torch::kInt32), expected.view(torch::kInt32)))
      << (got - expected).abs().max().item<float>();
  // The unknown parameter's +0 even where its limbs held a negative sum.
  const torch::Tensor unknown = got.narrow(0, starts[3], sizes[3]);
  EXPECT_TRUE(torch::equal(unknown.view(torch::kInt32), torch::zeros({sizes[3]}, torch::kInt32)));
  EXPECT_LT(sums.narrow(0, starts[3], sizes[3]).min().item<int64_t>(), 0);
  // Beyond 2^53 the fp64 conversion rounded somewhere (the comparison saw rounding, not only exact values).
  EXPECT_GT(sums.abs().max().item<int64_t>(), int64_t(1) << 53);
}

}  // namespace
}  // namespace trainer
