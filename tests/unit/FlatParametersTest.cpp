// Flat parameter buffers: parameters become views, autograd accumulates into
// the flat gradient buffer (adds, never overwrites), shards tile the buffer.
#include "trainer/sharding/FlatParameters.h"

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "TestSupport.h"
#include "kit/Reference.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "trainer/Strategy.h"
#include "unit/StubComm.h"

namespace trainer {
namespace {

std::vector<NamedParameter> two_parameters() {
  torch::Tensor w = torch::arange(6, torch::kFloat32).view({2, 3}).set_requires_grad(true);
  torch::Tensor b = torch::tensor({10.0f, 20.0f, 30.0f}).set_requires_grad(true);
  return {{"w", w, true}, {"b", b, false}};
}

TEST(FlatParameters, ParametersBecomeViewsOfTheirGroup) {
  std::vector<NamedParameter> params = two_parameters();
  std::vector<ParameterGroup> groups = flatten_parameters(params, torch::kCPU, 4);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(groups[0].decay);
  EXPECT_EQ(groups[0].numel, 6);
  EXPECT_EQ(groups[0].padded_numel, 8);
  EXPECT_EQ(groups[1].padded_numel, 4);
  EXPECT_EQ(groups[0].values[6].item<float>(), 0.0f);  // padding is zero
  EXPECT_EQ(params[0].tensor[1][2].item<float>(), 5.0f);
  groups[0].values.narrow(0, 0, 6).mul_(2);
  EXPECT_EQ(params[0].tensor[1][2].item<float>(), 10.0f);  // the model's tensor sees the flat buffer
  EXPECT_TRUE(params[0].tensor.requires_grad());
}

TEST(FlatParameters, BackwardAccumulatesIntoTheFlatGradientBuffer) {
  std::vector<NamedParameter> params = two_parameters();
  std::vector<ParameterGroup> groups = flatten_parameters(params, torch::kCPU, 1);
  std::vector<torch::Tensor> grads;
  for (ParameterGroup& group : groups) {
    grads.push_back(torch::zeros_like(group.values));
    bind_gradients(group, grads.back());
  }
  const torch::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f});
  auto loss = [&] { return (torch::matmul(params[0].tensor, x) * params[1].tensor.narrow(0, 0, 2)).sum(); };
  loss().backward();
  const torch::Tensor once_w = grads[0].clone(), once_b = grads[1].clone();
  loss().backward();
  EXPECT_TRUE(torch::equal(grads[0], 2 * once_w));
  EXPECT_TRUE(torch::equal(grads[1], 2 * once_b));
  EXPECT_TRUE(params[0].tensor.grad().is_alias_of(grads[0]));
  // d/dw of sum_i b_i (w x)_i = b_i x_j: row 0 is 10 * x.
  EXPECT_EQ(once_w[2].item<float>(), 30.0f);
}

TEST(Shard, ShardsTileTheBuffer) {
  EXPECT_EQ(shard_of(12, 2, 4).offset, 6);
  EXPECT_EQ(shard_of(12, 2, 4).numel, 3);
  EXPECT_THROW(shard_of(10, 0, 4), std::logic_error);
}

// Every strategy, at every world size 1..8 and every rank: each non-empty
// state slice starts on a multiple of kShardAlignment elements of its flat group, so the
// fused kernels' vector loads and NCCL's buffers are aligned.
TEST(FlatParameters, EveryStrategysShardsStartOn64ElementBoundaries) {
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  const LoadedPlugin& adamw = registry.find(PluginKind::Optimizer, "adamw");
  const std::unique_ptr<Optimizer> optimizer =
      PluginRegistry::create<Optimizer>(adamw, plugin_options(adamw, ""), Context{});
  for (const std::string& name : kStrategies) {
    const LoadedPlugin& plugin = registry.find(PluginKind::Strategy, name);
    for (int world = 1; world <= 8; ++world) {
      for (int rank = 0; rank < world; ++rank) {
        testing::StubComm comm(rank, world);
        std::unique_ptr<Model> model = kit::make_model(registry);
        Context context;
        context.rank = rank;
        context.world_size = world;
        std::unique_ptr<Strategy> strategy =
            PluginRegistry::create<Strategy>(plugin, plugin_options(plugin, ""), context);
        strategy->setup(*model, comm, StrategyEnv{torch::kCPU, optimizer.get()});
        const std::vector<StateSlice> slices = strategy->state_slices();
        EXPECT_FALSE(slices.empty()) << fmt::format("{} rank {} of {}", name, rank, world);
        for (const StateSlice& slice : slices) {
          if (slice.values.numel() == 0) continue;  // a shard wholly in the padding: nothing starts there
          EXPECT_EQ(slice.offset % kShardAlignment, 0) << fmt::format(
              "{} rank {} of {}: a slice of group {} starts at {}", name, rank, world, slice.group, slice.offset);
        }
      }
    }
  }
}

TEST(FlatParameters, ShardsOfTheShardPaddingAreAligned) {
  for (int world = 1; world <= 8; ++world) {
    for (const int64_t numel : {1, 63, 64, 1000, 82496}) {
      const int64_t pad = shard_padding(world);
      const int64_t padded = (numel + pad - 1) / pad * pad;
      for (int rank = 0; rank < world; ++rank) EXPECT_EQ(shard_of(padded, rank, world).offset % kShardAlignment, 0);
    }
  }
}

// Four parameters in two groups: decay [w1 (6), w2 (4)], no decay [b1 (3), b2 (2)].
std::vector<NamedParameter> four_parameters() {
  return {{"w1", torch::zeros({2, 3}), true},
          {"b1", torch::zeros({3}), false},
          {"w2", torch::zeros({4}), true},
          {"b2", torch::zeros({2}), false}};
}

std::string spans_text(const std::vector<std::vector<UnitSpan>>& spans) {
  std::string out;
  for (const std::vector<UnitSpan>& unit : spans) {
    out += "|";
    for (const UnitSpan& span : unit) {
      out += fmt::format(" g{}[{},{})", span.group, span.begin, span.end);
      for (const ParameterSlot* slot : span.slots) out += " " + slot->name;
    }
  }
  return out;
}

std::string unit_spans_error(const std::vector<ParameterUnit>& units, const std::vector<ParameterGroup>& groups) {
  try {
    unit_spans(units, groups);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FlatParameters, UnitSpansJoinAdjacentParametersAndCoverEachOnce) {
  std::vector<NamedParameter> params = four_parameters();
  const std::vector<ParameterGroup> groups = flatten_parameters(params, torch::kCPU, 1);
  // Offsets worked out by hand from the sizes above.
  EXPECT_EQ(spans_text(unit_spans({{"a", {0, 1}}, {"b", {2, 3}}}, groups)),
            "| g0[0,6) w1 g1[0,3) b1| g0[6,10) w2 g1[3,5) b2");
  EXPECT_EQ(spans_text(unit_spans({{"all", {0, 1, 2, 3}}}, groups)), "| g0[0,10) w1 w2 g1[0,5) b1 b2");
  // w1 and w2 meet in the layout (b1 lies in the other group): one span.
  EXPECT_EQ(spans_text(unit_spans({{"w", {0, 2}}, {"b", {1, 3}}}, groups)), "| g0[0,10) w1 w2| g1[0,5) b1 b2");
  // Three decay parameters, the middle one in another unit: two spans in one group.
  std::vector<NamedParameter> three = {
      {"x", torch::zeros({2}), true}, {"y", torch::zeros({3}), true}, {"z", torch::zeros({4}), true}};
  const std::vector<ParameterGroup> one_group = flatten_parameters(three, torch::kCPU, 1);
  EXPECT_EQ(spans_text(unit_spans({{"outer", {0, 2}}, {"inner", {1}}}, one_group)), "| g0[0,2) x g0[5,9) z| g0[2,5) y");

  EXPECT_EQ(unit_spans_error({{"a", {0, 1}}, {"b", {1, 2, 3}}}, groups),
            "parameter 'b1' lies in 2 of the model's units, expected exactly one");
  EXPECT_EQ(unit_spans_error({{"a", {0, 1, 2}}}, groups),
            "parameter 'b2' lies in 0 of the model's units, expected exactly one");
  EXPECT_EQ(unit_spans_error({{"a", {0, 1}}, {"b", {2, 3, 7}}}, groups),
            "unit 'b' names parameter 7, which the model does not have");
}

}  // namespace
}  // namespace trainer
