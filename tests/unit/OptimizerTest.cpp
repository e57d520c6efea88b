// The optimizer plugins against independent implementations written here
// element by element in fp64 (Newton-Schulz with plain loops, Lion and
// Muon line by line), their element-wise parts against any cut of the
// elements into slices, and which parameters Muon takes whole.
#include <gtest/gtest.h>

#include <cmath>

#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "trainer/Optimizer.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/LowPrecisionState.h"
#include "trainer/sharding/OptimizerShards.h"
#include "unit/StubComm.h"

namespace trainer {
namespace {

std::unique_ptr<Optimizer> make(const std::string& name, const std::string& options = "") {
  static PluginRegistry registry = [] {
    PluginRegistry r;
    r.discover({TRAINER_PLUGIN_DIR});
    return r;
  }();
  const LoadedPlugin& plugin = registry.find(PluginKind::Optimizer, name);
  return PluginRegistry::create<Optimizer>(plugin, plugin_options(plugin, options), Context{});
}

using Matrix = std::vector<std::vector<double>>;

Matrix to_matrix(const torch::Tensor& t) {
  const torch::Tensor d = t.to(torch::kFloat64).contiguous();
  Matrix m(d.size(0), std::vector<double>(d.size(1)));
  for (int64_t i = 0; i < d.size(0); ++i) {
    for (int64_t j = 0; j < d.size(1); ++j) m[i][j] = d[i][j].item<double>();
  }
  return m;
}

Matrix multiply(const Matrix& a, const Matrix& b) {
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t k = 0; k < b.size(); ++k) {
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
    }
  }
  return c;
}

Matrix transpose(const Matrix& a) {
  Matrix t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  }
  return t;
}

// The quintic Newton-Schulz iteration of Muon (Jordan et al. 2024) in fp64:
// X = G / ||G||_F (on G^T for a tall G); five times A = X X^T,
// X = a X + (b A + c A A) X.
Matrix newton_schulz(Matrix x) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = x.size() > x[0].size();
  if (tall) x = transpose(x);
  double norm = 0;
  for (const auto& row : x) {
    for (double v : row) norm += v * v;
  }
  norm = std::max(std::sqrt(norm), 1e-7);
  for (auto& row : x) {
    for (double& v : row) v /= norm;
  }
  for (int step = 0; step < 5; ++step) {
    const Matrix gram = multiply(x, transpose(x));
    const Matrix square = multiply(gram, gram);
    Matrix poly = gram;
    for (size_t i = 0; i < gram.size(); ++i) {
      for (size_t j = 0; j < gram.size(); ++j) poly[i][j] = b * gram[i][j] + c * square[i][j];
    }
    const Matrix px = multiply(poly, x);
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t j = 0; j < x[0].size(); ++j) x[i][j] = a * x[i][j] + px[i][j];
    }
  }
  return tall ? transpose(x) : x;
}

double max_relative_error(const torch::Tensor& got, const Matrix& want) {
  double error = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[0].size(); ++j) {
      error = std::max(error, std::abs(got[i][j].item<double>() - want[i][j]));
      scale = std::max(scale, std::abs(want[i][j]));
    }
  }
  return error / scale;
}

ParameterInfo info(const std::string& name, std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return ParameterInfo{name, std::move(shape), true, 0, 0, numel};
}

TEST(Muon, NewtonSchulzMatchesAnFp64IterationWideAndTall) {
  torch::manual_seed(3);
  const std::unique_ptr<Optimizer> muon = make("muon");
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 24}, std::vector<int64_t>{24, 16}}) {
    const torch::Tensor g = torch::randn(shape, torch::kFloat64);
    const Matrix want = newton_schulz(to_matrix(g));
    // fp64 in, fp64 arithmetic: equal up to the order of the sums.
    EXPECT_LT(max_relative_error(muon->transform(info("w", shape), g, {}), want), 1e-12);
    // fp32 on the CPU: five iterations of fp32 products over 16-24 terms,
    // each ~1e-7 relative, amplified at most tenfold by the polynomial (its
    // derivative stays below 3.5 on [0, 1.2]): 1e-5 holds with room.
    const torch::Tensor out32 = muon->transform(info("w", shape), g.to(torch::kFloat32), {});
    EXPECT_EQ(out32.scalar_type(), torch::kFloat32);
    EXPECT_LT(max_relative_error(out32, want), 1e-5);
  }
}

// Stacks: every matrix of a stack against the fp64 iteration (fp64 and
// fp32, the bounds above), and a matrix's bits the same whatever its
// position and companions (a rank stacks whichever matrices it holds: the
// same matrix must get the same bits at every world size).
TEST(Muon, AStackedMatrixGetsItsOwnIterationAndTheSameBitsInAnyStack) {
  torch::manual_seed(5);
  const std::unique_ptr<Optimizer> muon = make("muon");
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{16, 24}, std::vector<int64_t>{24, 16}}) {
    const ParameterInfo p = info("w", shape);
    const int64_t k = muon->stack_size(p);
    ASSERT_EQ(k, 16) << "small matrices are stacked sixteen at a time";
    std::vector<int64_t> sizes{k};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    const torch::Tensor matrices = torch::randn(sizes, torch::kFloat64);
    const std::vector<ParameterInfo> infos(k, p);
    const torch::Tensor out64 = muon->transform_stack(infos, matrices, {});
    const torch::Tensor out32 = muon->transform_stack(infos, matrices.to(torch::kFloat32), {});
    ASSERT_EQ(out32.sizes(), matrices.sizes());
    ASSERT_EQ(out32.scalar_type(), torch::kFloat32);
    for (int64_t i = 0; i < k; ++i) {
      const Matrix want = newton_schulz(to_matrix(matrices[i]));
      EXPECT_LT(max_relative_error(out64[i], want), 1e-12) << i;
      EXPECT_LT(max_relative_error(out32[i], want), 1e-5) << i;
    }
    // Matrix 3 alone at the front (zeros after it), then at the back with other companions.
    const torch::Tensor alone = torch::zeros_like(matrices).to(torch::kFloat32);
    alone[0].copy_(matrices[3]);
    torch::Tensor others = torch::randn(sizes, torch::kFloat32);
    others[k - 1].copy_(matrices[3]);
    EXPECT_TRUE(torch::equal(muon->transform_stack({p}, alone, {})[0], out32[3]));
    EXPECT_TRUE(torch::equal(muon->transform_stack(infos, others, {})[k - 1], out32[3]));
    // The padding stays zero.
    EXPECT_EQ(muon->transform_stack({p}, alone, {}).narrow(0, 1, k - 1).abs().max().item<double>(), 0.0);
  }
  EXPECT_EQ(muon->stack_size(info("w", {4864, 896})), 4);
  EXPECT_EQ(muon->stack_size(info("w", {11008, 2048})), 1);
}

// Seven {24, 16} matrices (one stack), two {16, 24} ones and a norm's
// vector, fp64 from the current seed: the matrices are blocks' weights
// (decayed, Muon's), the vector is AdamW's.
std::vector<NamedParameter> seven_and_two_matrices_and_a_vector() {
  std::vector<NamedParameter> params;
  for (int i = 0; i < 9; ++i) {
    const std::vector<int64_t> shape = i % 4 == 3 ? std::vector<int64_t>{16, 24} : std::vector<int64_t>{24, 16};
    params.push_back({"model.layers." + std::to_string(i) + ".mlp.up_proj.weight",
                      torch::randn(shape, torch::kFloat64).requires_grad_(), true});
  }
  params.push_back({"model.norm.weight", torch::randn({16}, torch::kFloat64).requires_grad_(), false});
  return params;
}

// The strategies' building block with stacks: seven matrices of one shape
// (one stack of sixteen with nine zeros), two of another and a vector,
// updated through OptimizerShards, each against the same matrix put
// through prepare, transform and apply alone (fp64: 1e-12 covers the
// orders of the sums). A stack entry applied to the wrong matrix is off
// by O(1).
TEST(Muon, OptimizerShardsGiveEachStackedMatrixItsOwnUpdate) {
  torch::manual_seed(6);
  const std::unique_ptr<Optimizer> muon = make("muon", "weight_decay = 0.1\n");
  std::vector<NamedParameter> params = seven_and_two_matrices_and_a_vector();
  std::vector<torch::Tensor> initial;
  for (const NamedParameter& p : params) initial.push_back(p.tensor.detach().clone().reshape({-1}));
  std::vector<ParameterGroup> groups = flatten_parameters(params, torch::kCPU, 1, torch::kFloat64);
  OptimizerShards shards = OptimizerShards::viewing(*muon, groups, 0, 1);
  const UpdateArgs args{0.02, 0.5, 1};
  std::vector<torch::Tensor> gradients(params.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ParameterSlot& slot : groups[g].slots) {
      const torch::Tensor grad = torch::randn({slot.numel}, torch::kFloat64);
      shards.groups()[g].gradient.narrow(0, slot.offset, slot.numel).copy_(grad);
      gradients[slot.position] = grad;
    }
  }
  shards.update(args, nullptr);
  int checked = 0;
  for (const ParameterGroup& group : groups) {
    for (const ParameterSlot& slot : group.slots) {
      if (slot.position >= 9) continue;
      const ParameterInfo p = info(slot.name, slot.param.sizes().vec());
      torch::Tensor values = initial[slot.position].clone(), m = torch::zeros_like(values),
                    v = torch::zeros_like(values);
      UpdateSlice s{0, 0, true, values, gradients[slot.position].clone(), {m, v}, {}};
      torch::Tensor direction = torch::empty_like(values);
      muon->prepare(p, s, direction, args);
      muon->apply(p, s, muon->transform(p, direction.view(p.shape), args).reshape({-1}), args);
      const torch::Tensor got = group.values.narrow(0, slot.offset, slot.numel);
      EXPECT_LT(((got - values).abs().max() / (values - initial[slot.position]).abs().max()).item<double>(), 1e-10)
          << slot.name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

// ddp's ranks divide Muon's transforms: with a replica comm of two ranks,
// rank 1 transforms only the runs it owns (the second of the two runs here:
// the {16, 24} pair; the first is the stack of seven {24, 16} matrices) and
// takes the other from rank 0's broadcast. The stub comm's broadcast writes
// zeros, so rank 0's run arrives as a zero direction: its matrices then
// move by weight decay alone, while rank 1's own run gets the bits of the
// single-rank update, as does every element-wise parameter.
TEST(Muon, ReplicasDivideTheTransformsAndBroadcastEachFromItsOwner) {
  torch::manual_seed(7);
  const std::unique_ptr<Optimizer> muon = make("muon", "weight_decay = 0.1\n");
  std::vector<NamedParameter> params = seven_and_two_matrices_and_a_vector();
  const UpdateArgs args{0.02, 0.5, 1};
  // The same parameters and gradients into two sets of groups: alone, and as rank 1 of two replicas.
  auto updated = [&](Comm* replicas) {
    std::vector<NamedParameter> copy;
    for (const NamedParameter& p : params) copy.push_back({p.name, p.tensor.detach().clone(), p.decay});
    std::vector<ParameterGroup> groups = flatten_parameters(copy, torch::kCPU, 1, torch::kFloat64);
    OptimizerShards shards = OptimizerShards::viewing(*muon, groups, 0, 1);
    torch::manual_seed(8);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const ParameterSlot& slot : groups[g].slots) {
        shards.groups()[g]
            .gradient.narrow(0, slot.offset, slot.numel)
            .copy_(torch::randn({slot.numel}, torch::kFloat64));
      }
    }
    shards.update(args, nullptr, replicas);
    return groups;
  };
  testing::StubComm replicas(1, 2);
  replicas.on_broadcast = [](torch::Tensor& t, int root) {
    if (root != 1) t.zero_();
  };
  const std::vector<ParameterGroup> alone = updated(nullptr), divided = updated(&replicas);
  EXPECT_EQ(replicas.broadcast_roots, (std::vector<int>{0, 1}));
  int own = 0, broadcast = 0;
  for (size_t g = 0; g < alone.size(); ++g) {
    for (const ParameterSlot& slot : alone[g].slots) {
      const torch::Tensor want = alone[g].values.narrow(0, slot.offset, slot.numel);
      const torch::Tensor got = divided[g].values.narrow(0, slot.offset, slot.numel);
      const bool from_rank_0 = slot.position < 9 && slot.param.size(0) == 24;
      if (from_rank_0) {
        const torch::Tensor decayed = params[slot.position].tensor.detach().reshape({-1}) * (1.0 - 0.02 * 0.1);
        EXPECT_TRUE(torch::equal(got, decayed)) << slot.name;
        EXPECT_FALSE(torch::equal(got, want)) << slot.name;  // the zeros did arrive instead of a transform
        ++broadcast;
      } else {
        EXPECT_TRUE(torch::equal(got, want)) << slot.name;
        ++own;
      }
    }
  }
  EXPECT_EQ(broadcast, 7);
  EXPECT_EQ(own, 3);
}

// One matrix through prepare, transform and apply, three steps, fp64,
// against Muon written out here: m = lerp(m, g, 1 - mu); d = lerp(g, m, mu);
// W = W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) NS(d).
TEST(Muon, ThreeStepsOfAMatrixAreTheLineByLineUpdate) {
  torch::manual_seed(4);
  const double lr = 0.02, wd = 0.1, mu = 0.95;
  const std::unique_ptr<Optimizer> muon = make("muon", "weight_decay = 0.1\n");
  const ParameterInfo p = info("model.layers.0.mlp.up_proj.weight", {24, 16});
  ASSERT_TRUE(muon->whole_matrix(p));
  torch::Tensor values = torch::randn({24 * 16}, torch::kFloat64);
  torch::Tensor m = torch::zeros_like(values), v = torch::zeros_like(values);
  Matrix w = to_matrix(values.view({24, 16})), momentum(24, std::vector<double>(16, 0.0));
  for (int step = 1; step <= 3; ++step) {
    const torch::Tensor grad = torch::randn({24 * 16}, torch::kFloat64);
    const double clip = step == 2 ? 0.5 : 1.0;
    UpdateSlice s{0, 0, true, values, grad.clone(), {m, v}, {}};
    const UpdateArgs args{lr, clip, step};
    torch::Tensor direction = torch::empty_like(values);
    muon->prepare(p, s, direction, args);
    const torch::Tensor out = muon->transform(p, direction.view({24, 16}), args);
    muon->apply(p, s, out.reshape({-1}), args);

    const Matrix g = to_matrix(grad.view({24, 16}));
    Matrix d = g;
    for (size_t i = 0; i < 24; ++i) {
      for (size_t j = 0; j < 16; ++j) {
        const double gi = g[i][j] * clip;
        momentum[i][j] = mu * momentum[i][j] + (1 - mu) * gi;
        d[i][j] = (1 - mu) * gi + mu * momentum[i][j];
      }
    }
    const Matrix o = newton_schulz(d);
    for (size_t i = 0; i < 24; ++i) {
      for (size_t j = 0; j < 16; ++j) w[i][j] = w[i][j] * (1 - lr * wd) - lr * 0.2 * std::sqrt(24.0) * o[i][j];
    }
    EXPECT_LT(max_relative_error(values.view({24, 16}), w), 1e-12) << "step " << step;
  }
  EXPECT_EQ(v.abs().max().item<double>(), 0.0) << "a matrix's exp_avg_sq stays zero";
}

TEST(Muon, TakesTheBlocksMatricesAndLeavesTheRestToAdamW) {
  const std::unique_ptr<Optimizer> muon = make("muon");
  EXPECT_TRUE(muon->whole_matrix(info("model.layers.3.self_attn.q_proj.weight", {64, 64})));
  EXPECT_TRUE(muon->whole_matrix(info("model.layers.0.mlp.down_proj.weight", {64, 128})));
  EXPECT_FALSE(muon->whole_matrix(info("model.embed_tokens.weight", {100, 64})));
  EXPECT_FALSE(muon->whole_matrix(info("lm_head.weight", {100, 64})));
  EXPECT_FALSE(muon->whole_matrix(info("model.layers.0.self_attn.q_proj.bias", {64})));
  EXPECT_FALSE(muon->whole_matrix(info("model.norm.weight", {64})));
  const std::unique_ptr<Optimizer> all = make("muon", "adamw_params = ''\n");
  EXPECT_TRUE(all->whole_matrix(info("lm_head.weight", {100, 64})));
}

// Lion, three steps on 1000 elements in fp64, against the update written out:
// c = b1 m + (1 - b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g.
TEST(Lion, ThreeStepsAreTheLineByLineUpdate) {
  torch::manual_seed(5);
  const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.99;
  const std::unique_ptr<Optimizer> lion = make("lion", "weight_decay = 0.1\n");
  for (const bool decay : {true, false}) {
    torch::Tensor values = torch::randn({1000}, torch::kFloat64), m = torch::zeros_like(values);
    std::vector<double> p(values.data_ptr<double>(), values.data_ptr<double>() + 1000), mm(1000, 0.0);
    for (int step = 1; step <= 3; ++step) {
      const torch::Tensor grad = torch::randn({1000}, torch::kFloat64);
      UpdateSlice s{0, 0, decay, values, grad.clone(), {m}, {}};
      lion->update(s, UpdateArgs{lr, 0.5, step});
      for (size_t i = 0; i < 1000; ++i) {
        const double g = grad[i].item<double>() * 0.5;
        const double c = b1 * mm[i] + (1 - b1) * g;
        p[i] = p[i] * (decay ? 1 - lr * wd : 1.0) - lr * ((c > 0) - (c < 0));
        mm[i] = b2 * mm[i] + (1 - b2) * g;
      }
      for (size_t i = 0; i < 1000; ++i) {
        ASSERT_NEAR(values[i].item<double>(), p[i], 1e-15) << "element " << i << " step " << step;
        ASSERT_NEAR(m[i].item<double>(), mm[i], 1e-15) << "element " << i << " step " << step;
      }
    }
  }
}

// Sharded strategies hand an optimizer runs of elements cut wherever the
// world size puts the shard bounds: element-wise parts must give the same
// bits whatever the cut (fp32 on the CPU, cut at odd places).
TEST(Optimizers, ElementWisePartsGiveTheSameBitsForAnyCut) {
  torch::manual_seed(6);
  const int64_t n = 70001;
  for (const char* name : {"adamw", "lion", "muon"}) {
    const std::unique_ptr<Optimizer> opt = make(name, "weight_decay = 0.1\n");
    const size_t states = opt->state_names().size();
    const torch::Tensor start = torch::randn({n});
    const auto run = [&](std::vector<int64_t> cuts) {
      torch::Tensor values = start.clone();
      std::vector<torch::Tensor> state;
      for (size_t k = 0; k < states; ++k) state.push_back(torch::zeros({n}));
      torch::Tensor direction = torch::zeros({n});
      torch::manual_seed(7);
      for (int step = 1; step <= 3; ++step) {
        const torch::Tensor grad = torch::randn({n});
        cuts.push_back(n);
        int64_t from = 0;
        for (const int64_t to : cuts) {
          std::vector<torch::Tensor> part;
          for (const torch::Tensor& t : state) part.push_back(t.narrow(0, from, to - from));
          UpdateSlice s{0,    from, true, values.narrow(0, from, to - from), grad.narrow(0, from, to - from).clone(),
                        part, {}};
          const UpdateArgs args{1e-2, 0.7, step};
          opt->update(s, args);
          if (std::string(name) == "muon") {
            const ParameterInfo p = info("w", {n});
            opt->prepare(p, s, direction.narrow(0, from, to - from), args);
            opt->apply(p, s, direction.narrow(0, from, to - from), args);
          }
          from = to;
        }
        cuts.pop_back();
      }
      return values;
    };
    const torch::Tensor whole = run({});
    EXPECT_TRUE(torch::equal(whole, run({1, 4097, 33333}))) << name;
    EXPECT_TRUE(torch::equal(whole, run({17, 65536}))) << name;
  }
}

// Stochastic rounding to bf16: exact values stay, others land on one of
// their two bf16 neighbours with the probability that keeps the mean (the
// test counts it over 2^17 elements: 4 standard deviations), and the bits
// depend only on (stream, element index), not on where a call starts.
TEST(LowPrecisionState, StochasticRoundingIsUnbiasedExactAndCutIndependent) {
  const int64_t n = int64_t(1) << 17;
  // 1 + 2^-10: between the bf16 neighbours 1 and 1 + 2^-7, 1/8 of the way up.
  for (const double x : {1.0 + std::ldexp(1.0, -10), -(1.0 + 3 * std::ldexp(1.0, -10)), 3e-30}) {
    const torch::Tensor src = torch::full({n}, x, torch::kFloat32);
    torch::Tensor dst = torch::empty({n}, torch::kBFloat16);
    stochastic_round(dst, src, 12345, 777);
    const torch::Tensor wide = dst.to(torch::kFloat64);
    const double xf = src[0].item<double>();
    // bf16 keeps 8 significant bits: neighbours 2^(e - 7) apart.
    const double gap = std::ldexp(1.0, std::ilogb(std::abs(xf)) - 7);
    const double p_up = (std::abs(xf) - std::floor(std::abs(xf) / gap) * gap) / gap;
    const double mean = wide.mean().item<double>();
    const double sigma = gap * std::sqrt(p_up * (1 - p_up) / static_cast<double>(n));
    EXPECT_NEAR(mean, xf, 4 * sigma + 1e-300) << x;
    // Only the two neighbours occur.
    const torch::Tensor magnitude = wide.abs();
    const double floor_value = std::floor(std::abs(xf) / gap) * gap;
    EXPECT_TRUE(((magnitude == floor_value) | (magnitude == floor_value + gap)).all().item<bool>()) << x;
    // The same elements from another start and in two calls: the same bits.
    torch::Tensor parts = torch::empty({n}, torch::kBFloat16);
    stochastic_round(parts.narrow(0, 0, 1000), src.narrow(0, 0, 1000), 12345, 777);
    stochastic_round(parts.narrow(0, 1000, n - 1000), src.narrow(0, 1000, n - 1000), 12345, 1777);
    EXPECT_TRUE(torch::equal(parts, dst)) << x;
    torch::Tensor other = torch::empty({n}, torch::kBFloat16);
    stochastic_round(other, src, 54321, 777);
    EXPECT_FALSE(torch::equal(other, dst)) << "another stream draws other bits";
  }
  // Values a bf16 holds exactly never move.
  const torch::Tensor exact = torch::randn({4096}).to(torch::kBFloat16).to(torch::kFloat32);
  torch::Tensor out = torch::empty({4096}, torch::kBFloat16);
  stochastic_round(out, exact, 9, 0);
  EXPECT_TRUE(torch::equal(out.to(torch::kFloat32), exact));
}

// AdamW with bf16 moments: the update reads them widened and writes them
// back rounded stochastically; element-wise, so any cut gives the same
// bits, and two runs give the same bits. Over 200 steps of a fixed gradient
// the moments stay within bf16's resolution of fp32 state's.
TEST(LowPrecisionState, Bf16MomentsRepeatBitForBitAndTrackFp32) {
  torch::manual_seed(8);
  const int64_t n = 5000;
  const std::unique_ptr<Optimizer> fp32 = make("adamw");
  const std::unique_ptr<Optimizer> bf16 = make("adamw", "state_dtype = 'bf16'\n");
  ASSERT_EQ(bf16->state_dtype(), torch::kBFloat16);
  const torch::Tensor start = torch::randn({n}), grad = torch::randn({n});
  const auto run = [&](Optimizer& opt, std::vector<int64_t> cuts, torch::Dtype dtype) {
    torch::Tensor values = start.clone();
    std::vector<torch::Tensor> state = {torch::zeros({n}, dtype), torch::zeros({n}, dtype)};
    cuts.push_back(n);
    for (int step = 1; step <= 200; ++step) {
      int64_t from = 0;
      for (const int64_t to : cuts) {
        UpdateSlice s{0,
                      from,
                      true,
                      values.narrow(0, from, to - from),
                      grad.narrow(0, from, to - from).clone(),
                      {state[0].narrow(0, from, to - from), state[1].narrow(0, from, to - from)},
                      {}};
        opt.update(s, UpdateArgs{1e-3, 1.0, step});
        from = to;
      }
    }
    return std::make_pair(values, state[0].to(torch::kFloat32));
  };
  const auto [wide_values, wide_m] = run(*fp32, {}, torch::kFloat32);
  const auto [a, a_m] = run(*bf16, {}, torch::kBFloat16);
  const auto [b, b_m] = run(*bf16, {77, 3001}, torch::kBFloat16);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(a_m, b_m));
  // m converges to g: bf16 (8 bits) rounding leaves it within 2^-7 relative.
  EXPECT_LT(((a_m - wide_m).abs() / wide_m.abs().clamp_min(1e-6)).max().item<double>(), std::ldexp(1.0, -7));
  // The weights move as with fp32 moments, to bf16's resolution of the step.
  const double moved = (wide_values - start).norm().item<double>();
  EXPECT_LT((a - wide_values).norm().item<double>(), 1e-2 * moved);
}

}  // namespace
}  // namespace trainer
