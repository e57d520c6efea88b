// The model side of the accumulation contract, on the qwen2 plugin: forward
// returns a loss *sum* (additive over samples, gradients too) and the target
// count, and runs in fp64 for references.
#include <gtest/gtest.h>

#include "TestSupport.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "trainer/Model.h"

namespace trainer {
namespace {

class ModelContract : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.discover({TRAINER_PLUGIN_DIR});
    // One directory per test: ctest runs them in parallel.
    const std::string dir = testing::scratch_dir(std::string("ModelContract_") +
                                                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string file =
        testing::write_file(dir + "/recipe.toml",
                            "[model]\nname = 'qwen2'\nvocab_size = 32\nhidden_size = 16\nintermediate_size = 24\n"
                            "num_attention_heads = 4\nnum_key_value_heads = 2\n[dataset]\nname = 'synthetic'\n");
    const Recipe recipe = load_recipe(file, {}, registry_);
    Context context;
    context.seed = 5;
    model_ = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
    torch::manual_seed(1);
    ids_ = torch::randint(0, 32, {3, 10}, torch::kInt64);
    labels_ = torch::randint(0, 32, {3, 10}, torch::kInt64);
    labels_.masked_fill_(torch::rand({3, 10}) < 0.5, kIgnoreIndex);
  }

  Batch batch(int64_t row_begin, int64_t rows) const {
    Batch b;
    b.input_ids = ids_.narrow(0, row_begin, rows);
    b.labels = labels_.narrow(0, row_begin, rows);
    b.target_tokens = (b.labels != kIgnoreIndex).sum().item<int64_t>();
    return b;
  }

  std::vector<torch::Tensor> gradients(const Batch& b) {
    std::vector<torch::Tensor> params;
    for (const NamedParameter& p : model_->parameters()) params.push_back(p.tensor);
    return torch::autograd::grad({model_->forward(b).loss_sum}, params);
  }

  PluginRegistry registry_;
  std::unique_ptr<Model> model_;
  torch::Tensor ids_, labels_;
};

TEST_F(ModelContract, LossIsASumOverSamplesNotAMean) {
  const LossSum all = model_->forward(batch(0, 3));
  const LossSum first = model_->forward(batch(0, 1));
  const LossSum rest = model_->forward(batch(1, 2));
  EXPECT_EQ(all.target_tokens, batch(0, 3).target_tokens);
  // fp32 sums of ~15 token losses of size ~3.5: a few ulps of 50.
  EXPECT_NEAR(all.loss_sum.item<double>(), first.loss_sum.item<double>() + rest.loss_sum.item<double>(), 1e-4);
  EXPECT_EQ(all.loss_sum.scalar_type(), torch::kFloat32);
}

TEST_F(ModelContract, GradientsAddOverSamples) {
  const std::vector<torch::Tensor> all = gradients(batch(0, 3));
  const std::vector<torch::Tensor> first = gradients(batch(0, 1));
  const std::vector<torch::Tensor> rest = gradients(batch(1, 2));
  for (size_t i = 0; i < all.size(); ++i) {
    const double error = (all[i] - first[i] - rest[i]).norm().item<double>();
    EXPECT_LE(error, 1e-5 * (1.0 + all[i].norm().item<double>())) << model_->parameters()[i].name;
  }
}

TEST_F(ModelContract, NamesFollowHuggingFace) {
  const std::vector<NamedParameter> params = model_->parameters();
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(params[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(params[2].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_FALSE(params[2].decay);
}

TEST_F(ModelContract, RunsInFp64ForReferences) {
  const double fp32 = model_->forward(batch(0, 3)).loss_sum.item<double>();
  for (NamedParameter& p : model_->parameters()) p.tensor.set_data(p.tensor.to(torch::kFloat64));
  const LossSum wide = model_->forward(batch(0, 3));
  EXPECT_EQ(wide.loss_sum.scalar_type(), torch::kFloat64);
  EXPECT_NEAR(wide.loss_sum.item<double>(), fp32, 1e-5 * fp32);  // fp32 rounding of the same arithmetic
}

}  // namespace
}  // namespace trainer
