// The SDK's fused operations (trainer/ops) on the CPU against independent
// composite forms in fp64: values and gradients. The CUDA kernels are held
// to these CPU paths in tests/gpu/OpsGpuTest.cpp.
#include <cmath>
#include <tuple>

#include <gtest/gtest.h>

#include <torch/autograd.h>

#include "ops/Dispatch.h"
#include "trainer/Model.h"
#include "trainer/ops/Attention.h"
#include "trainer/ops/Linear.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/Recompute.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"

namespace trainer {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm()).item<double>();
}

torch::Tensor leaf(torch::Tensor t) { return t.set_requires_grad(true); }

// fp64 arithmetic: the same function by two routes agrees to ~1e-15; 1e-12 leaves room for summation order.
constexpr double kFp64 = 1e-12;

TEST(Ops, LinearCrossEntropySumMatchesCrossEntropyOfFullLogits) {
  torch::manual_seed(0);
  torch::Tensor labels = torch::randint(0, 37, {23}, torch::kInt64);
  labels.index_put_({torch::tensor({1, 5, 6, 20})}, kIgnoreIndex);  // completion-only: some rows do not count
  for (const int64_t chunk : {0, 1, 4, 100}) {
    const torch::Tensor h = leaf(torch::randn({23, 16}, kF64)), w = leaf(torch::randn({37, 16}, kF64));
    const torch::Tensor h2 = leaf(h.detach().clone()), w2 = leaf(w.detach().clone());
    const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, labels, chunk);
    const torch::Tensor expected =
        at::cross_entropy_loss(torch::linear(h2, w2), labels, {}, at::Reduction::Sum, kIgnoreIndex);
    EXPECT_LT(relative_error(loss, expected), kFp64) << "chunk " << chunk;
    (loss / 7.0).backward();
    (expected / 7.0).backward();
    EXPECT_LT(relative_error(h.grad(), h2.grad()), kFp64) << "chunk " << chunk;
    EXPECT_LT(relative_error(w.grad(), w2.grad()), kFp64) << "chunk " << chunk;
    EXPECT_EQ(h.grad()[1].abs().sum().item<double>(), 0.0) << "an ignored row gets no gradient";
  }
}

// A caller that gives the target count (every row a target) gets the same
// bits as one that lets the op count; a second backward is refused (the
// first consumes the gradients formed in forward).
TEST(Ops, LinearCrossEntropySumWithAGivenTargetCount) {
  torch::manual_seed(8);
  const torch::Tensor labels = torch::randint(0, 37, {23}, torch::kInt64);
  const torch::Tensor h0 = torch::randn({23, 16}, kF64), w0 = torch::randn({37, 16}, kF64);
  std::vector<torch::Tensor> results[2];
  for (const bool given : {false, true}) {
    const torch::Tensor h = leaf(h0.clone()), w = leaf(w0.clone());
    const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, labels, 5, given ? 23 : -1);
    loss.backward({}, /*retain_graph=*/true);
    results[given] = {loss.detach(), h.grad(), w.grad()};
    EXPECT_THROW(loss.backward(), c10::Error);
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(results[0][i], results[1][i])) << i;
}

TEST(Ops, LinearCrossEntropySumInBf16StaysWithinBf16Rounding) {
  torch::manual_seed(1);
  const torch::Tensor labels = torch::randint(0, 50, {64}, torch::kInt64);
  const torch::Tensor h = leaf(torch::randn({64, 32}).to(torch::kBFloat16));
  const torch::Tensor w = leaf((torch::randn({50, 32}) * 0.3).to(torch::kBFloat16));
  const torch::Tensor loss = ops::linear_cross_entropy_sum(h, w, labels, 16);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32) << "the loss sum is fp32 whatever the compute dtype";
  loss.backward();
  const torch::Tensor h64 = leaf(h.detach().to(torch::kFloat64)), w64 = leaf(w.detach().to(torch::kFloat64));
  const torch::Tensor expected = at::cross_entropy_loss(torch::linear(h64, w64), labels, {}, at::Reduction::Sum);
  expected.backward();
  // bf16 logits (8 significant bits, relative rounding 2^-9 ~ 2e-3) feed an
  // fp32 softmax: the loss and gradients carry errors of that order.
  EXPECT_LT(relative_error(loss, expected), 1e-2);
  EXPECT_LT(relative_error(h.grad(), h64.grad()), 2e-2);
  EXPECT_LT(relative_error(w.grad(), w64.grad()), 2e-2);
}

TEST(Ops, StackedLinearEqualsSeparateLinearsWithOrWithoutAdjacentStorage) {
  torch::manual_seed(2);
  const torch::Tensor flat = torch::randn({(6 + 2 + 2) * 5 + 10}, kF64);
  for (const bool adjacent : {true, false}) {
    std::vector<torch::Tensor> w, b;
    int64_t at = 0;
    for (const int64_t rows : {6, 2, 2}) {
      torch::Tensor p = adjacent ? flat.narrow(0, at, rows * 5).view({rows, 5}) : torch::randn({rows, 5}, kF64);
      at += rows * 5;
      w.push_back(leaf(p.detach()));
      b.push_back(leaf(torch::randn({rows}, kF64)));
    }
    if (adjacent) {  // leaves that are views of one buffer, as flat parameter groups make them
      torch::Tensor storage = torch::randn({50}, kF64);
      for (size_t i = 0, offset = 0; i < w.size(); offset += w[i].numel(), ++i) {
        torch::NoGradGuard no_grad;
        w[i].set_data(storage.narrow(0, offset, w[i].numel()).view(w[i].sizes()));
      }
    }
    const torch::Tensor x = leaf(torch::randn({3, 4, 5}, kF64));
    const torch::Tensor y = ops::linear(x, w, b);
    std::vector<torch::Tensor> w2, b2;
    for (size_t i = 0; i < w.size(); ++i) {
      w2.push_back(leaf(w[i].detach().clone()));
      b2.push_back(leaf(b[i].detach().clone()));
    }
    const torch::Tensor x2 = leaf(x.detach().clone());
    const torch::Tensor y2 = torch::cat(
        {torch::linear(x2, w2[0], b2[0]), torch::linear(x2, w2[1], b2[1]), torch::linear(x2, w2[2], b2[2])}, -1);
    EXPECT_LT(relative_error(y, y2), kFp64);
    const torch::Tensor g = torch::randn(y.sizes(), kF64);
    y.backward(g);
    y2.backward(g);
    EXPECT_LT(relative_error(x.grad(), x2.grad()), kFp64);
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_LT(relative_error(w[i].grad(), w2[i].grad()), kFp64) << "weight " << i << (adjacent ? " (view)" : "");
      EXPECT_LT(relative_error(b[i].grad(), b2[i].grad()), kFp64) << "bias " << i;
    }
  }
}

// ops::Fp8WeightReuse (the training loop's scope over a step's micro-steps)
// changes nothing where no FP8 cast is made: linear in a scope gives the
// bits it gives outside one, nothing is reused, scopes do not nest, and a
// closed scope lets the next open. (Reuse itself: OpsGpu.Fp8WeightCastsReusedWithinAStepGiveTheSameBits.)
TEST(Ops, Fp8WeightReuseScopeChangesNothingWithoutFp8) {
  torch::manual_seed(3);
  const torch::Tensor storage = torch::randn({4 * 5}, kF64);
  const std::vector<torch::Tensor> w{leaf(storage.narrow(0, 0, 10).view({2, 5}).detach()),
                                     leaf(storage.narrow(0, 10, 10).view({2, 5}).detach())};
  const torch::Tensor x = torch::randn({3, 5}, kF64);
  const torch::Tensor outside = ops::linear(x, w);
  const int64_t before = ops::Fp8WeightReuse::reused();
  for (int step = 0; step < 4; ++step) {
    const ops::Fp8WeightReuse scope(step % 2 == 0 ? ops::Fp8WeightReuse::Keep::transposed
                                                  : ops::Fp8WeightReuse::Keep::both);
    EXPECT_THROW(ops::Fp8WeightReuse{}, c10::Error) << "step " << step;
    for (int micro = 0; micro < 3; ++micro) EXPECT_TRUE(torch::equal(ops::linear(x, w), outside)) << micro;
  }
  EXPECT_EQ(ops::Fp8WeightReuse::reused(), before);
}

// linear_of keeps the norm's (or SwiGLU's) input instead of its output; the
// values and every gradient (input, the norm's weight, each weight and bias)
// are those of the plain composition: bit for bit with stacked weights (the
// same GEMMs and the same autograd of f), and to fp64 rounding with one
// weight (the plain form then takes torch::linear's own backward).
TEST(Ops, LinearOfRecomputedInputGivesTheGradientsOfTheComposition) {
  torch::manual_seed(7);
  const double eps = 1e-6;
  int calls = 0;
  const ops::InputFunction norm = [eps, &calls](const torch::Tensor& s, const std::vector<torch::Tensor>& w) {
    ++calls;
    return ops::rms_norm(s, w[0], eps);
  };
  const torch::Tensor x0 = torch::randn({3, 4, 6}, kF64), n0 = torch::randn({6}, kF64);
  const torch::Tensor w0 = torch::randn({5, 6}, kF64), w1 = torch::randn({3, 6}, kF64), b0 = torch::randn({5}, kF64),
                      b1 = torch::randn({3}, kF64);
  for (const bool one_weight : {false, true}) {
    std::vector<torch::Tensor> grads[2];
    torch::Tensor outputs[2];
    for (const bool recomputed : {false, true}) {
      const torch::Tensor x = leaf(x0.clone()), n = leaf(n0.clone()), a = leaf(w0.clone()), b = leaf(w1.clone()),
                          c = leaf(b0.clone()), d = leaf(b1.clone());
      std::vector<torch::Tensor> weights{a}, biases{c}, params{x, n, a, c};
      if (!one_weight) {
        weights.push_back(b);
        biases.push_back(d);
        params.push_back(b);
        params.push_back(d);
      }
      calls = 0;
      const torch::Tensor y = recomputed ? ops::linear_of(norm, x, {n}, weights, biases)
                                         : ops::linear(ops::rms_norm(x, n, eps), weights, biases);
      y.backward(torch::cos(torch::arange(y.numel(), kF64)).view(y.sizes()));
      EXPECT_EQ(calls, recomputed ? 2 : 0) << "linear_of runs f in forward and again in backward";
      outputs[recomputed] = y.detach();
      for (const torch::Tensor& p : params) {
        ASSERT_TRUE(p.grad().defined());
        grads[recomputed].push_back(p.grad());
      }
    }
    EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
    for (size_t i = 0; i < grads[0].size(); ++i) {
      if (one_weight) {
        EXPECT_LT(relative_error(grads[1][i], grads[0][i]), kFp64) << "gradient " << i;
      } else {
        EXPECT_TRUE(torch::equal(grads[1][i], grads[0][i])) << "gradient " << i;
      }
    }
  }
  // Without gradients it is the plain composition.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(ops::linear_of(norm, x0, {n0}, {w0}), torch::linear(ops::rms_norm(x0, n0, eps), w0)));
}

// swiglu_linear is linear_of(swiglu, ...) on the CPU: the same values and
// gradients (gate/up, stacked weights, biases), bit for bit.
TEST(Ops, SwiGluLinearIsLinearOfSwiGlu) {
  torch::manual_seed(8);
  const torch::Tensor g0 = torch::randn({2, 3, 8}, kF64), w0 = torch::randn({5, 4}, kF64),
                      w1 = torch::randn({2, 4}, kF64), b0 = torch::randn({5}, kF64), b1 = torch::randn({2}, kF64);
  const ops::InputFunction swiglu = [](const torch::Tensor& s, const std::vector<torch::Tensor>&) {
    return ops::swiglu(s);
  };
  std::vector<torch::Tensor> results[2];
  for (const bool fused : {false, true}) {
    const torch::Tensor g = leaf(g0.clone()), a = leaf(w0.clone()), b = leaf(w1.clone()), c = leaf(b0.clone()),
                        d = leaf(b1.clone());
    const torch::Tensor y =
        fused ? ops::swiglu_linear(g, {a, b}, {c, d}) : ops::linear_of(swiglu, g, {}, {a, b}, {c, d});
    y.backward(torch::cos(torch::arange(y.numel(), kF64)).view(y.sizes()));
    results[fused] = {y.detach(), g.grad(), a.grad(), b.grad(), c.grad(), d.grad()};
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_TRUE(results[1][i].defined()) << i;
    EXPECT_TRUE(torch::equal(results[0][i], results[1][i])) << i;
  }
  EXPECT_LT(relative_error(results[1][0],
                           torch::linear(ops::swiglu_reference(g0), torch::cat({w0, w1}), torch::cat({b0, b1}))),
            kFp64);
}

// norm_linear is linear_of(rms_norm, ...) on the CPU: the same values and
// gradients (input, the norm's weight, stacked weights, biases), bit for
// bit; and the value is RMSNorm then the product, to fp64 rounding.
TEST(Ops, NormLinearIsLinearOfRmsNorm) {
  torch::manual_seed(9);
  const double eps = 1e-5;
  const torch::Tensor x0 = torch::randn({2, 3, 8}, kF64), n0 = torch::randn({8}, kF64), w0 = torch::randn({5, 8}, kF64),
                      w1 = torch::randn({2, 8}, kF64), b0 = torch::randn({5}, kF64), b1 = torch::randn({2}, kF64);
  const ops::InputFunction norm = [eps](const torch::Tensor& s, const std::vector<torch::Tensor>& p) {
    return ops::rms_norm(s, p[0], eps);
  };
  std::vector<torch::Tensor> results[2];
  for (const bool fused : {false, true}) {
    const torch::Tensor x = leaf(x0.clone()), n = leaf(n0.clone()), a = leaf(w0.clone()), b = leaf(w1.clone()),
                        c = leaf(b0.clone()), d = leaf(b1.clone());
    const torch::Tensor y =
        fused ? ops::norm_linear(x, n, eps, {a, b}, {c, d}) : ops::linear_of(norm, x, {n}, {a, b}, {c, d});
    y.backward(torch::cos(torch::arange(y.numel(), kF64)).view(y.sizes()));
    results[fused] = {y.detach(), x.grad(), n.grad(), a.grad(), b.grad(), c.grad(), d.grad()};
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_TRUE(results[1][i].defined()) << i;
    EXPECT_TRUE(torch::equal(results[0][i], results[1][i])) << i;
  }
  const torch::Tensor normed = x0 / torch::sqrt(x0.pow(2).mean(-1, true) + eps) * n0;
  EXPECT_LT(relative_error(results[1][0], torch::linear(normed, torch::cat({w0, w1}), torch::cat({b0, b1}))), kFp64);
}

// Hugging Face's form: x * cos + rotate_half(x) * sin with tables of the full head width.
torch::Tensor hf_rotary(const torch::Tensor& x /*[b, t, h, d]*/, double theta) {
  const int64_t t = x.size(1), d = x.size(3);
  const torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, d, 2, kF64) / d);
  const torch::Tensor freqs = torch::outer(torch::arange(t, kF64), inv_freq);
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1).view({1, t, 1, d});
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, d / 2, d / 2), x.narrow(-1, 0, d / 2)}, -1);
  return x * angles.cos() + rotated * angles.sin();
}

TEST(Ops, SplitQkvRotaryMatchesHuggingFacesRotateHalf) {
  torch::manual_seed(3);
  const int64_t b = 2, t = 7, heads = 4, kv = 2, d = 6;
  const torch::Tensor qkv = torch::randn({b, t, (heads + 2 * kv) * d}, kF64);
  const auto tables = ops::RotaryTables::make(t, d, 10000.0, torch::kFloat64, torch::kCPU);
  const ops::QkvHeads out = ops::split_qkv_rotary(qkv, heads, kv, tables);
  const torch::Tensor q = qkv.narrow(-1, 0, heads * d).reshape({b, t, heads, d});
  const torch::Tensor k = qkv.narrow(-1, heads * d, kv * d).reshape({b, t, kv, d});
  const torch::Tensor v = qkv.narrow(-1, (heads + kv) * d, kv * d).reshape({b, t, kv, d});
  EXPECT_LT(relative_error(out.q, hf_rotary(q, 10000.0)), kFp64);
  EXPECT_LT(relative_error(out.k, hf_rotary(k, 10000.0)), kFp64);
  EXPECT_TRUE(torch::equal(out.v, v));
}

// Packed documents: per-token tables at each token's own position rotate
// every document as if it started the sequence (Hugging Face's rotation of
// the document alone, positions from 0).
TEST(Ops, PerTokenRotaryTablesRestartPositionsAtEachDocument) {
  torch::manual_seed(4);
  const int64_t b = 2, t = 7, heads = 4, kv = 2, d = 6;
  const torch::Tensor qkv = torch::randn({b, t, (heads + 2 * kv) * d}, kF64);
  const torch::Tensor positions = torch::tensor({0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6}, torch::kInt64).view({b, t});
  const auto tables = ops::RotaryTables::make(t, d, 10000.0, torch::kFloat64, torch::kCPU).at_positions(positions);
  const ops::QkvHeads out = ops::split_qkv_rotary(qkv, heads, kv, tables);
  const torch::Tensor q = qkv.narrow(-1, 0, heads * d).reshape({b, t, heads, d});
  const torch::Tensor k = qkv.narrow(-1, heads * d, kv * d).reshape({b, t, kv, d});
  const auto part = [](const torch::Tensor& x, int64_t row, int64_t first, int64_t count) {
    return x.narrow(0, row, 1).narrow(1, first, count);
  };
  for (const auto& [row, first, count] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 0, 3}, {0, 3, 4}, {1, 0, 7}}) {
    EXPECT_LT(relative_error(part(out.q, row, first, count), hf_rotary(part(q, row, first, count), 10000.0)), kFp64);
    EXPECT_LT(relative_error(part(out.k, row, first, count), hf_rotary(part(k, row, first, count), 10000.0)), kFp64);
  }
}

// The layout a variable-length kernel takes, worked by hand: each row's
// documents (a change of number, or a new row, starts one) laid end to end.
TEST(Ops, DocumentLayoutLaysEachRowsDocumentsEndToEnd) {
  // Row 0 holds documents of 3, 2 and 3 positions; row 1 numbers its first
  // document 0 again (the new row starts it) and holds 6 and 2 positions.
  const torch::Tensor ids = torch::tensor({0, 0, 0, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1}, torch::kInt64).view({2, 8});
  const ops::DocumentLayout layout = ops::document_layout(ids);
  ASSERT_EQ(layout.offsets.scalar_type(), torch::kInt32);
  const torch::Tensor offsets = layout.offsets.to(torch::kInt64);
  EXPECT_EQ(std::vector<int64_t>(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + offsets.numel()),
            (std::vector<int64_t>{0, 3, 5, 8, 14, 16}));
  EXPECT_EQ(layout.longest, 6);
  EXPECT_TRUE(layout.ids.equal(ids));
  // One document per row: rows are documents of their own even with equal numbers.
  const ops::DocumentLayout rows = ops::document_layout(torch::zeros({3, 5}, torch::kInt64));
  EXPECT_TRUE(rows.offsets.equal(torch::tensor({0, 5, 10, 15}, torch::kInt32)));
  EXPECT_EQ(rows.longest, 5);
}

// Attention within documents against softmax attention written out per
// document in fp64 (each document's causal attention over its own keys,
// grouped k/v heads repeated).
TEST(Ops, DocumentAttentionIsCausalAttentionWithinEachDocument) {
  torch::manual_seed(5);
  const int64_t b = 2, heads = 4, kv = 2, t = 10, d = 8;
  const torch::Tensor q = torch::randn({b, heads, t, d}, kF64);
  const torch::Tensor k = torch::randn({b, kv, t, d}, kF64), v = torch::randn({b, kv, t, d}, kF64);
  const torch::Tensor documents =
      torch::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, torch::kInt64).view({b, t});
  const torch::Tensor out = ops::document_causal_attention(q, k, v, documents);
  const torch::Tensor expected = torch::zeros_like(out);
  for (const auto& [row, first, count] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 0, 3}, {0, 3, 4}, {0, 7, 3}, {1, 0, 10}}) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < count; ++i) {
        const torch::Tensor query = q[row][h][first + i];
        const torch::Tensor keys = k[row][h / (heads / kv)].narrow(0, first, i + 1);
        const torch::Tensor values = v[row][h / (heads / kv)].narrow(0, first, i + 1);
        const torch::Tensor weights = torch::softmax(torch::mv(keys, query) / std::sqrt(double(d)), 0);
        expected[row][h][first + i].copy_(torch::mv(values.t(), weights));
      }
    }
  }
  EXPECT_LT(relative_error(out, expected), kFp64);
  // With the layout's offsets: the same (off CUDA the offsets take no other path).
  EXPECT_TRUE(ops::document_causal_attention(q, k, v, ops::document_layout(documents)).equal(out));
  // Undefined document ids: causal attention over the whole row.
  EXPECT_TRUE(
      torch::allclose(ops::document_causal_attention(q, k, v, torch::Tensor()), ops::causal_attention(q, k, v)));
  EXPECT_GT(relative_error(ops::causal_attention(q, k, v), expected), 1e-2) << "the documents matter here";
}

// Llama 3's rope scaling against the rule written out per frequency in
// fp64 (Meta's reference apply_scaling): wavelengths above old/low stretched
// by `factor`, below old/high kept, between them interpolated. The tables
// are computed in fp64 for an fp64 model, so 1e-12.
TEST(Ops, RotaryTablesWithLlama3ScalingFollowTheRule) {
  const int64_t seq = 40, dim = 16;
  const double theta = 10000.0;
  const ops::RopeScaling scaling{8.0, 1.0, 4.0, 64.0};
  const ops::RotaryTables tables = ops::RotaryTables::make(seq, dim, theta, torch::kFloat64, torch::kCPU, scaling);
  const ops::RotaryTables plain = ops::RotaryTables::make(seq, dim, theta, torch::kFloat64, torch::kCPU);
  int stretched = 0, kept = 0, between = 0;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double freq = 1.0 / std::pow(theta, 2.0 * i / dim);
    const double wavelen = 2 * M_PI / freq;
    double scaled = freq;
    if (wavelen > 64.0 / 1.0) {
      scaled = freq / 8.0;
      ++stretched;
    } else if (wavelen >= 64.0 / 4.0) {
      const double smooth = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      scaled = (1 - smooth) * freq / 8.0 + smooth * freq;
      ++between;
    } else {
      ++kept;
    }
    for (const int64_t pos : {int64_t(1), int64_t(7), seq - 1}) {
      EXPECT_NEAR(tables.cos[pos][i].item<double>(), std::cos(pos * scaled), 1e-12) << "frequency " << i;
      EXPECT_NEAR(tables.sin[pos][i].item<double>(), std::sin(pos * scaled), 1e-12) << "frequency " << i;
    }
  }
  EXPECT_GT(stretched, 0);  // the three bands are all exercised
  EXPECT_GT(kept, 0);
  EXPECT_GT(between, 0);
  EXPECT_FALSE(torch::equal(tables.cos, plain.cos));
  const ops::RotaryTables unit =
      ops::RotaryTables::make(seq, dim, theta, torch::kFloat64, torch::kCPU, ops::RopeScaling{});
  EXPECT_TRUE(torch::equal(unit.cos, plain.cos));  // factor 1: no scaling
}

TEST(Ops, SwiGluIsSiluOfGateTimesUp) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({3, 5, 8}, kF64);
  const torch::Tensor gate = x.narrow(-1, 0, 4), up = x.narrow(-1, 4, 4);
  EXPECT_LT(relative_error(ops::swiglu(x), gate / (1 + torch::exp(-gate)) * up), kFp64);
}

// A public op refuses what it cannot compute instead of dividing by zero or
// reading past a table: an empty SwiGLU width, rotary tables of the wrong
// dtype, device-independent shape or length.
TEST(Ops, OpsRefuseInputsTheyCannotCompute) {
  EXPECT_THROW(ops::swiglu(torch::zeros({2, 0}, kF64)), c10::Error);
  EXPECT_THROW(ops::swiglu(torch::zeros({2, 3}, kF64)), c10::Error);
  const int64_t t = 5, heads = 2, kv = 1, d = 4;
  const torch::Tensor qkv = torch::randn({1, t, (heads + 2 * kv) * d}, kF64);
  const auto tables = ops::RotaryTables::make(t, d, 10000.0, torch::kFloat64, torch::kCPU);
  const auto short_tables = ops::RotaryTables::make(t - 1, d, 10000.0, torch::kFloat64, torch::kCPU);
  const auto fp32_tables = ops::RotaryTables::make(t, d, 10000.0, torch::kFloat32, torch::kCPU);
  const auto wide_tables = ops::RotaryTables::make(t, 2 * d, 10000.0, torch::kFloat64, torch::kCPU);
  EXPECT_NO_THROW(ops::split_qkv_rotary(qkv, heads, kv, tables));
  for (const ops::RotaryTables* bad : {&short_tables, &fp32_tables, &wide_tables}) {
    EXPECT_THROW(ops::split_qkv_rotary(qkv, heads, kv, *bad), c10::Error);
  }
  EXPECT_THROW(ops::split_qkv_rotary(qkv, heads, kv, ops::RotaryTables{}), c10::Error);
  // Longer tables than the sequence are fine: the first t rows are used.
  const auto long_tables = ops::RotaryTables::make(t + 3, d, 10000.0, torch::kFloat64, torch::kCPU);
  EXPECT_TRUE(torch::equal(ops::split_qkv_rotary(qkv, heads, kv, long_tables).q,
                           ops::split_qkv_rotary(qkv, heads, kv, tables).q));
}

TEST(Ops, RmsNormMatchesItsDefinition) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({4, 9}, kF64), w = torch::randn({9}, kF64);
  const torch::Tensor expected = w * x / torch::sqrt(x.square().mean(-1, true) + 1e-6);
  EXPECT_LT(relative_error(ops::rms_norm(x, w, 1e-6), expected), kFp64);
}

TEST(Ops, RecomputeGivesTheSameGradientsBitForBit) {
  torch::manual_seed(6);
  const torch::Tensor w = leaf(torch::randn({8, 8})), bias = leaf(torch::randn({8}));
  auto block = [&](const torch::Tensor& x) { return x + torch::tanh(torch::linear(x, w, bias)) * 0.5; };
  const torch::Tensor input = torch::randn({5, 8});
  std::vector<torch::Tensor> grads[2];
  for (const bool checkpointed : {false, true}) {
    const torch::Tensor x = leaf(input.clone());
    const torch::Tensor y = checkpointed ? ops::recompute(block, ops::recompute(block, x)) : block(block(x));
    y.square().sum().backward();
    grads[checkpointed] = {x.grad().clone(), w.grad().clone(), bias.grad().clone()};
    w.mutable_grad().reset();
    bias.mutable_grad().reset();
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "gradient " << i;
}

}  // namespace
}  // namespace trainer
