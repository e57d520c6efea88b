// Reproducible mode's fixed-point gradient sum: the same bits in any order,
// within its documented bound of the fp64 sum, and scales that follow the
// gradients (a pass out of range is run again, never wrapped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/Dispatch.h"
#include "reproducible/ExactGradients.h"
#include "reproducible/ReproducibleMode.h"
#include "trainer/Comm.h"
#include "trainer/Model.h"

namespace trainer {
namespace {

// Two parameters (a matrix with decay, a vector without) whose gradient in
// a backward is whatever `push` asks for: loss = sum(w * c) has dloss/dw = c.
class TwoParameters : public Model {
 public:
  TwoParameters()
      : w_(torch::zeros({4, 8}, torch::kFloat32).requires_grad_()),
        b_(torch::zeros({8}, torch::kFloat32).requires_grad_()) {}
  std::vector<NamedParameter> parameters() override { return {{"w", w_, true}, {"b", b_, false}}; }
  LossSum forward(const Batch&) override { return {}; }
  int64_t vocab_size() const override { return 1; }
  void push(const torch::Tensor& cw, const torch::Tensor& cb) { ((w_ * cw).sum() + (b_ * cb).sum()).backward(); }

 private:
  torch::Tensor w_, b_;
};

// Contributions spread over 2^-30 .. 2^0 in magnitude, both signs.
std::vector<std::pair<torch::Tensor, torch::Tensor>> contributions(int count, uint64_t seed, double scale = 1.0) {
  torch::manual_seed(seed);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int i = 0; i < count; ++i) {
    const auto spread = [&](std::vector<int64_t> shape) {
      return (torch::randn(shape) * torch::pow(2.0, -30.0 * torch::rand(shape)) * scale).to(torch::kFloat32);
    };
    out.emplace_back(spread({4, 8}), spread({8}));
  }
  return out;
}

// One accepted pass over `parts` in the given order; returns the reduced groups.
std::vector<torch::Tensor> sum_of(TwoParameters& model, ExactGradients& exact, Comm& comm,
                                  const std::vector<std::pair<torch::Tensor, torch::Tensor>>& parts) {
  for (int pass = 0; pass < 2; ++pass) {
    exact.begin_pass(static_cast<int64_t>(parts.size()));
    for (const auto& [cw, cb] : parts) model.push(cw, cb);
    if (exact.end_pass(comm)) return exact.reduce(comm);
  }
  ADD_FAILURE() << "a second pass over the same contributions was not accepted";
  return {};
}

TEST(ExactGradients, AnyOrderGivesTheSameBits) {
  TwoParameters model;
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  auto parts = contributions(64, 3);
  ExactGradients forward_order(model, 64, torch::kCPU);
  const std::vector<torch::Tensor> a = sum_of(model, forward_order, *comm, parts);
  std::reverse(parts.begin(), parts.end());
  std::shuffle(parts.begin() + 10, parts.end(), std::mt19937(7));
  ExactGradients other_order(model, 64, torch::kCPU);
  const std::vector<torch::Tensor> b = sum_of(model, other_order, *comm, parts);
  ASSERT_EQ(a.size(), 2u);  // decay group (w), then no-decay group (b)
  EXPECT_EQ(a[0].numel(), 32);
  EXPECT_EQ(a[1].numel(), 8);
  for (size_t g = 0; g < a.size(); ++g) EXPECT_TRUE(torch::equal(a[g], b[g])) << "group " << g;
  // fp32 summation in the two orders does differ: what the fixed point removes.
  torch::Tensor forward_sum = torch::zeros({8}), backward_sum = torch::zeros({8});
  for (size_t i = 0; i < parts.size(); ++i) {
    forward_sum += parts[i].second;
    backward_sum += parts[parts.size() - 1 - i].second;
  }
  EXPECT_FALSE(torch::equal(forward_sum, backward_sum));
}

TEST(ExactGradients, WithinItsBoundOfTheFp64Sum) {
  TwoParameters model;
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  const auto parts = contributions(1024, 11);
  ExactGradients exact(model, 1024, torch::kCPU);
  const std::vector<torch::Tensor> got = sum_of(model, exact, *comm, parts);
  torch::Tensor w = torch::zeros({32}, torch::kFloat64), b = torch::zeros({8}, torch::kFloat64);
  double largest_w = 0, largest_b = 0;
  for (const auto& [cw, cb] : parts) {
    w += cw.reshape({-1}).to(torch::kFloat64);
    b += cb.to(torch::kFloat64);
    largest_w = std::max(largest_w, cw.abs().max().item<double>());
    largest_b = std::max(largest_b, cb.abs().max().item<double>());
  }
  // ExactGradients.h: 1024 samples give bits = 51 and an error of at most
  // M * 2^(8-51) per contribution; plus the final rounding to fp32 (half an
  // ulp of the result, 2^-24 relative).
  const auto check = [](const torch::Tensor& got, const torch::Tensor& ref, double largest, const char* name) {
    const torch::Tensor bound = 1024 * largest * std::ldexp(1.0, 8 - 51) + ref.abs() * std::ldexp(1.0, -24);
    const torch::Tensor error = (got.to(torch::kFloat64) - ref).abs();
    EXPECT_TRUE((error <= bound).all().item<bool>())
        << name << ": worst error / bound " << (error / bound).max().item<double>();
  };
  check(got[0], w, largest_w, "w");
  check(got[1], b, largest_b, "b");
}

TEST(ExactGradients, AGrowingGradientRunsThePassAgainInsteadOfWrapping) {
  TwoParameters model;
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  ExactGradients exact(model, 8, torch::kCPU);
  EXPECT_EQ(exact.exponents()[0], ExactGradients::kUnknown);
  const auto small = contributions(8, 5);
  sum_of(model, exact, *comm, small);  // the first pass measures, the second sums
  const std::vector<int64_t> scales = exact.exponents();
  ASSERT_NE(scales[0], ExactGradients::kUnknown);
  // 2^20 times larger: past the 8 bits of headroom, the pass is refused.
  const auto large = contributions(8, 5, std::ldexp(1.0, 20));
  exact.begin_pass(8);
  for (const auto& [cw, cb] : large) model.push(cw, cb);
  EXPECT_FALSE(exact.end_pass(*comm));
  EXPECT_EQ(exact.exponents()[0], scales[0] - 20);  // scales follow exactly, by a power of two
  exact.begin_pass(8);
  for (const auto& [cw, cb] : large) model.push(cw, cb);
  ASSERT_TRUE(exact.end_pass(*comm));
  const std::vector<torch::Tensor> sum = exact.reduce(*comm);
  torch::Tensor ref = torch::zeros({8}, torch::kFloat64);
  for (const auto& [cw, cb] : large) ref += cb.to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(sum[1].to(torch::kFloat64), ref, 1e-6, 0.0));
}

// Parameters that interleave the groups (decay, no decay, decay), the first
// longer than reduce()'s conversion chunk, so the sum crosses chunk borders
// and each group is filled from two parameters. Contributions on a grid of
// 2^-10 within +-4: every partial sum is exact in fp64 and fp32, so the
// reduced groups must equal the fp64 sum exactly, element by element.
class ThreeParameters : public Model {
 public:
  ThreeParameters()
      : big_(torch::zeros({ExactGradients::kConvertChunk + 37}).requires_grad_()),
        bias_(torch::zeros({5}).requires_grad_()),
        small_(torch::zeros({3, 4}).requires_grad_()) {}
  std::vector<NamedParameter> parameters() override {
    return {{"big", big_, true}, {"bias", bias_, false}, {"small", small_, true}};
  }
  LossSum forward(const Batch&) override { return {}; }
  int64_t vocab_size() const override { return 1; }
  void push(const std::vector<torch::Tensor>& c) {
    ((big_ * c[0]).sum() + (bias_ * c[1]).sum() + (small_ * c[2]).sum()).backward();
  }
  std::vector<torch::Tensor> shapes() const { return {big_, bias_, small_}; }

 private:
  torch::Tensor big_, bias_, small_;
};

TEST(ExactGradients, ReducedGroupsAreTheExactSumAcrossConversionChunks) {
  ThreeParameters model;
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  torch::manual_seed(13);
  std::vector<std::vector<torch::Tensor>> parts(3);
  for (auto& part : parts) {
    for (const torch::Tensor& p : model.shapes()) part.push_back(torch::round(torch::randn(p.sizes()) * 1024) / 1024);
  }
  ExactGradients exact(model, 3, torch::kCPU);
  std::vector<torch::Tensor> got;
  for (int pass = 0; pass < 2 && got.empty(); ++pass) {
    exact.begin_pass(3);
    for (const auto& part : parts) model.push(part);
    if (exact.end_pass(*comm)) got = exact.reduce(*comm);
  }
  ASSERT_EQ(got.size(), 2u);
  std::vector<torch::Tensor> sums;
  for (size_t p = 0; p < 3; ++p) {
    torch::Tensor sum = torch::zeros({parts[0][p].numel()}, torch::kFloat64);
    for (const auto& part : parts) sum += part[p].reshape({-1}).to(torch::kFloat64);
    sums.push_back(sum.to(torch::kFloat32));
  }
  EXPECT_TRUE(torch::equal(got[0], torch::cat({sums[0], sums[2]})));  // decay: big, then small
  EXPECT_TRUE(torch::equal(got[1], sums[1]));                         // no decay: bias
  // Converted where the integers were: both groups in one buffer, no copy of the gradient.
  EXPECT_TRUE(got[0].storage().is_alias_of(got[1].storage()));
}

TEST(ExactGradients, NonFiniteContributionsAreReported) {
  TwoParameters model;
  const std::unique_ptr<Comm> comm = make_single_process_comm();
  ExactGradients exact(model, 2, torch::kCPU);
  exact.begin_pass(2);
  model.push(torch::ones({4, 8}), torch::ones({8}));
  torch::Tensor bad = torch::ones({8});
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  model.push(torch::ones({4, 8}), bad);
  EXPECT_TRUE(exact.end_pass(*comm));
  EXPECT_TRUE(exact.nonfinite());
}

TEST(ExactGradients, RestoredExponentsAreCheckedForCount) {
  TwoParameters model;
  ExactGradients exact(model, 2, torch::kCPU);
  EXPECT_THROW(exact.set_exponents({1, 2, 3}), std::invalid_argument);
  exact.set_exponents({40, -3});
  EXPECT_EQ(exact.exponents(), (std::vector<int64_t>{40, -3}));
}

// Reproducible mode's settings turn off what would change its bits (the
// gradient-accumulation fusion; the project's cuBLASLt GEMMs, whose
// algorithms are not its format's) and give them back when the run ends.
TEST(ReproducibleSettings, TurnOffFusionAndTheCublasLtGemmsAndRestoreThem) {
  const bool fusion = ops::gradient_fusion_enabled();
  ops::set_lt_gemms(true);
  {
    const ReproducibleSettings settings;
    EXPECT_FALSE(ops::lt_gemms_enabled());
    EXPECT_FALSE(ops::gradient_fusion_enabled());
  }
  EXPECT_TRUE(ops::lt_gemms_enabled());
  EXPECT_EQ(ops::gradient_fusion_enabled(), fusion);
  ops::set_lt_gemms(false);
}

}  // namespace
}  // namespace trainer
