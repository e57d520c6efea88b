// AdamW on flat buffers against an independent element-by-element fp64
// implementation of the torch.optim.AdamW update rule.
#include "trainer/sharding/AdamW.h"

#include <gtest/gtest.h>

#include <cmath>

#include "unit/StubComm.h"

namespace trainer {
namespace {

struct Reference {
  std::vector<double> p, m, v;
};

void reference_step(Reference& r, const std::vector<double>& g, const AdamWConfig& c, bool decay, double lr, int t) {
  for (size_t i = 0; i < r.p.size(); ++i) {
    if (decay) r.p[i] *= 1.0 - lr * c.weight_decay;
    r.m[i] = c.beta1 * r.m[i] + (1.0 - c.beta1) * g[i];
    r.v[i] = c.beta2 * r.v[i] + (1.0 - c.beta2) * g[i] * g[i];
    const double m_hat = r.m[i] / (1.0 - std::pow(c.beta1, t));
    const double v_hat = r.v[i] / (1.0 - std::pow(c.beta2, t));
    r.p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
  }
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const torch::Tensor d = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void check_against_reference(bool decay) {
  torch::manual_seed(0);
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  torch::Tensor params = torch::randn({257});
  AdamWState state = adamw_init(params);
  Reference ref{to_vector(params), std::vector<double>(257, 0.0), std::vector<double>(257, 0.0)};
  for (int t = 1; t <= 5; ++t) {
    const torch::Tensor grads = torch::randn({257});
    const double lr = 0.01 * t;
    adamw_update(params, grads, state, config, decay, lr, t);
    reference_step(ref, to_vector(grads), config, decay, lr, t);
  }
  const std::vector<double> got = to_vector(params);
  for (size_t i = 0; i < got.size(); ++i) {
    // fp32 keeps ~7 digits; five steps of a handful of rounded ops each stay
    // within a few ulps of parameters of size ~1.
    ASSERT_NEAR(got[i], ref.p[i], 2e-6 * (1.0 + std::abs(ref.p[i]))) << "element " << i;
  }
}

TEST(AdamW, MatchesTheFp64ReferenceWithDecay) { check_against_reference(true); }
TEST(AdamW, MatchesTheFp64ReferenceWithoutDecay) { check_against_reference(false); }

TEST(AdamW, DecayOnlyWhereAsked) {
  const AdamWConfig config{0.9, 0.999, 1e-8, 0.5};
  torch::Tensor with = torch::ones({4}), without = torch::ones({4});
  AdamWState s1 = adamw_init(with), s2 = adamw_init(without);
  const torch::Tensor zero_grads = torch::zeros({4});
  adamw_update(with, zero_grads, s1, config, true, 0.1, 1);
  adamw_update(without, zero_grads, s2, config, false, 0.1, 1);
  EXPECT_FLOAT_EQ(with[0].item<float>(), 0.95f);
  EXPECT_FLOAT_EQ(without[0].item<float>(), 1.0f);
}

TEST(GradientNorm, SquaredNormAndClipCoefficient) {
  const torch::Tensor flat = torch::tensor({3.0f, 4.0f});
  EXPECT_DOUBLE_EQ(squared_norm(flat), 25.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 0.0), 1.0);
}

// total_norm: the buffers' squared_norm results added in order, as a host
// loop adds them (bit for bit: the same fp64 additions), over buffers with
// whole chunks of 2^16 and tails, one of them empty; none gives 0.
TEST(GradientNorm, TotalNormIsTheHostSumOfSquaredNorms) {
  torch::manual_seed(17);
  const std::vector<torch::Tensor> flats = {torch::randn({(int64_t(1) << 17) + 5}) * 3, torch::randn({7}),
                                            torch::zeros({0}), torch::randn({70000}) * 1e-3};
  double squares = 0.0;
  for (const torch::Tensor& f : flats) squares += squared_norm(f);
  EXPECT_EQ(total_norm(flats), std::sqrt(squares));
  const double wide = flats[0].to(torch::kFloat64).square().sum().item<double>() +
                      flats[1].to(torch::kFloat64).square().sum().item<double>() +
                      flats[3].to(torch::kFloat64).square().sum().item<double>();
  // fp32 chunk sums: relative error ~1e-7 against an fp64 sum of squares.
  EXPECT_NEAR(total_norm(flats), std::sqrt(wide), 1e-6 * std::sqrt(wide));
  EXPECT_EQ(total_norm({}), 0.0);
}

// sharded_norm is collective: a rank that owns nothing must still take part.
// Without a device it cannot, and says so instead of returning alone (which
// left the other ranks waiting in their all-reduce).
TEST(AdamW, ShardedNormOnARankThatOwnsNothingTakesPart) {
  // The other rank's squares: 9.
  testing::StubComm comm(1, 2, [](torch::Tensor& t) { t.fill_(9.0); });
  EXPECT_DOUBLE_EQ(sharded_norm({}, comm, torch::kCPU), 3.0);
  EXPECT_EQ(comm.all_reduces, 1);
  EXPECT_THROW(sharded_norm({}, comm), std::logic_error);
  EXPECT_EQ(comm.all_reduces, 1);
}

}  // namespace
}  // namespace trainer
