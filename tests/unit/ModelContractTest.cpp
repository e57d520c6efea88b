// The model side of the accumulation contract, on the qwen2 plugin: forward
// returns a loss *sum* (additive over samples, gradients too) and the target
// count, and runs in fp64 for references.
#include <gtest/gtest.h>

#include "TestSupport.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "run/Collate.h"
#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Model.h"
#include "trainer/util/Packing.h"

namespace trainer {
namespace {

class ModelContract : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.discover({TRAINER_PLUGIN_DIR});
    model_ = make_model("");
    torch::manual_seed(1);
    ids_ = torch::randint(0, 32, {3, 10}, torch::kInt64);
    labels_ = torch::randint(0, 32, {3, 10}, torch::kInt64);
    labels_.masked_fill_(torch::rand({3, 10}) < 0.5, kIgnoreIndex);
  }

  // The test's model, with `extra` lines in [model]; the same seed, so the same weights.
  std::unique_ptr<Model> make_model(const std::string& extra) {
    // One directory per test: ctest runs them in parallel.
    const std::string dir = testing::scratch_dir(std::string("ModelContract_") +
                                                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string file =
        testing::write_file(dir + "/recipe.toml",
                            "[model]\nname = 'qwen2'\nvocab_size = 32\nhidden_size = 16\nintermediate_size = 24\n"
                            "num_attention_heads = 4\nnum_key_value_heads = 2\n" +
                                extra + "[dataset]\nname = 'synthetic'\n");
    const Recipe recipe = load_recipe(file, {}, registry_);
    Context context;
    context.seed = 5;
    return PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  }

  Batch batch(int64_t row_begin, int64_t rows) const {
    Batch b;
    b.input_ids = ids_.narrow(0, row_begin, rows);
    b.labels = labels_.narrow(0, row_begin, rows);
    b.target_tokens = (b.labels != kIgnoreIndex).sum().item<int64_t>();
    return b;
  }

  std::vector<torch::Tensor> gradients(const Batch& b) { return gradients_of(*model_, b); }

  // The loss sum, then the gradient of every parameter: through backward()
  // into .grad (activation checkpointing's recomputation reaches the
  // parameters only that way), cleared before.
  static std::vector<torch::Tensor> gradients_of(Model& model, const Batch& b) {
    std::vector<NamedParameter> params = model.parameters();
    for (NamedParameter& p : params) p.tensor.mutable_grad() = torch::Tensor();
    const torch::Tensor loss = model.forward(b).loss_sum;
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach()};
    for (const NamedParameter& p : params) {
      out.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : torch::zeros_like(p.tensor));
    }
    return out;
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
  for (size_t i = 1; i < all.size(); ++i) {  // [0] is the loss
    const double error = (all[i] - first[i] - rest[i]).norm().item<double>();
    EXPECT_LE(error, 1e-5 * (1.0 + all[i].norm().item<double>())) << model_->parameters()[i - 1].name;
  }
}

// What backward recomputes changes memory, never a result: the loss and
// every gradient bit for bit under each activation_checkpointing mode (the
// same kernels run on the same inputs, only when differs). On two rows with
// different target counts, so a gradient that skipped a recomputed piece
// (a norm's weight, SwiGLU) would differ.
TEST_F(ModelContract, CheckpointingModesGiveTheSameBits) {
  const Batch b = batch(0, 3);
  std::vector<std::vector<torch::Tensor>> results;
  for (const char* mode : {"none", "no_recompute", "full"}) {
    std::unique_ptr<Model> model = make_model(std::string("activation_checkpointing = '") + mode + "'\n");
    results.push_back(gradients_of(*model, b));
  }
  const std::vector<NamedParameter> params = model_->parameters();
  for (size_t mode = 1; mode < results.size(); ++mode) {
    ASSERT_EQ(results[mode].size(), results[0].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(results[mode][i], results[0][i]))
          << "mode " << mode << ": " << (i == 0 ? std::string("loss") : params[i - 1].name) << " "
          << (results[mode][i] - results[0][i]).abs().max().item<double>();
    }
  }
  // The test's own model is 'none' by default: the same bits again.
  const std::vector<torch::Tensor> default_mode = gradients(b);
  for (size_t i = 0; i < default_mode.size(); ++i) EXPECT_TRUE(torch::equal(default_mode[i], results[0][i]));
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

// Fixed samples for collate: packed windows or single documents.
class ListDataset final : public Dataset {
 public:
  ListDataset(std::vector<Sample> samples, int64_t seq_len, bool packs)
      : samples_(std::move(samples)), seq_len_(seq_len), packs_(packs) {}
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Sample get(int64_t index) const override { return samples_.at(static_cast<size_t>(index)); }
  int64_t seq_len() const override { return seq_len_; }
  int64_t vocab_size() const override { return 32; }
  bool packs_documents() const override { return packs_; }

 private:
  std::vector<Sample> samples_;
  int64_t seq_len_;
  bool packs_;
};

std::vector<int64_t> indices(int64_t count) {
  std::vector<int64_t> all(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) all[static_cast<size_t>(i)] = i;
  return all;
}

// Written out by hand: a window of a 3-token and a 4-token document, seq_len
// 8. Inputs are tokens 0..5; positions restart at the second document; the
// padding (inputs 6, 7) is a document of its own; token 3 (the second
// document's first) is predicted by nothing.
TEST(Collate, APackedWindowCarriesPositionsDocumentsAndNoCrossingLabel) {
  Sample window;
  window.tokens = {1, 2, 3, 11, 12, 13, 14};
  window.target = {0, 1, 1, 1, 1, 1, 1};  // the dataset flags token 3: collate must not follow it
  window.document_starts = {0, 3};
  const MicroBatch micro = collate(ListDataset({window}, 8, true), "list", {0}, torch::kCPU);
  const auto row = [](const torch::Tensor& t) {
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  EXPECT_EQ(row(micro.batch.input_ids), (std::vector<int64_t>{1, 2, 3, 11, 12, 13, 0, 0}));
  EXPECT_EQ(row(micro.batch.labels),
            (std::vector<int64_t>{2, 3, kIgnoreIndex, 12, 13, 14, kIgnoreIndex, kIgnoreIndex}));
  EXPECT_EQ(row(micro.batch.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
  EXPECT_EQ(row(micro.batch.document_ids), (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2, 2}));
  // The same documents as a variable-length kernel takes them.
  ASSERT_EQ(micro.batch.document_offsets.scalar_type(), torch::kInt32);
  EXPECT_EQ(row(micro.batch.document_offsets.to(torch::kInt64)), (std::vector<int64_t>{0, 3, 6, 8}));
  EXPECT_EQ(micro.batch.longest_document, 3);
  EXPECT_EQ(micro.batch.target_tokens, 5);
  EXPECT_EQ(micro.input_tokens, 6);
  EXPECT_EQ(micro.documents, 2);

  // An unpacking dataset's batches carry neither; a packed sample from it,
  // or starts out of order or range, is refused naming the sample.
  EXPECT_THROW(collate(ListDataset({window}, 8, false), "list", {0}, torch::kCPU), InputError);
  Sample plain = window;
  plain.document_starts.clear();
  EXPECT_FALSE(collate(ListDataset({plain}, 8, false), "list", {0}, torch::kCPU).batch.position_ids.defined());
  for (const std::vector<int64_t>& starts : std::vector<std::vector<int64_t>>{{1, 3}, {0, 3, 3}, {0, 7}, {0, 4, 2}}) {
    Sample bad = window;
    bad.document_starts = starts;
    try {
      collate(ListDataset({bad}, 8, true), "list", {0}, torch::kCPU);
      ADD_FAILURE() << "starts accepted: " << starts.size();
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find("dataset 'list' sample 0: document"), std::string::npos) << error.what();
    }
  }
}

// Three documents of random tokens and random target flags.
std::vector<Sample> random_documents(const std::vector<size_t>& lengths, int seed) {
  torch::manual_seed(seed);
  std::vector<Sample> documents;
  for (const size_t length : lengths) {
    Sample d;
    const torch::Tensor ids = torch::randint(0, 32, {static_cast<int64_t>(length)}, torch::kInt64);
    const torch::Tensor flags = torch::rand({static_cast<int64_t>(length)}) < 0.7;
    for (size_t i = 0; i < length; ++i) {
      d.tokens.push_back(static_cast<int32_t>(ids[static_cast<int64_t>(i)].item<int64_t>()));
      d.target.push_back(i > 0 && flags[static_cast<int64_t>(i)].item<bool>() ? 1 : 0);
    }
    documents.push_back(std::move(d));
  }
  return documents;
}

// The accumulation contract with packing: a packed window's loss sum and
// gradients are those of its documents run alone, unpacked (each its own
// row, causal attention, positions from 0: the model's other path). fp32
// sums of the same terms in other orders and shapes: seen ~1e-7 relative,
// held to 1e-6.
TEST_F(ModelContract, APackedWindowTrainsEachDocumentAsIfAlone) {
  const std::vector<Sample> documents = random_documents({5, 3, 6}, 3);
  const Sample window = concatenate_documents({&documents[0], &documents[1], &documents[2]});
  const MicroBatch packed = collate(ListDataset({window}, 16, true), "packed", {0}, torch::kCPU);
  const MicroBatch alone = collate(ListDataset(documents, 16, false), "alone", indices(3), torch::kCPU);
  ASSERT_TRUE(model_->separates_documents());
  EXPECT_EQ(packed.batch.target_tokens, alone.batch.target_tokens);
  const double packed_loss = model_->forward(packed.batch).loss_sum.item<double>();
  const double alone_loss = model_->forward(alone.batch).loss_sum.item<double>();
  EXPECT_NEAR(packed_loss, alone_loss, 1e-6 * std::abs(alone_loss));
  const std::vector<torch::Tensor> packed_grads = gradients(packed.batch);
  const std::vector<torch::Tensor> alone_grads = gradients(alone.batch);
  for (size_t i = 0; i < packed_grads.size(); ++i) {
    const double error = (packed_grads[i] - alone_grads[i]).norm().item<double>();
    EXPECT_LE(error, 1e-6 * (1e-3 + alone_grads[i].norm().item<double>()))
        << (i == 0 ? std::string("loss") : model_->parameters()[i - 1].name);
  }
  // Without the document mask and positions the same window trains on its
  // neighbours' context: the comparison above can fail.
  Batch unmasked = packed.batch;
  unmasked.position_ids = torch::Tensor();
  unmasked.document_ids = torch::Tensor();
  EXPECT_GT(std::abs(model_->forward(unmasked).loss_sum.item<double>() - alone_loss), 1e-3 * std::abs(alone_loss));
}

// A document's loss is the same whichever window and neighbours it has:
// only its targets are kept, beside other documents or alone.
TEST_F(ModelContract, ADocumentsLossDoesNotDependOnItsNeighbours) {
  std::vector<Sample> documents = random_documents({6, 4, 7, 3}, 4);
  Sample& x = documents[0];
  std::vector<Sample> quiet = documents;  // the neighbours without targets
  for (size_t d = 1; d < quiet.size(); ++d) std::fill(quiet[d].target.begin(), quiet[d].target.end(), 0);
  const std::vector<Sample> windows = {concatenate_documents({&quiet[1], &x}),
                                       concatenate_documents({&quiet[2], &quiet[3], &x}),
                                       concatenate_documents({&x, &quiet[3]})};
  const double alone =
      model_->forward(collate(ListDataset({x}, 16, false), "alone", {0}, torch::kCPU).batch).loss_sum.item<double>();
  const MicroBatch packed = collate(ListDataset(windows, 16, true), "packed", indices(3), torch::kCPU);
  for (int64_t w = 0; w < 3; ++w) {
    Batch one;
    one.input_ids = packed.batch.input_ids.narrow(0, w, 1);
    one.labels = packed.batch.labels.narrow(0, w, 1);
    one.position_ids = packed.batch.position_ids.narrow(0, w, 1);
    one.document_ids = packed.batch.document_ids.narrow(0, w, 1);
    one.target_tokens = (one.labels != kIgnoreIndex).sum().item<int64_t>();
    EXPECT_NEAR(model_->forward(one).loss_sum.item<double>(), alone, 1e-6 * std::abs(alone)) << "window " << w;
  }
}

}  // namespace
}  // namespace trainer
