// The file datasets end to end: jsonl (text and pre-tokenised), tokens, file
// order with shuffle = false, and bad data files named by file and line.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <tuple>

#include <filesystem>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Tokenizer.h"

namespace trainer {
namespace {

std::string recipe(const std::string& dir, const std::string& dataset, int64_t vocab = 258) {
  return write_file(dir + "/recipe.toml", "[run]\noutput_dir = '" + dir +
                                              "/run'\n[model]\nname = 'qwen2'\nvocab_size = " + std::to_string(vocab) +
                                              "\nhidden_size = 16\nintermediate_size = 32\n"
                                              "num_attention_heads = 2\nnum_key_value_heads = 1\n[dataset]\n" +
                                              dataset +
                                              "[training]\nsteps = 2\nmicro_batch_size = 1\ngrad_accum_steps = 2\n");
}

TEST(Datasets, JsonlTextInFileOrderCountsCompletionTargets) {
  const std::string dir = scratch_dir("JsonlText");
  write_file(dir + "/data.jsonl",
             "{\"prompt\": \"Q: 1+1\", \"completion\": \"2\"}\n\n{\"prompt\": \"Q: hi\", \"completion\": \"hello\"}\n"
             "{\"prompt\": \"x\", \"completion\": \"\\u00e9\"}\n");
  const auto result =
      trainer("run " + recipe(dir, "name = 'jsonl'\npath = '" + dir + "/data.jsonl'\nshuffle = false\n"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto rows = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  // Step 1: records 0 and 1, completions "2" and "hello" plus EOS each.
  EXPECT_EQ(rows[0].at("target_tokens"), (1 + 1) + (5 + 1));
  // Step 2: record 2 ("é" is two UTF-8 bytes, plus EOS), then record 0 again.
  EXPECT_EQ(rows[1].at("target_tokens"), (2 + 1) + (1 + 1));
}

// Text records through Qwen3's real tokenizer (scripts/fetch-tokenizer.sh):
// the targets are the completion's tokens and the tokenizer's EOS (Qwen3 has
// no BOS), a "text" line's every token after the first; vocab_size follows
// the tokenizer, and one below it is refused naming the key.
TEST(Datasets, JsonlTextThroughAHuggingFaceTokenizer) {
  const std::string tokenizer_dir = testing::qwen3_tokenizer_dir();
  ASSERT_TRUE(std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/fetch-tokenizer.sh";
  const auto tokenizer = Tokenizer::load(tokenizer_dir);
  const std::string dir = scratch_dir("JsonlTokenizer");
  write_file(dir + "/data.jsonl",
             "{\"prompt\": \"Question: what is 12 * 12?\", \"completion\": \" 144, of course.\"}\n"
             "{\"text\": \"Plain pretraining text, 中文 and emoji 👍.\"}\n");
  const std::string dataset =
      "name = 'jsonl'\npath = '" + dir + "/data.jsonl'\nshuffle = false\ntokenizer = '" + tokenizer_dir + "'\n";
  const auto result = trainer("run " + recipe(dir, dataset, tokenizer->vocab_size()) + " --set training.steps=1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto rows = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(rows.size(), 1u);
  const size_t completion = tokenizer->encode(" 144, of course.").size() + 1;                 // + EOS
  const size_t text = tokenizer->encode("Plain pretraining text, 中文 and emoji 👍.").size();  // + EOS - the first
  EXPECT_EQ(rows[0].at("target_tokens"), static_cast<double>(completion + text));
  const auto small = trainer("run " + recipe(dir, dataset + "vocab_size = 1000\n", 1000));
  EXPECT_EQ(small.exit_code, 2) << small.output;
  EXPECT_NE(small.output.find("vocab_size"), std::string::npos) << small.output;
  EXPECT_NE(small.output.find("at least the tokenizer's 151669"), std::string::npos) << small.output;
  const auto missing = trainer(
      "run " + recipe(dir, "name = 'jsonl'\npath = '" + dir + "/data.jsonl'\ntokenizer = '" + dir + "/nowhere'\n"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("dataset.tokenizer: " + dir + "/nowhere: no tokenizer.json"), std::string::npos)
      << missing.output;
}

// configs/finetune/hf-text.toml end to end on a small model the test makes
// (random weights exported as a Hugging Face directory, Qwen3's real
// tokenizer copied in): the dataset takes the directory's tokenizer without
// being told, the model its config.json, and the completion targets are the
// tokenizer's tokens of the completions plus EOS.
TEST(Datasets, FineTuneConfigTrainsAHuggingFaceDirectoryOnText) {
  const std::string tokenizer_dir = testing::qwen3_tokenizer_dir();
  ASSERT_TRUE(std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/fetch-tokenizer.sh";
  const auto tokenizer = Tokenizer::load(tokenizer_dir);
  const std::string dir = scratch_dir("FineTuneHfText");
  const std::string quickstart = testing::source_path("configs/quickstart.toml");
  const auto made = trainer("run " + quickstart + " --set run.output_dir=" + dir + "/made --set training.steps=1" +
                            " --set model.vocab_size=" + std::to_string(tokenizer->vocab_size()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string hf = dir + "/hf";
  ASSERT_EQ(trainer("export " + dir + "/made --to " + hf).exit_code, 0);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tokenizer_dir + "/" + file, hf + "/" + file);
  }
  const std::vector<std::pair<std::string, std::string>> records = {
      {"Translate to French: cat", " chat"}, {"2 + 2 =", " 4"}, {"Capital of Japan?", " 東京 (Tokyo)."}, {"Hi", " 👋"}};
  std::string data;
  size_t targets = 0;
  for (const auto& [prompt, completion] : records) {
    data += Json{{"prompt", prompt}, {"completion", completion}}.dump() + "\n";
    targets += tokenizer->encode(completion).size() + 1;  // + EOS
  }
  write_file(dir + "/train.jsonl", data);
  const auto run =
      trainer("run " + testing::source_path("configs/finetune/hf-text.toml") + " --set model.hf_dir=" + hf +
              " --set dataset.path=" + dir + "/train.jsonl --set run.output_dir=" + dir + "/run" +
              " --set training.steps=2 --set training.micro_batch_size=2 --set training.grad_accum_steps=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto rows = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  // Each step is a permutation of the four records (global batch 4 of 4).
  EXPECT_EQ(rows[0].at("target_tokens"), static_cast<double>(targets));
  EXPECT_EQ(rows[1].at("target_tokens"), static_cast<double>(targets));
  const std::string resolved = read_file(dir + "/run/recipe.toml");
  EXPECT_NE(resolved.find("tokenizer = '" + hf + "'"), std::string::npos) << resolved;
}

TEST(Datasets, JsonlIdsAndErrorsNameFileAndLine) {
  const std::string dir = scratch_dir("JsonlIds");
  write_file(dir + "/ids.jsonl",
             "{\"prompt_ids\": [1, 2, 3], \"completion_ids\": [4, 5]}\n"
             "{\"prompt_ids\": [6], \"completion_ids\": [7, 8, 9]}\n");
  EXPECT_EQ(
      trainer("run " + recipe(dir, "name = 'jsonl'\npath = '" + dir + "/ids.jsonl'\nvocab_size = 16\n", 16)).exit_code,
      0);

  write_file(dir + "/bad.jsonl",
             "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n{\"prompt_ids\": [1], }\n"
             "{\"prompt_ids\": [1], \"completion_ids\": [99]}\n");
  const std::string bad_dataset = "name = 'jsonl'\npath = '" + dir + "/bad.jsonl'\nvocab_size = 16\n";
  const auto bad = trainer("run " + recipe(dir, bad_dataset, 16));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("bad.jsonl:2: parse error at line 1, column 21"), std::string::npos) << bad.output;
  // Another dataset into the directory of the ids.jsonl run: its results go.
  const auto skipped =
      trainer("run " + recipe(dir, bad_dataset + "skip_bad_lines = true\n", 16) + " --set run.overwrite=true");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("skipped 2 malformed line(s); the first: " + dir + "/bad.jsonl:2"), std::string::npos)
      << skipped.output;
  write_file(dir + "/range.jsonl", "{\"prompt_ids\": [1], \"completion_ids\": [99]}\n");
  const auto range =
      trainer("run " + recipe(dir, "name = 'jsonl'\npath = '" + dir + "/range.jsonl'\nvocab_size = 16\n", 16));
  EXPECT_EQ(range.exit_code, 2) << range.output;
  EXPECT_NE(range.output.find("range.jsonl:1: \"completion_ids\"[0] = 99 is outside [0, vocab_size = 16)"),
            std::string::npos)
      << range.output;
}

TEST(Datasets, TokensWindowsAndBadFiles) {
  const std::string dir = scratch_dir("Tokens");
  {
    std::ofstream out(dir + "/tokens.bin", std::ios::binary);
    for (uint16_t i = 0; i < 200; ++i) {
      const uint16_t id = i % 50;
      out.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  const std::string dataset = "name = 'tokens'\npath = '" + dir + "/tokens.bin'\nseq_len = 16\nvocab_size = 50\n";
  const auto ok = trainer("run " + recipe(dir, dataset, 50));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_metrics(dir + "/run/metrics.jsonl")[0].at("target_tokens"), 2 * 16);  // every token after the first
  const auto small_vocab = trainer(
      "run " + recipe(dir, "name = 'tokens'\npath = '" + dir + "/tokens.bin'\nseq_len = 16\nvocab_size = 10\n", 50));
  EXPECT_EQ(small_vocab.exit_code, 2) << small_vocab.output;
  EXPECT_NE(small_vocab.output.find("is not below vocab_size 10"), std::string::npos) << small_vocab.output;
  std::ofstream(dir + "/tokens.bin", std::ios::binary | std::ios::app).write("x", 1);
  const auto truncated = trainer("run " + recipe(dir, dataset, 50));
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_NE(truncated.output.find("tokens.bin: 401 bytes is not a whole number of uint16 tokens"), std::string::npos)
      << truncated.output;
}

// Eight pre-tokenised records of 5, 4, 3, 6, 2, 7, 3 and 2 tokens (prompt
// then completion), packed into windows of seq_len + 1 = 9 tokens. Best
// fit, worked by hand: {5, 4}, {3, 6}, {2, 7}, {3, 2}; 8 + 8 + 8 + 4 of the
// 4 x 8 input positions used, so padding is 4 / 32 of each step's four
// windows (file order).
const char* const kRaggedRecords =
    "{\"prompt_ids\": [1, 2], \"completion_ids\": [3, 4, 5]}\n"
    "{\"prompt_ids\": [6], \"completion_ids\": [7, 8, 9]}\n"
    "{\"prompt_ids\": [10], \"completion_ids\": [11, 12]}\n"
    "{\"prompt_ids\": [1, 3, 5], \"completion_ids\": [7, 9, 11]}\n"
    "{\"prompt_ids\": [2], \"completion_ids\": [4]}\n"
    "{\"prompt_ids\": [6, 8], \"completion_ids\": [10, 12, 14, 1, 3]}\n"
    "{\"prompt_ids\": [5, 5], \"completion_ids\": [6]}\n"
    "{\"prompt_ids\": [9], \"completion_ids\": [13]}\n";
constexpr int64_t kRaggedCompletionTokens = 3 + 3 + 2 + 3 + 1 + 5 + 1 + 1;
// Packed into windows of seq_len + 1 = 9 tokens, best fit in file order,
// the records of 5, 4, 3, 6, 2, 7, 3 and 2 tokens make the windows
// [5 4], [3 6], [2 7] and [3 2]: 28 input positions (a window's last
// token is no input), its last document one position short. Attention
// works over each document's own positions, squared:
constexpr double kPackedPairs = 5 * 5 + 3 * 3 + 3 * 3 + 5 * 5 + 2 * 2 + 6 * 6 + 3 * 3 + 1 * 1;
// The FLOPs of recipe()'s qwen2 (hidden 16, intermediate 32, 2 heads of 8,
// 1 key/value head, 2 layers, vocab 16), enumerated here as multiply-adds,
// 2 FLOPs each, backward twice forward: per input token the blocks'
// matrices q, k, v, o, gate, up, down; per target token the head; per
// attended pair the scores and the weighted values (both heads).
constexpr double kPerInputToken = 3 * 2 * 2 * (16 * 16 + 16 * 8 + 16 * 8 + 16 * 16 + 16 * 32 + 16 * 32 + 32 * 16);
constexpr double kPerTargetToken = 3 * 2 * (16 * 16);
constexpr double kPerPair = 3 * 2 * 2 * (2 * 8 + 2 * 8);

// Packed records train alike at every split of the global batch (sums in
// other orders: 1e-5, the invariance tests' tolerance) and bit for bit in
// reproducible mode; every step counts all completion tokens (no target
// lost or added at a boundary), eight documents, the padding worked out
// above, and MFU over the FLOPs of the documents' own attention.
TEST(Datasets, PackedRecordsTrainAlikeAtEverySplitAndCountTheirPadding) {
  const std::string dir = scratch_dir("Packed");
  write_file(dir + "/ragged.jsonl", kRaggedRecords);
  const std::string dataset =
      "name = 'jsonl'\npath = '" + dir + "/ragged.jsonl'\nvocab_size = 16\nseq_len = 8\nshuffle = false\npack = true\n";
  const std::string file = recipe(dir, dataset, 16);
  std::string dirs, reproducible_hash;
  for (const auto& [micro, accum, world] :
       std::vector<std::tuple<int, int, int>>{{4, 1, 1}, {1, 4, 1}, {2, 1, 2}, {1, 2, 2}}) {
    const std::string split = std::to_string(micro) + "x" + std::to_string(accum) + "x" + std::to_string(world);
    const std::string args = " --set training.steps=3 --set training.micro_batch_size=" + std::to_string(micro) +
                             " --set training.grad_accum_steps=" + std::to_string(accum) + " --nproc " +
                             std::to_string(world) + " --set run.peak_tflops=0.001";
    const std::string out = dir + "/run_" + split;
    const auto result = trainer("run " + file + args + " --set run.output_dir=" + out);
    ASSERT_EQ(result.exit_code, 0) << split << "\n" << result.output;
    dirs += " " + out;
    for (const MetricsRow& row : read_metrics(out + "/metrics.jsonl")) {
      EXPECT_EQ(row.at("target_tokens"), kRaggedCompletionTokens) << split;
      EXPECT_EQ(row.at("documents"), 8) << split;
      EXPECT_EQ(row.at("input_tokens"), 28) << split;
      EXPECT_DOUBLE_EQ(row.at("pad_fraction"), 4.0 / 32.0) << split;
      const double flops = kPerInputToken * 28 + kPerTargetToken * kRaggedCompletionTokens + kPerPair * kPackedPairs;
      EXPECT_NEAR(row.at("mfu"), flops / row.at("step_seconds") / (1e9 * world), 1e-9 * row.at("mfu")) << split;
    }
    if (micro == 1) {  // two splits in reproducible mode: one weight hash
      const std::string exact = dir + "/exact_" + split;
      const auto run =
          trainer("run " + file + args + " --set training.reproducible=true --set run.output_dir=" + exact);
      ASSERT_EQ(run.exit_code, 0) << split << "\n" << run.output;
      const std::string hash =
          Json::parse(read_file(exact + "/summary.json")).at("parameters_xxh3_128").get<std::string>();
      if (reproducible_hash.empty()) reproducible_hash = hash;
      EXPECT_EQ(hash, reproducible_hash) << split;
    }
  }
  const auto compared = trainer("compare --rtol 1e-5" + dirs);
  EXPECT_EQ(compared.exit_code, 0) << compared.output;
  EXPECT_NE(compared.output.find("all agree"), std::string::npos) << compared.output;
}

// Bad packing input: a record longer than a window under
// long_documents = "refuse" (file and line), and a model that cannot keep
// documents apart (the key).
TEST(Datasets, PackingRefusesLongRecordsAndModelsWithoutDocuments) {
  const std::string dir = scratch_dir("PackedRefused");
  write_file(dir + "/long.jsonl",
             "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n"
             "{\"prompt_ids\": [1, 2, 3, 4, 5, 6], \"completion_ids\": [7, 8, 9, 10, 11, 12]}\n");
  const std::string dataset =
      "name = 'jsonl'\npath = '" + dir + "/long.jsonl'\nvocab_size = 16\nseq_len = 8\npack = true\n";
  const auto refused = trainer("run " + recipe(dir, dataset + "long_documents = 'refuse'\n", 16));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("long.jsonl:2: 12 tokens, more than a window of seq_len + 1 = 9 holds"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(trainer("run " + recipe(dir, dataset + "long_documents = 'split'\n", 16)).exit_code, 0);
  const std::string other_model = write_file(
      dir + "/skip.toml", "[run]\noutput_dir = '" + dir + "/skip'\n[model]\nname = '" +
                              std::string(TRAINER_FIXTURE_DIR) + "/models/trainer-model-skip-layer.so'\n[dataset]\n" +
                              dataset + "[training]\nsteps = 1\nmicro_batch_size = 1\n");
  const auto unmasked = trainer("run " + other_model);
  EXPECT_EQ(unmasked.exit_code, 2) << unmasked.output;
  EXPECT_NE(unmasked.output.find("pack"), std::string::npos) << unmasked.output;
  EXPECT_NE(unmasked.output.find("does not keep packed documents apart"), std::string::npos) << unmasked.output;
}

void write_uint64s(const std::string& path, const std::vector<uint64_t>& values) {
  std::ofstream out(path, std::ios::binary);
  for (uint64_t value : values) {
    for (int b = 0; b < 8; ++b) out.put(static_cast<char>(value >> (8 * b) & 0xff));
  }
}

// The tokens dataset packs the documents its .docs offsets name; offsets
// that do not match the token file, out of order, or a document too long
// under "refuse" stop the run naming the file and the document.
TEST(Datasets, PackedTokensFollowTheirDocumentOffsets) {
  const std::string dir = scratch_dir("PackedTokens");
  {
    std::ofstream out(dir + "/tokens.bin", std::ios::binary);
    for (uint16_t i = 0; i < 60; ++i) {
      const uint16_t id = static_cast<uint16_t>(i * 7 % 50);
      out.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  // Documents of 10, 5, 20, 7, 18 tokens; windows of 17: the 20 is split
  // into pieces of 17 and 4 (overlapping by one), the 18 into 17 and 2.
  write_uint64s(dir + "/tokens.bin.docs", {0, 10, 15, 35, 42, 60});
  const std::string dataset = "name = 'tokens'\npath = '" + dir +
                              "/tokens.bin'\nseq_len = 16\nvocab_size = 50\n"
                              "shuffle = false\npack = true\n";
  const auto ok = trainer("run " + recipe(dir, dataset, 50) + " --set training.steps=1");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  // Every token but each document's first is a target once: 60 - 5 over
  // however many steps; the first step's two windows hold part of them.
  EXPECT_NE(ok.output.find("5 documents (2 split into pieces) packed into"), std::string::npos) << ok.output;
  const auto refused = trainer("run " + recipe(dir, dataset + "long_documents = 'refuse'\n", 50));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("tokens.bin.docs: document 2 (tokens 15..34 of"), std::string::npos) << refused.output;
  write_uint64s(dir + "/tokens.bin.docs", {0, 10, 15, 35, 42, 59});
  const auto short_docs = trainer("run " + recipe(dir, dataset, 50));
  EXPECT_EQ(short_docs.exit_code, 2) << short_docs.output;
  EXPECT_NE(short_docs.output.find("tokens.bin.docs: does not match " + dir + "/tokens.bin"), std::string::npos)
      << short_docs.output;
  write_uint64s(dir + "/tokens.bin.docs", {0, 10, 5, 35, 42, 60});
  const auto disordered = trainer("run " + recipe(dir, dataset, 50));
  EXPECT_EQ(disordered.exit_code, 2) << disordered.output;
  EXPECT_NE(disordered.output.find("tokens.bin.docs: document 1 ends at offset 5, before its start 10"),
            std::string::npos)
      << disordered.output;
  std::filesystem::remove(dir + "/tokens.bin.docs");
  const auto missing = trainer("run " + recipe(dir, dataset, 50));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("tokens.bin.docs: cannot open the document offsets"), std::string::npos)
      << missing.output;
  // A FIFO (or directory) as the offsets is refused before it is opened: a
  // FIFO would block the run. Under `timeout` so that a hang fails in a minute.
  ASSERT_EQ(mkfifo((dir + "/tokens.bin.docs").c_str(), 0600), 0);
  const std::string bounded = "timeout 60 " + std::string(TRAINER_BINARY) + " run ";
  const auto fifo = run_command(bounded + recipe(dir, dataset, 50));
  EXPECT_EQ(fifo.exit_code, 2) << fifo.output;
  EXPECT_NE(fifo.output.find("tokens.bin.docs: expected the document offsets as a regular file"), std::string::npos)
      << fifo.output;
  const auto named = run_command(bounded + recipe(dir, dataset + "docs = '" + dir + "'\n", 50));
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_NE(named.output.find("[dataset] docs: expected a regular file; '" + dir + "' is not one"), std::string::npos)
      << named.output;
}

}  // namespace
}  // namespace trainer
