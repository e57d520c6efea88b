// Weights in and out: a run's consolidated model.safetensors (the same from
// every strategy and world size), export, loading it back as a Hugging Face
// directory, and bad weight files named by file and tensor.
#include <cstring>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "TestSupport.h"
#include "trainer/util/Safetensors.h"

namespace trainer {
namespace {

std::string train_quickstart(const std::string& name, const std::string& overrides) {
  const std::string dir = scratch_dir(name);
  const auto result =
      trainer("run " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=5 " + overrides);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return dir;
}

TEST(Weights, ConsolidatedWeightsAgreeAcrossStrategiesAndWorldSizes) {
  const std::string ddp = train_quickstart("WeightsDdp", "");
  const std::string zero3 =
      train_quickstart("WeightsZero3", "--set strategy.name=zero3 --set training.micro_batch_size=4 --nproc 2");
  const SafetensorsReader a(ddp + "/model.safetensors"), b(zero3 + "/model.safetensors");
  ASSERT_EQ(a.names(), b.names());
  ASSERT_EQ(a.names().size(), 1 + 2 * 12 + 2u);  // embedding, 2 blocks of 12, final norm, lm_head
  double diff = 0, norm = 0;
  for (const std::string& name : a.names()) {
    const torch::Tensor x = a.read(name), y = b.read(name);
    diff += (x - y).square().sum().item<double>();
    norm += x.square().sum().item<double>();
  }
  // Five fp32 steps with sums in another order: rounding only (Adam turns
  // the rounding noise of near-zero gradients, e.g. of the key bias, into
  // updates of size lr, so this is norm-wise over all weights).
  EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm));
}

TEST(Weights, ExportLoadsBackAsAHuggingFaceDirectory) {
  const std::string trained = train_quickstart("WeightsTrained", "");
  const std::string hf = scratch_dir("WeightsHf");
  ASSERT_EQ(trainer("export " + trained + " --to " + hf).exit_code, 0);
  EXPECT_NE(read_file(hf + "/config.json").find("\"model_type\": \"qwen2\""), std::string::npos);
  const std::string tokens = write_file(hf + "/tokens.txt", "1 5 9 13 17 21\n2 4 6 8 10 12\n");
  const auto from_hf = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens +
                               " --out " + hf + "/a.bin");
  ASSERT_EQ(from_hf.exit_code, 0) << from_hf.output;
  EXPECT_NE(from_hf.output.find("{\"shape\":[2,6,64]}"), std::string::npos) << from_hf.output;
  const auto from_file = trainer("forward " + kQuickstart + " --set model.init_from=" + trained +
                                 "/model.safetensors --tokens " + tokens + " --out " + hf + "/b.bin");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
  const auto fresh = trainer("forward " + kQuickstart + " --tokens " + tokens + " --out " + hf + "/c.bin");
  EXPECT_EQ(read_file(hf + "/a.bin"), read_file(hf + "/b.bin"));
  EXPECT_NE(read_file(hf + "/a.bin"), read_file(hf + "/c.bin"));  // the trained weights were used
}

// `forward --out` never replaces one of the command's inputs (the recipe,
// the token ids, a file a [model] key reads) nor writes into a directory or
// a missing one; each is refused by name with exit 2 and the file is as it
// was. Checked before the model is built, so the weights file here need not
// be valid.
TEST(Weights, ForwardRefusesToWriteOverItsInputs) {
  const std::string dir = scratch_dir("WeightsForwardInputs");
  const std::string recipe = write_file(dir + "/recipe.toml", read_file(kQuickstart));
  const std::string tokens = write_file(dir + "/tokens.txt", "1 5 9\n");
  const std::string weights = write_file(dir + "/w.safetensors", "not read");
  const std::string init = " --set model.init_from=" + weights;
  for (const auto& [out, named, options] :
       {std::tuple<std::string, std::string, std::string>{tokens, "the --tokens file", ""},
        {recipe, "the recipe file", ""},
        {weights, "the [model] init_from (--set", init},
        {dir, "is a directory", ""},
        {dir + "/no/such/logits.bin", "the directory " + dir + "/no/such does not exist", ""}}) {
    const auto result = trainer("forward " + recipe + options + " --tokens " + tokens + " --out " + out);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--out " + out + ": "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << result.output;
  }
  EXPECT_EQ(read_file(tokens), "1 5 9\n");
  EXPECT_EQ(read_file(recipe), read_file(kQuickstart));
  EXPECT_EQ(read_file(weights), "not read");
  // A device is refused before it is read (/dev/zero was read without end;
  // /dev/null ends at once, so the check is seen without a bound): a pipe
  // with a writer is read like a file.
  const auto device = trainer("forward " + recipe + " --tokens /dev/null --out " + dir + "/null.bin");
  EXPECT_EQ(device.exit_code, 2) << device.output;
  EXPECT_NE(device.output.find("--tokens /dev/null: expected a file of token ids"), std::string::npos) << device.output;
  const std::string pipe = dir + "/tokens.fifo";
  const auto piped = run_command("mkfifo " + pipe + " && (echo '1 5 9' > " + pipe + " &) && timeout 60 " +
                                 std::string(TRAINER_BINARY) + " forward " + recipe + " --tokens " + pipe + " --out " +
                                 dir + "/piped.bin");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  // The same command with a free --out writes the logits, and no temporary is left.
  const auto fine = trainer("forward " + recipe + " --tokens " + tokens + " --out " + dir + "/logits.bin");
  ASSERT_EQ(fine.exit_code, 0) << fine.output;
  EXPECT_EQ(read_file(dir + "/logits.bin").size(), 3u * 64u * sizeof(float));
  EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{});
  EXPECT_EQ(read_file(dir + "/piped.bin"), read_file(dir + "/logits.bin"));
  // Token ids in a file named as --out's temporary once was (OUT.tmp, which
  // the write truncated and renamed away): the write takes a name of its
  // own, and the ids are as they were.
  const std::string named = scratch_dir("WeightsForwardTmpName");
  const std::string ids = write_file(named + "/logits.bin.tmp", "1 5 9\n");
  const auto beside = trainer("forward " + recipe + " --tokens " + ids + " --out " + named + "/logits.bin");
  ASSERT_EQ(beside.exit_code, 0) << beside.output;
  EXPECT_EQ(read_file(ids), "1 5 9\n");
  EXPECT_EQ(read_file(named + "/logits.bin"), read_file(dir + "/logits.bin"));
}

// The Llama variant of the model: no q/k/v biases, untied head, Llama 3's
// rope scaling (an original context of 16 so that the quick start's 32
// positions reach all three bands). It exports as LlamaForCausalLM, loads
// back through model_type "llama" with the same logits, and what it cannot
// represent is refused by name.
TEST(Weights, LlamaExportsAndLoadsBackAsLlamaForCausalLM) {
  const std::string llama =
      "--set model.attention_bias=false --set model.rope_scaling=llama3"
      " --set model.rope_original_max_position_embeddings=16";
  const std::string trained = train_quickstart("WeightsLlama", llama);
  const SafetensorsReader weights(trained + "/model.safetensors");
  ASSERT_EQ(weights.names().size(), 1 + 2 * 9 + 2u);  // embedding, 2 blocks of 9 (no q/k/v bias), final norm, lm_head
  for (const std::string& name : weights.names()) EXPECT_EQ(name.find("bias"), std::string::npos) << name;
  const std::string hf = scratch_dir("WeightsLlamaHf");
  ASSERT_EQ(trainer("export " + trained + " --to " + hf).exit_code, 0);
  const std::string config = read_file(hf + "/config.json");
  for (const char* expected :
       {"\"model_type\": \"llama\"", "\"LlamaForCausalLM\"", "\"attention_bias\": false", "\"rope_type\": \"llama3\"",
        "\"original_max_position_embeddings\": 16", "\"tie_word_embeddings\": false"}) {
    EXPECT_NE(config.find(expected), std::string::npos) << expected << "\n" << config;
  }
  const std::string tokens = write_file(hf + "/tokens.txt", "1 5 9 13 17 21 25 29\n2 4 6 8 10 12 14 16\n");
  // Loaded through config.json alone (the recipe says nothing of Llama) and from the file with the recipe's keys.
  const auto from_hf = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens +
                               " --out " + hf + "/a.bin");
  ASSERT_EQ(from_hf.exit_code, 0) << from_hf.output;
  const auto from_file = trainer("forward " + kQuickstart + " " + llama + " --set model.init_from=" + trained +
                                 "/model.safetensors --tokens " + tokens + " --out " + hf + "/b.bin");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
  EXPECT_EQ(read_file(hf + "/a.bin"), read_file(hf + "/b.bin"));
  const auto unscaled =
      trainer("forward " + kQuickstart + " --set model.attention_bias=false --set model.init_from=" + trained +
              "/model.safetensors --tokens " + tokens + " --out " + hf + "/c.bin");
  ASSERT_EQ(unscaled.exit_code, 0) << unscaled.output;
  EXPECT_NE(read_file(hf + "/a.bin"), read_file(hf + "/c.bin"));  // the scaling is applied
  // The recipe disagreeing with config.json, and what a Llama config may hold that the model has not.
  const auto disagree = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf +
                                " --set model.attention_bias=true --tokens " + tokens + " --out " + hf + "/d.bin");
  EXPECT_EQ(disagree.exit_code, 2) << disagree.output;
  EXPECT_NE(disagree.output.find("attention_bias: expected false as in"), std::string::npos) << disagree.output;
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> refused = {
      {{"\"model_type\": \"llama\"", "\"model_type\": \"mistral\""}, "model_type 'mistral' is not supported"},
      {{"\"mlp_bias\": false", "\"mlp_bias\": true"}, "mlp_bias = true is not supported"},
      {{"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""}, "of type 'yarn' is not supported"},
      {{"\"head_dim\": 16", "\"head_dim\": 32"}, "head_dim 32 other than"},
  };
  for (const auto& [edit, message] : refused) {
    std::string changed = config;
    ASSERT_NE(changed.find(edit.first), std::string::npos) << edit.first;
    changed.replace(changed.find(edit.first), edit.first.size(), edit.second);
    write_file(hf + "/config.json", changed);
    const auto bad = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens +
                             " --out " + hf + "/e.bin");
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_NE(bad.output.find(message), std::string::npos) << message << "\n" << bad.output;
  }
  write_file(hf + "/config.json", config);
}

TEST(Weights, LoadsAShardedCheckpointThroughItsIndex) {
  const std::string trained = train_quickstart("WeightsShardSource", "");
  const std::string hf = scratch_dir("WeightsSharded");
  ASSERT_EQ(trainer("export " + trained + " --to " + hf).exit_code, 0);
  const SafetensorsReader whole(hf + "/model.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> first, second;
  std::string map;
  for (const std::string& name : whole.names()) {
    const bool early = name.find("layers.1.") == std::string::npos && name.find("norm.weight") != 0;
    (early ? first : second).emplace_back(name, whole.read(name));
    map += std::string(map.empty() ? "" : ",") + "\"" + name + "\": \"" +
           (early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
  }
  write_safetensors(hf + "/model-00001-of-00002.safetensors", first);
  write_safetensors(hf + "/model-00002-of-00002.safetensors", second);
  write_file(hf + "/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
  const std::string tokens = write_file(hf + "/tokens.txt", "7 3 9 1\n");
  ASSERT_EQ(trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens + " --out " + hf +
                    "/whole.bin")
                .exit_code,
            0);
  std::filesystem::remove(hf + "/model.safetensors");
  const auto sharded = trainer("forward " + kQuickstart + " --set model.hf_dir=" + hf + " --tokens " + tokens +
                               " --out " + hf + "/sharded.bin");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_EQ(read_file(hf + "/whole.bin"), read_file(hf + "/sharded.bin"));
  EXPECT_FALSE(second.empty());
}

TEST(Weights, BadWeightFilesAreNamed) {
  const std::string trained = train_quickstart("WeightsBadSource", "");
  const std::string hf = scratch_dir("WeightsBad");
  ASSERT_EQ(trainer("export " + trained + " --to " + hf).exit_code, 0);
  auto mismatch = trainer("run " + kQuickstart + " --set model.hf_dir=" + hf + " --set model.hidden_size=32");
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.output;
  EXPECT_NE(mismatch.output.find("[model] hidden_size: expected 64 as in " + hf + "/config.json"), std::string::npos)
      << mismatch.output;
  // A truncated file.
  const std::string weights = read_file(hf + "/model.safetensors");
  write_file(hf + "/model.safetensors", weights.substr(0, weights.size() - 100));
  auto truncated = trainer("run " + kQuickstart + " --set model.hf_dir=" + hf + " --set training.steps=1");
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_NE(truncated.output.find(hf + "/model.safetensors: truncated safetensors file: tensor"), std::string::npos)
      << truncated.output;
  // A missing tensor, and one of another shape, in an init_from file.
  write_file(hf + "/model.safetensors", weights);
  const SafetensorsReader good(hf + "/model.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> partial, reshaped;
  for (const std::string& name : good.names()) {
    if (name != "model.norm.weight") partial.emplace_back(name, good.read(name));
    reshaped.emplace_back(name, name == "model.norm.weight" ? torch::ones({7}) : good.read(name));
  }
  write_safetensors(hf + "/partial.safetensors", partial);
  write_safetensors(hf + "/reshaped.safetensors", reshaped);
  auto missing = trainer("run " + kQuickstart + " --set model.init_from=" + hf + "/partial.safetensors");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("model.init_from: no tensor 'model.norm.weight' in " + hf + "/partial.safetensors"),
            std::string::npos)
      << missing.output;
  auto wrong = trainer("run " + kQuickstart + " --set model.init_from=" + hf + "/reshaped.safetensors");
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("reshaped.safetensors: tensor 'model.norm.weight' has shape [7], the model expects [64]"),
            std::string::npos)
      << wrong.output;
  EXPECT_EQ(trainer("export " + scratch_dir("WeightsEmpty") + " --to " + hf + "/x").exit_code, 2);
  // A tensor named twice in the header, and a key given twice in config.json:
  // plain JSON parsing would keep one silently.
  const std::string twice = std::string(8, '\0') +
                            R"({"model.norm.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("model.norm.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string file = twice + std::string(8, '\0');
  const uint64_t header_bytes = twice.size() - 8;
  std::memcpy(file.data(), &header_bytes, 8);
  write_file(hf + "/twice.safetensors", file);
  auto repeated = trainer("run " + kQuickstart + " --set model.init_from=" + hf + "/twice.safetensors");
  EXPECT_EQ(repeated.exit_code, 2) << repeated.output;
  EXPECT_NE(repeated.output.find("twice.safetensors: malformed safetensors header: the key 'model.norm.weight' appears "
                                 "twice in one object"),
            std::string::npos)
      << repeated.output;
  const std::string config = read_file(hf + "/config.json");
  write_file(hf + "/config.json", "{\"hidden_size\": 64, " + config.substr(config.find('{') + 1));
  auto config_twice = trainer("run " + kQuickstart + " --set model.hf_dir=" + hf + " --set training.steps=1");
  EXPECT_EQ(config_twice.exit_code, 2) << config_twice.output;
  EXPECT_NE(config_twice.output.find(hf + "/config.json: malformed JSON: the key 'hidden_size' appears twice"),
            std::string::npos)
      << config_twice.output;
}

}  // namespace
}  // namespace trainer
