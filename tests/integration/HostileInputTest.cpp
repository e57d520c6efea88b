// Hostile but realistic input and faults: each is a clear error (exit 2)
// naming what is wrong, never a crash, and never the loss of what an
// earlier run wrote.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

bool says(const CommandResult& result, const std::string& text) {
  return result.output.find(text) != std::string::npos;
}

CommandResult run(const std::string& dir, const std::string& args) {
  return trainer("run " + kQuickstart + " --set run.output_dir=" + dir + " " + args);
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = read_file(path);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  write_file(path, text);
}

// Rewrites manifest.xxh3 to match the manifest: a forged or buggy manifest
// that passes its checksum, to reach the field checks behind it.
void reseal(const std::string& manifest) {
  const std::string text = read_file(manifest);
  const XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(hash.high64),
                static_cast<unsigned long long>(hash.low64));
  write_file(fs::path(manifest).parent_path().string() + "/manifest.xxh3", std::string(hex) + "\n");
}

TEST(HostileInput, DamagedManifestIsAnErrorAndLosesNothing) {
  const std::string dir = scratch_dir("HiManifest");
  ASSERT_EQ(run(dir, "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  const std::string metrics = read_file(dir + "/metrics.jsonl");
  const std::string manifest = dir + "/checkpoints/step-00000002/manifest.json";
  const std::string original = read_file(manifest);
  for (const auto& [from, to, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"step\": 2", "\"step\": -1", "'step' must be an integer"},
           {"\"world_size\": 1", "\"world_size\": 0", "'world_size' must be an integer"},
           {"\"world_size\": 1", "\"world_size\": 3", "1 files listed for world size 3"},
           {"rank-00000.safetensors", "../rank-00000.safetensors", "must be named rank-00000.safetensors"}}) {
    write_file(manifest, original);
    replace_in_file(manifest, from, to);
    const CommandResult edited = run(dir, "--set training.steps=4 --set checkpoint.resume=auto");
    EXPECT_EQ(edited.exit_code, 2) << edited.output;
    EXPECT_TRUE(says(edited, "(the manifest was edited or damaged)")) << edited.output;
    reseal(manifest);
    const CommandResult resumed = run(dir, "--set training.steps=4 --set checkpoint.resume=auto");
    EXPECT_EQ(resumed.exit_code, 2) << to << "\n" << resumed.output;
    EXPECT_TRUE(says(resumed, message)) << resumed.output;
    EXPECT_TRUE(says(resumed, "none of the 1 checkpoints")) << resumed.output;
    EXPECT_EQ(read_file(dir + "/metrics.jsonl"), metrics) << "the earlier run's metrics were replaced";
    EXPECT_TRUE(fs::exists(dir + "/checkpoints/step-00000002/rank-00000.safetensors"));
  }
}

// Checkpoints of the previous format (FNV-1a per file, no manifest checksum) still resume.
TEST(HostileInput, PreviousCheckpointFormatStillResumes) {
  const std::string straight = scratch_dir("HiFormat1Straight"), dir = scratch_dir("HiFormat1");
  ASSERT_EQ(run(straight, "--set training.steps=4").exit_code, 0);
  ASSERT_EQ(run(dir, "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  const std::string step = dir + "/checkpoints/step-00000002";
  const std::string shard = read_file(step + "/rank-00000.safetensors");
  uint64_t fnv = 0xcbf29ce484222325ULL;
  for (const unsigned char c : shard) fnv = (fnv ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv));
  // Format 1 listed no config.json or recipe.toml checksum (nor a manifest.xxh3, removed below).
  Json format1 = json_parse(read_file(step + "/manifest.json"));
  ASSERT_EQ(format1.erase("config"), 1u);
  ASSERT_EQ(format1.erase("recipe"), 1u);
  std::string manifest = format1.dump(1) + "\n";
  const size_t at = manifest.find("\"xxh3_128\": \"");
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, std::string("\"xxh3_128\": \"").size() + 32, std::string("\"fnv1a\": \"") + hex);
  write_file(step + "/manifest.json", manifest);
  replace_in_file(step + "/manifest.json", "trainer-checkpoint-3", "trainer-checkpoint-1");
  fs::remove(step + "/manifest.xxh3");
  const CommandResult resumed = run(dir, "--set training.steps=4 --set checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(says(resumed, "resumed from " + step)) << resumed.output;
  EXPECT_EQ(read_file(straight + "/summary.json"), read_file(dir + "/summary.json"));
}

TEST(HostileInput, TruncatedOrEmptyPluginIsNamedNotACrash) {
  const std::string dir = scratch_dir("HiPlugin");
  const std::string ddp = std::string(TRAINER_PLUGIN_DIR) + "/trainer-strategy-ddp.so";
  for (const auto& [bytes, message] : std::vector<std::pair<int, std::string>>{
           {3000, "truncated"}, {0, "empty file"}, {20, "not an ELF shared library"}}) {
    const std::string bad = dir + "/trainer-strategy-t.so";
    ASSERT_EQ(run_command("head -c " + std::to_string(bytes) + " " + ddp + " > " + bad).exit_code, 0);
    const CommandResult listed = trainer("--plugin-dir " + dir + " plugins");
    EXPECT_EQ(listed.exit_code, 2) << bytes << " bytes\n" << listed.output;
    EXPECT_TRUE(says(listed, bad)) << listed.output;
    EXPECT_TRUE(says(listed, message)) << listed.output;
  }
}

// Waits (up to a minute) until `path` exists and is not empty.
bool written(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path) || fs::file_size(path) == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// A second run into the output directory, or the checkpoint directory, of a
// running one is refused naming the holder; the lock of a killed run is
// not stale.
TEST(HostileInput, SecondRunIntoABusyOutputDirectoryIsRefused) {
  const std::string dir = scratch_dir("HiLock"), other = scratch_dir("HiLockOther");
  Job first({TRAINER_BINARY, "run", kQuickstart, "--set", "run.output_dir=" + dir, "--set", "training.steps=100000"},
            dir + "-first.log");
  ASSERT_TRUE(written(dir + "/metrics.jsonl")) << read_file(dir + "-first.log");
  const std::string holder = read_file(dir + "/.trainer.lock");
  ASSERT_EQ(holder.rfind("pid " + std::to_string(first.pid()) + " on ", 0), 0u) << holder;
  const CommandResult second = run(dir, "--set training.steps=2");
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(says(second, "run.output_dir " + dir + " is in use by another trainer run (" + holder + ")"))
      << second.output;
  // Another output directory, the first run's checkpoints: refused too.
  const CommandResult into_checkpoints =
      run(other, "--set training.steps=2 --set checkpoint.dir=" + dir + "/checkpoints");
  EXPECT_EQ(into_checkpoints.exit_code, 2) << into_checkpoints.output;
  EXPECT_TRUE(says(into_checkpoints, "checkpoint.dir " + dir + "/checkpoints is in use by another trainer run"))
      << into_checkpoints.output;
  first.signal(SIGKILL);
  EXPECT_EQ(first.wait(), 128 + SIGKILL);
  // The lock of a killed run is not stale: the kernel released it.
  EXPECT_EQ(run(dir, "--set training.steps=2").exit_code, 0);
}

TEST(HostileInput, EveryCheckpointCorruptIsAnErrorNotAFreshStart) {
  const std::string dir = scratch_dir("HiCorrupt");
  ASSERT_EQ(run(dir, "--set training.steps=4 --set checkpoint.interval=2").exit_code, 0);
  const std::string metrics = read_file(dir + "/metrics.jsonl");
  for (const char* step : {"step-00000002", "step-00000004"}) {
    const std::string shard = dir + "/checkpoints/" + step + "/rank-00000.safetensors";
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  const CommandResult resumed = run(dir, "--set training.steps=6 --set checkpoint.resume=auto");
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_TRUE(says(resumed, "none of the 2 checkpoints")) << resumed.output;
  EXPECT_EQ(read_file(dir + "/metrics.jsonl"), metrics);
}

TEST(HostileInput, CompareMatchesStepsAndRejectsWhatItCannotCompare) {
  const std::string a = scratch_dir("HiCompareA"), b = scratch_dir("HiCompareB");
  ASSERT_EQ(run(a, "--set training.steps=3").exit_code, 0);
  const std::string metrics = read_file(a + "/metrics.jsonl");
  // The same records shifted by 100 steps share no step with the first run.
  std::string shifted = metrics;
  for (const char* step : {"\"step\":3", "\"step\":2", "\"step\":1"}) {
    const size_t at = shifted.find(step);
    ASSERT_NE(at, std::string::npos) << metrics;
    shifted.replace(at, std::string(step).size(), std::string(step) + "01");
  }
  write_file(b + "/metrics.jsonl", shifted);
  CommandResult result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "no step in common")) << result.output;
  write_file(b + "/metrics.jsonl", "");
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(says(result, "no step records")) << result.output;
  write_file(b + "/metrics.jsonl", "{\"step\": 1, \"grad_norm\": 1.0}\n");
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(says(result, "record 1 has no numeric 'loss'")) << result.output;
  result = trainer("compare " + a + " " + scratch_dir("HiCompareMissing") + "/nothing");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(says(result, "no metrics file")) << result.output;
  for (const char* rtol : {"-1", "nan", "inf"}) {
    result = trainer(std::string("compare --rtol ") + rtol + " " + a + " " + a);
    EXPECT_EQ(result.exit_code, 2) << rtol << "\n" << result.output;
  }
  // A shorter run compares on the steps both have, and says so.
  const std::string first = metrics.substr(0, metrics.find('\n') + 1);
  write_file(b + "/metrics.jsonl", first);
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(says(result, "1 steps are in every run")) << result.output;
  // So does a run still writing its next record (the last line torn): that record is left out, named.
  write_file(b + "/metrics.jsonl", first + metrics.substr(first.size(), 20));
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(says(result, b + "/metrics.jsonl:2: an incomplete last record")) << result.output;
  EXPECT_TRUE(says(result, "1 steps are in every run")) << result.output;
  // A malformed line before the last is bad input, by file and line.
  write_file(b + "/metrics.jsonl", metrics.substr(first.size(), 20) + "\n" + first);
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, b + "/metrics.jsonl:1: malformed metrics record")) << result.output;
}

TEST(HostileInput, RecipeValuesThatRunWouldRejectFailBeforeTraining) {
  const std::string dir = scratch_dir("HiRecipe");
  // validate applies run's batch checks with the recipe's workers.
  CommandResult result =
      trainer("validate " + kQuickstart + " --set distributed.nproc=3 --set training.global_batch_size=8");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "global_batch_size")) << result.output;
  result = run(dir, "--set optimizer.lr=inf");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "optimizer.lr")) << result.output;
  write_file(dir + "/a-file", "not a directory");
  result = run(dir + "/out", "--set checkpoint.dir=" + dir + "/a-file");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "is a file")) << result.output;
  EXPECT_FALSE(fs::exists(dir + "/out/metrics.jsonl")) << "no training step ran";
  // A checkpoint.dir where the run writes a file, or holding the output directory, is refused before either
  // directory is made (a directory made at out/model.safetensors would cost the run its weights).
  for (const auto& [checkpoints, message] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/made/model.safetensors",
            "is or lies inside the run's final weights (" + dir + "/made/model.safetensors)"},
           {dir + "/made/profile/c", "is or lies inside the profiler's directory"},
           {dir + "/made", "is or contains the run's output directory " + dir + "/made"},
           {dir, "is or contains the run's output directory " + dir + "/made"}}) {
    result = run(dir + "/made", "--set checkpoint.dir=" + checkpoints);
    EXPECT_EQ(result.exit_code, 2) << checkpoints << "\n" << result.output;
    EXPECT_TRUE(says(
        result, "[checkpoint] dir: expected a directory of its own for checkpoints; " + checkpoints + " " + message))
        << result.output;
    EXPECT_FALSE(fs::exists(dir + "/made")) << checkpoints;
  }
  // validate refuses what run refuses before training, the world size taken
  // from distributed.nproc: the components' own checks included.
  for (const auto& [keys, message] : std::vector<std::pair<std::string, std::string>>{
           {"--set distributed.nproc=2 --set strategy.name=zero2 --set strategy.shard_group_size=3",
            "shard_group_size: expected a divisor of the world size 2"},
           {"--set checkpoint.dir=" + dir + "/a-file", "is a file"},
           {"--set run.output_dir=" + dir + "/a-file", "[run] output_dir"},
           {"--set run.profile_start=999", "run.profile_start"},
           {"--set model.num_attention_heads=5", "num_attention_heads"}}) {
    result = trainer("validate " + kQuickstart + " " + keys);
    EXPECT_EQ(result.exit_code, 2) << keys << "\n" << result.output;
    EXPECT_TRUE(says(result, message)) << keys << "\n" << result.output;
  }
}

TEST(HostileInput, HuggingFaceConfigAndWeightsAreCheckedLikeTheRecipe) {
  const std::string trained = scratch_dir("HiHfTrained");
  ASSERT_EQ(run(trained, "--set training.steps=1").exit_code, 0);
  const std::string hf = scratch_dir("HiHf");
  const std::string recipe = write_file(hf + "-recipe.toml", "[model]\nname = 'qwen2'\nhf_dir = '" + hf +
                                                                 "'\n[dataset]\nname = 'synthetic'\nseq_len = 32\n"
                                                                 "vocab_size = 64\n[training]\nsteps = 1\n"
                                                                 "micro_batch_size = 8\n[run]\noutput_dir = '" +
                                                                 hf + "-out'\n");
  const std::string config = read_file(trained + "/config.json");
  fs::copy_file(trained + "/model.safetensors", hf + "/model.safetensors");
  write_file(hf + "/config.json", config);
  ASSERT_EQ(trainer("run " + recipe).exit_code, 0) << "the directory itself loads";
  for (const auto& [from, to, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"hidden_size\": 64", "\"hidden_size\": -64", "'hidden_size' = -64 is outside"},
           {"\"vocab_size\": 64", "\"vocab_size\": 1000000000000", "'vocab_size' = 1000000000000 is outside"},
           {"\"rope_theta\": 10000", "\"rope_theta\": -1", "'rope_theta' = -1 is outside"},
           {"\"hidden_size\": 64", "\"hidden_size\": 64.5", "'hidden_size' must be an integer"},
           {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1",
            "12 tensor(s) the model (num_hidden_layers = 1)"}}) {
    write_file(hf + "/config.json", config);
    replace_in_file(hf + "/config.json", from, to);
    const CommandResult result = trainer("run " + recipe);
    EXPECT_EQ(result.exit_code, 2) << to << "\n" << result.output;
    EXPECT_TRUE(says(result, message)) << result.output;
    if (message.find("is outside") != std::string::npos || message.find("integer") != std::string::npos) {
      EXPECT_TRUE(says(result, hf + "/config.json")) << "the error names config.json\n" << result.output;
      // validate reads config.json as run does (the weights are not loaded).
      const CommandResult valid = trainer("validate " + recipe);
      EXPECT_EQ(valid.exit_code, 2) << to << "\n" << valid.output;
      EXPECT_TRUE(says(valid, message)) << valid.output;
    }
  }
  const CommandResult directory = run(scratch_dir("HiInitFrom"), "--set model.init_from=" + hf);
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_TRUE(says(directory, "is not a regular file")) << directory.output;
}

// A recipe with a small qwen2 and `dataset` (the [dataset] table's lines).
std::string data_recipe(const std::string& dir, const std::string& dataset) {
  return write_file(dir + "/recipe.toml", "[run]\noutput_dir = '" + dir +
                                              "/run'\n[model]\nname = 'qwen2'\n"
                                              "vocab_size = 64\nhidden_size = 16\nintermediate_size = 32\n"
                                              "num_attention_heads = 2\nnum_key_value_heads = 1\n[dataset]\n" +
                                              dataset + "[training]\nsteps = 2\nmicro_batch_size = 2\n");
}

TEST(HostileInput, BadDataFailsAtStartNamingFileAndPlace) {
  const std::string dir = scratch_dir("HiData");
  // An id beyond the vocabulary deep in a tokens file: found before training.
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 64);
  tokens[15000] = 100;
  std::ofstream(dir + "/tokens.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), 40000);
  CommandResult result =
      trainer("run " + data_recipe(dir, "name = 'tokens'\npath = '" + dir +
                                            "/tokens.bin'\ndtype = 'uint16'\nseq_len = 16\nvocab_size = 64\n"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "token 100 at position 15000")) << result.output;
  EXPECT_FALSE(fs::exists(dir + "/run"));  // refused after it was made: removed again
  // Ids that are not integers, whatever they would round to.
  for (const std::string id : {"2.5", "\"2\"", "1e2"}) {
    write_file(dir + "/ids.jsonl", "{\"prompt_ids\": [1, " + id + "], \"completion_ids\": [3]}\n");
    result = trainer("run " + data_recipe(dir, "name = 'jsonl'\npath = '" + dir + "/ids.jsonl'\nvocab_size = 64\n"));
    EXPECT_EQ(result.exit_code, 2) << id << "\n" << result.output;
    EXPECT_TRUE(says(result, "ids.jsonl:1: \"prompt_ids\"[1] is not an integer token id")) << result.output;
  }
  // Every completion cut off by truncation: nothing to train on, said at start.
  write_file(dir + "/long.jsonl", "{\"prompt_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9], \"completion_ids\": [3]}\n");
  result = trainer("run " +
                   data_recipe(dir, "name = 'jsonl'\npath = '" + dir + "/long.jsonl'\nvocab_size = 64\nseq_len = 4\n"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "no record has a target token after truncation to seq_len = 4")) << result.output;
  // A FIFO as a data file would block forever: refused at once.
  ASSERT_EQ(run_command("mkfifo " + dir + "/fifo").exit_code, 0);
  for (const char* kind : {"jsonl", "tokens"}) {
    result = run_command(
        "timeout 60 " + std::string(TRAINER_BINARY) + " run " +
        data_recipe(dir, std::string("name = '") + kind + "'\npath = '" + dir + "/fifo'\nvocab_size = 64\n"));
    EXPECT_EQ(result.exit_code, 2) << kind << "\n" << result.output;
    EXPECT_TRUE(says(result, "is not one")) << result.output;
  }
  // A directory as the recipe.
  result = trainer("run " + dir);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(says(result, dir + ": not a regular file")) << result.output;
}

TEST(HostileInput, ExportNeverReplacesWeightsAlreadyWritten) {
  const std::string dir = scratch_dir("HiExport");
  ASSERT_EQ(run(dir, "--set training.steps=1").exit_code, 0);
  const std::string weights = read_file(dir + "/model.safetensors");
  CommandResult result = trainer("export " + dir + " --to " + dir);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "is the directory exported from")) << result.output;
  EXPECT_EQ(read_file(dir + "/model.safetensors"), weights);
  const std::string to = scratch_dir("HiExportTo");
  ASSERT_EQ(trainer("export " + dir + " --to " + to).exit_code, 0);
  result = trainer("export " + dir + " --to " + to);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_TRUE(says(result, "already holds a model.safetensors")) << result.output;
  // Nor another model's config.json: refused, the file as it was, nothing written.
  const std::string other = scratch_dir("HiExportOther");
  write_file(other + "/config.json", "{\"model_type\": \"other\"}\n");
  result = trainer("export " + dir + " --to " + other);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "already holds a config.json")) << result.output;
  EXPECT_EQ(read_file(other + "/config.json"), "{\"model_type\": \"other\"}\n");
  EXPECT_FALSE(fs::exists(other + "/model.safetensors"));
  // An export killed part-way leaves only files of its own (model.safetensors.tmp-XXXXXX), which the next
  // removes; one that fails removes the directory it made; one at a time writes into a directory.
  const std::string again = scratch_dir("HiExportAgain");
  write_file(again + "/model.safetensors.tmp-k1L2m3", "half a model");
  write_file(again + "/README.md", "the user's\n");
  result = trainer("export " + dir + " --to " + again);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(says(result, again + "/model.safetensors.tmp-k1L2m3: left by an export stopped while writing "
                                   "model.safetensors; removed"))
      << result.output;
  EXPECT_EQ(read_file(again + "/model.safetensors"), weights);
  EXPECT_EQ(temporaries_in(again), std::vector<std::string>{});
  EXPECT_EQ(read_file(again + "/README.md"), "the user's\n");
  EXPECT_FALSE(fs::exists(again + "/.export.lock"));
  result = trainer("export " + dir + "/checkpoints --to " + dir + "/made/hf");  // no weights there
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_FALSE(fs::exists(dir + "/made"));  // nor the missing parent it made
  // All or nothing: a second file that fails takes the first with it.
  result = run_command("TRAINER_FAULT_INJECT=export-config " + std::string(TRAINER_BINARY) + " export " + dir +
                       " --to " + again + "-full");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(says(result, again + "-full/config.json: write failed")) << result.output;
  EXPECT_FALSE(fs::exists(again + "-full"));
  // Killed between its two files: the weights alone are left, and the lock's record says whose they are;
  // the next export removes them as the killed one's and writes both.
  const std::string killed = scratch_dir("HiExportKilled");
  result = run_command("TRAINER_FAULT_INJECT=export-killed " + std::string(TRAINER_BINARY) + " export " + dir +
                       " --to " + killed);
  EXPECT_NE(result.exit_code, 0) << result.output;
  ASSERT_TRUE(fs::exists(killed + "/model.safetensors"));
  ASSERT_FALSE(fs::exists(killed + "/config.json"));
  result = trainer("export " + dir + " --to " + killed);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(says(result, killed + "/model.safetensors: left by an export stopped before it ended")) << result.output;
  EXPECT_EQ(read_file(killed + "/model.safetensors"), weights);
  EXPECT_EQ(read_file(killed + "/config.json"), read_file(dir + "/config.json"));
  EXPECT_FALSE(fs::exists(killed + "/.export.lock"));
  const std::string odd = scratch_dir("HiExportOddConfig");  // a run directory whose config.json is a directory
  fs::copy_file(dir + "/model.safetensors", odd + "/model.safetensors");
  fs::create_directories(odd + "/config.json");
  result = trainer("export " + odd + " --to " + odd + "-hf");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, odd + "/config.json: not a regular file")) << result.output;
  EXPECT_FALSE(fs::exists(odd + "-hf"));
  const std::string busy = scratch_dir("HiExportBusy");
  const int held = open((busy + "/.export.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);  // this test holds it
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
  result = trainer("export " + dir + " --to " + busy);
  close(held);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "--to " + busy + " is being written by another trainer export")) << result.output;
  EXPECT_FALSE(fs::exists(busy + "/model.safetensors"));
}

// A checkpoint past training.steps: resuming it would report steps it never
// ran (summary.json said steps 3, applied_updates 6). Refused naming the key.
TEST(HostileInput, ResumingACheckpointPastTheLastStepIsRefused) {
  const std::string dir = scratch_dir("ResumePastEnd");
  ASSERT_EQ(run(dir, "--set training.steps=6 --set checkpoint.interval=6").exit_code, 0);
  const auto result = run(dir, "--set training.steps=3 --set checkpoint.resume=auto");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "training.steps")) << result.output;
  EXPECT_TRUE(says(result, "the resumed checkpoint's step 6")) << result.output;
}

// distributed.timeout_s converts to int64 milliseconds: a bound keeps it far
// inside (9.3e15 s would overflow).
TEST(HostileInput, AnUnboundedTimeoutIsRefused) {
  const auto result = trainer("validate " + kQuickstart + " --set distributed.timeout_s=1e16");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "distributed.timeout_s")) << result.output;
}

// trainer_plugin_v1 exported as a function, as a null pointer, or a
// describe() that throws an int: each is named (exit 2), where calling
// through them crashed or aborted every command that scanned the directory.
TEST(HostileInput, AWronglyExportedEntryPointIsNamedNotACrash) {
  const std::string dir = scratch_dir("HiEntryPoint");
  const std::string fixtures = std::string(TRAINER_FIXTURE_DIR) + "/bad-entry/trainer-fixture-bad-entry-";
  for (const auto& [which, message] : std::vector<std::pair<std::string, std::string>>{
           {"1", "is a function, not the pointer TRAINER_PLUGIN exports"},
           {"2", "is a null pointer"},
           {"3", "describe() threw something that is not a std::exception"}}) {
    const std::string file = fixtures + which + ".so";
    const std::string recipe = write_file(dir + "/recipe.toml",
                                          "[model]\nname = 'qwen2'\n[dataset]\nname = "
                                          "'synthetic'\n[[logger]]\nname = '" +
                                              file + "'\n");
    const CommandResult result = trainer("validate " + recipe);
    EXPECT_EQ(result.exit_code, 2) << file << "\n" << result.output;
    EXPECT_TRUE(says(result, file)) << result.output;
    EXPECT_TRUE(says(result, message)) << result.output;
  }
}

// The second hostile round. Each test fails on the code before its fix.

// A run refused for bad input writes nothing: the directory's recipe.toml
// and metrics.jsonl (an earlier run's) stay byte for byte.
TEST(HostileInput, ARefusedRunLeavesTheOutputDirectoryAsItWas) {
  const std::string dir = scratch_dir("HiRefusedKeeps");
  ASSERT_EQ(run(dir, "--set training.steps=2").exit_code, 0);
  const std::string recipe = read_file(dir + "/recipe.toml"), metrics = read_file(dir + "/metrics.jsonl");
  for (const std::string& bad :
       {std::string("--set checkpoint.resume=") + dir + "/no-such-checkpoint",
        std::string("--set run.profile_start=99"), std::string("--set training.micro_batch_size=0")}) {
    const CommandResult refused = run(dir, "--set training.steps=3 " + bad);
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_EQ(read_file(dir + "/recipe.toml"), recipe) << bad;
    EXPECT_EQ(read_file(dir + "/metrics.jsonl"), metrics) << bad;
  }
  // Refused after set-up made the directories (the model's vocabulary below the dataset's): those it made
  // (missing parents, a checkpoint.dir of its own) are removed again; one that was there stays, empty.
  const std::string empty = scratch_dir("HiRefusedKeepsEmpty"), above = scratch_dir("HiRefusedKeepsAbove");
  for (const std::string& out : {above + "/new/a", empty}) {
    const CommandResult refused =
        run(out, "--set model.vocab_size=8 --set checkpoint.dir=" + above + "/c --set checkpoint.interval=1");
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_TRUE(says(refused, "[model] vocab_size")) << refused.output;
  }
  EXPECT_TRUE(fs::is_empty(above));
  EXPECT_TRUE(fs::is_empty(empty));
}

// Two outputs on one file, or a logger writing over one of the run's own
// files or directories, are refused before anything is written.
TEST(HostileInput, LoggerOutputsThatCollideAreRefused) {
  const std::string dir = scratch_dir("HiLoggerPaths");
  const std::string recipe = read_file(kQuickstart);
  fs::create_directories(dir + "/run/somedir");
  for (const auto& [loggers, message] : std::vector<std::pair<std::string, std::string>>{
           {"[[logger]]\nname = 'jsonl'\n[[logger]]\nname = 'csv'\npath = 'metrics.jsonl'\n",
            "metrics.jsonl is, contains or lies inside [logger."},
           {"[[logger]]\nname = 'csv'\npath = 'recipe.toml'\n", "the run's recipe.toml"},
           {"[[logger]]\nname = 'csv'\npath = 'summary.json'\n", "the run's summary.json"},
           {"[[logger]]\nname = 'csv'\npath = 'checkpoints/x.csv'\n", "checkpoint.dir"},
           {"[[logger]]\nname = 'tensorboard'\ndir = '.'\n", "the run's output directory"},
           {"[[logger]]\nname = 'csv'\npath = 'somedir'\n", "is a directory"},
           {"[[logger]]\nname = 'tensorboard'\ndir = 'recipe.toml'\n", "the run's recipe.toml"}}) {
    const std::string file = write_file(dir + "/recipe.toml", recipe + "\n" + loggers);
    const CommandResult refused =
        trainer("run " + file + " --set run.output_dir=" + dir + "/run --set training.steps=1");
    EXPECT_EQ(refused.exit_code, 2) << loggers << refused.output;
    EXPECT_TRUE(says(refused, message)) << loggers << refused.output;
    EXPECT_FALSE(fs::exists(dir + "/run/recipe.toml")) << loggers;
    EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl")) << loggers;
  }
}

// A logger's path may not be one of the files the run reads (the recipe, a
// dataset's tokens): `path = '../recipe.toml'` once replaced the recipe with
// CSV rows. Refused by name before anything is written; both stay as they were.
TEST(HostileInput, LoggerOutputsNeverReplaceTheRunsInputs) {
  const std::string dir = scratch_dir("HiLoggerInputs");
  std::string tokens;
  for (int i = 0; i < 400; ++i) tokens += {static_cast<char>(i * 7 % 64), '\0'};  // uint16, little-endian
  write_file(dir + "/tokens.bin", tokens);
  std::string base = read_file(kQuickstart);
  const size_t from = base.find("[dataset]"), to = base.find("[training]");
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos);
  base.replace(from, to - from,
               "[dataset]\nname = 'tokens'\npath = '" + dir + "/tokens.bin'\nseq_len = 32\nvocab_size = 64\n\n");
  for (const auto& [path, message] : std::vector<std::pair<std::string, std::string>>{
           {"../recipe.toml", "the recipe (an input of the run)"},
           {dir + "/tokens.bin", "[dataset] path (an input of the run)"}}) {
    const std::string recipe =
        write_file(dir + "/recipe.toml", base + "\n[[logger]]\nname = 'csv'\npath = '" + path + "'\n");
    const CommandResult refused =
        trainer("run " + recipe + " --set run.output_dir=" + dir + "/run --set training.steps=1");
    EXPECT_EQ(refused.exit_code, 2) << path << "\n" << refused.output;
    EXPECT_TRUE(says(refused, "[logger.1] path")) << refused.output;
    EXPECT_TRUE(says(refused, message)) << refused.output;
    EXPECT_EQ(read_file(recipe), base + "\n[[logger]]\nname = 'csv'\npath = '" + path + "'\n");
    EXPECT_EQ(read_file(dir + "/tokens.bin"), tokens);
    EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
  }
  // The same recipe with the logger's file in the run's directory trains.
  const std::string fine = write_file(dir + "/recipe.toml", base + "\n[[logger]]\nname = 'csv'\n");
  const CommandResult ran = trainer("run " + fine + " --set run.output_dir=" + dir + "/run --set training.steps=1");
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
}

// The run's own files (recipe.toml, config.json, model.safetensors, ...)
// never replace one it reads: a hand-written recipe.toml in the output
// directory, init_from naming the output directory's model.safetensors, an
// output directory that model.hf_dir or checkpoint.resume reads from, each
// refused by run.output_dir (exit 2) with every file as it was. A
// recipe.toml a run wrote runs again in place.
TEST(HostileInput, RunFilesNeverReplaceWhatTheRunReads) {
  const std::string dir = scratch_dir("HiRunInputs");
  ASSERT_EQ(run(dir, "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  const CommandResult again =
      trainer("run " + dir + "/recipe.toml --set training.steps=3 --set checkpoint.resume=auto");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const std::string step = dir + "/checkpoints/step-00000002";
  ASSERT_TRUE(fs::exists(step + "/config.json"));
  const std::string hf = scratch_dir("HiRunInputsHf");
  ASSERT_EQ(trainer("export " + dir + " --to " + hf).exit_code, 0);
  const std::string hand = scratch_dir("HiRunInputsHand");
  const std::string recipe = write_file(hand + "/recipe.toml", "# notes\n" + read_file(kQuickstart));
  const std::vector<std::string> kept = {recipe,
                                         dir + "/model.safetensors",
                                         dir + "/config.json",
                                         hf + "/config.json",
                                         hf + "/model.safetensors",
                                         step + "/config.json"};
  std::vector<std::string> before;
  for (const std::string& file : kept) before.push_back(read_file(file));
  for (const auto& [command, named] : std::vector<std::pair<std::string, std::string>>{
           {"run " + recipe + " --set run.output_dir=" + hand, "recipe.toml is the recipe"},
           {"run " + kQuickstart + " --set run.output_dir=" + dir + " --set model.init_from=" + dir +
                "/model.safetensors",
            "model.safetensors is [model] init_from"},
           {"run " + kQuickstart + " --set run.output_dir=" + hf + " --set model.hf_dir=" + hf,
            "is the directory [model] hf_dir names"},
           {"run " + kQuickstart + " --set run.output_dir=" + step + " --set checkpoint.resume=" + step,
            "is the directory [checkpoint] resume names"}}) {
    const CommandResult refused = trainer(command + " --set training.steps=3");
    EXPECT_EQ(refused.exit_code, 2) << command << "\n" << refused.output;
    EXPECT_TRUE(says(refused, "[run] output_dir: expected a directory")) << refused.output;
    EXPECT_TRUE(says(refused, named)) << named << "\n" << refused.output;
  }
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(read_file(kept[i]), before[i]) << kept[i];
  EXPECT_FALSE(fs::exists(hand + "/metrics.jsonl"));
  // Values that are not paths do not count: a run named as its output
  // directory, and one that is also a plugin's name, trains there twice.
  const std::string named = scratch_dir("HiRunInputsNamed");
  for (int twice = 0; twice < 2; ++twice) {
    const CommandResult ran = run_command("cd " + named + " && " + TRAINER_BINARY + " run " + kQuickstart +
                                          " --set run.name=qwen2 --set run.output_dir=qwen2 --set training.steps=1");
    EXPECT_EQ(ran.exit_code, 0) << ran.output;
  }
}

// With run.output_dir unset the run writes into runs/<run.name>: a name
// that leaves no directory below runs/ ("", ".", "..", "/tmp/x", "../x")
// would write config.json, model.safetensors, ... into runs/, the working
// directory or anywhere. Refused by run.name; a name with a folder in it
// stays below runs/ and is valid.
TEST(HostileInput, RunNamesStayBelowRuns) {
  const std::string dir = scratch_dir("HiRunNames");
  for (const std::string name : {"", ".", "..", "/tmp/x", "../x", "a/../.."}) {
    const CommandResult refused = run_command("cd " + dir + " && " + TRAINER_BINARY + " validate " + kQuickstart +
                                              " --set 'run.name=" + name + "' --set run.output_dir=");
    EXPECT_EQ(refused.exit_code, 2) << name << "\n" << refused.output;
    EXPECT_TRUE(says(refused, "[run] name: expected a name for the run's directory below runs/")) << refused.output;
  }
  const CommandResult nested = run_command("cd " + dir + " && " + TRAINER_BINARY + " run " + kQuickstart +
                                           " --set run.name=sweep/a --set run.output_dir= --set training.steps=1");
  EXPECT_EQ(nested.exit_code, 0) << nested.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/sweep/a/model.safetensors")) << nested.output;
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
}

// A fresh run into a directory holding another run's results (its weights
// and summary.json) replaced them without a word when the recipe had
// changed (an edited learning rate, the run's name not). Refused by
// run.output_dir (exit 2) naming the first key that differs, with every file
// as it was, also with checkpoint.resume = 'auto' and no checkpoint; the
// same recipe runs again (its loggers and checkpoint keys aside), and
// run.overwrite = true replaces them.
TEST(HostileInput, AFreshRunReplacesNoResultsOfAnotherRecipe) {
  const std::string dir = scratch_dir("HiEarlierResults");
  ASSERT_EQ(run(dir, "--set training.steps=2").exit_code, 0);
  const std::vector<std::string> files = {"model.safetensors", "summary.json", "metrics.jsonl", "recipe.toml",
                                          "config.json"};
  std::vector<std::string> before;
  for (const std::string& file : files) before.push_back(read_file(dir + "/" + file));
  const auto unchanged = [&](const std::string& what) {
    for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(read_file(dir + "/" + files[i]), before[i]) << what;
  };
  for (const auto& [args, named] : std::vector<std::pair<std::string, std::string>>{
           {"--set optimizer.lr=0.01", "[optimizer] lr: 0.003 there, 0.01 here"},
           {"--set training.steps=3 --set checkpoint.resume=auto", "[training] steps: 2 there, 3 here"},
           {"--set model.hidden_size=32", "[model] hidden_size: 64 there, 32 here"}}) {
    const CommandResult refused = run(dir, "--set training.steps=2 " + args);
    EXPECT_EQ(refused.exit_code, 2) << args << "\n" << refused.output;
    EXPECT_TRUE(says(refused, "[run] output_dir: expected a directory without another run's results; " + dir +
                                  " holds the model.safetensors and summary.json of a run with another recipe"))
        << refused.output;
    EXPECT_TRUE(says(refused, named)) << named << "\n" << refused.output;
    unchanged(args);
    // `validate` foresees it (no checkpoint here: each run would start at step 0).
    const CommandResult foreseen =
        trainer("validate " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=2 " + args);
    EXPECT_EQ(foreseen.exit_code, 2) << args << "\n" << foreseen.output;
    EXPECT_TRUE(says(foreseen, named)) << named << "\n" << foreseen.output;
  }
  EXPECT_EQ(trainer("validate " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=2").exit_code,
            0);
  // A checkpoint a killed run left half written is none: the run would start at step 0.
  fs::create_directories(dir + "/checkpoints/step-00000009.tmp");
  const CommandResult half = trainer("validate " + kQuickstart + " --set run.output_dir=" + dir +
                                     " --set training.steps=2 --set checkpoint.resume=auto --set optimizer.lr=0.01");
  EXPECT_EQ(half.exit_code, 2) << half.output;
  EXPECT_TRUE(says(half, "[optimizer] lr: 0.003 there, 0.01 here")) << half.output;
  remove_tree(dir + "/checkpoints");
  CommandResult refused;
  // The same recipe again, logged and checkpointed otherwise: its results
  // are replaced by equal ones.
  const CommandResult again =
      run(dir, "--set training.steps=2 --set checkpoint.interval=5 --set run.name=other --set logger.0.interval=1");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_file(dir + "/model.safetensors"), before[0]);
  // An earlier version's recipe.toml, without a key added since: at its
  // default here, the recipe is the same; set otherwise, it differs.
  replace_in_file(dir + "/recipe.toml", "gemm_library = 'cublaslt-timed'\n", "");
  EXPECT_EQ(run(dir, "--set training.steps=2").exit_code, 0);
  replace_in_file(dir + "/recipe.toml", "gemm_library = 'cublaslt-timed'\n", "");
  refused = run(dir, "--set training.steps=2 --set training.gemm_library=libtorch");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(says(refused, "[training] gemm_library: absent there, 'libtorch' here")) << refused.output;
  // A recipe.toml that no run wrote, or none: what made the results is unknown.
  write_file(dir + "/recipe.toml", "# notes\n" + read_file(kQuickstart));
  refused = run(dir, "--set training.steps=2");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(says(refused, "of a run whose recipe is unknown (" + dir + "/recipe.toml was not written by a run)"))
      << refused.output;
  fs::remove(dir + "/recipe.toml");
  refused = run(dir, "--set training.steps=2");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(says(refused, "of a run whose recipe is not there (" + dir + "/recipe.toml is missing)"))
      << refused.output;
  EXPECT_EQ(read_file(dir + "/model.safetensors"), before[0]);
  // Asked for, they are replaced.
  const CommandResult replaced = run(dir, "--set training.steps=2 --set optimizer.lr=0.01 --set run.overwrite=true");
  EXPECT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_NE(read_file(dir + "/model.safetensors"), before[0]);
}

// Output paths that are files: named as bad input (exit 2) before any work.
TEST(HostileInput, OutputPathsThatAreFilesAreNamed) {
  const std::string dir = scratch_dir("HiOutputFiles");
  write_file(dir + "/file", "user data\n");
  CommandResult result = run(dir + "/file", "--set training.steps=1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "[run] output_dir")) << result.output;
  ASSERT_EQ(run(dir + "/run", "--set training.steps=1").exit_code, 0);
  result = trainer("export " + dir + "/run --to " + dir + "/file");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "--to " + dir + "/file: expected a directory")) << result.output;
  EXPECT_EQ(read_file(dir + "/file"), "user data\n");
  // A directory where the run writes one of its own files: named before any
  // work (it was found after the last step, and the weights never written).
  const std::vector<std::string> names = {"recipe.toml", "model.safetensors", "config.json", "summary.json",
                                          "memory.json"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const std::string out = dir + "/blocked-" + std::to_string(i);
    fs::create_directories(out + "/" + name);
    result = run(out, "--set training.steps=1");
    EXPECT_EQ(result.exit_code, 2) << name << "\n" << result.output;
    EXPECT_TRUE(says(result, "write its " + name + "; " + out + "/" + name + " is a directory")) << result.output;
    EXPECT_FALSE(fs::exists(out + "/metrics.jsonl")) << name << ": it trained first";
  }
}

// A fresh run never mixes its checkpoints with another run's, a resume from
// an older checkpoint never interleaves with newer ones, and pruning removes
// only this run's own older checkpoints.
TEST(HostileInput, CheckpointsOfAnotherRunAreNeitherMixedNorPruned) {
  const std::string dir = scratch_dir("HiLineage"), other = scratch_dir("HiLineageOther");
  ASSERT_EQ(run(dir, "--set training.steps=4 --set checkpoint.interval=1 --set checkpoint.keep=2").exit_code, 0);
  const std::string ckpt = dir + "/checkpoints/";
  ASSERT_TRUE(fs::exists(ckpt + "step-00000003") && fs::exists(ckpt + "step-00000004"));
  EXPECT_FALSE(fs::exists(ckpt + "step-00000002")) << "keep = 2 keeps the two newest";
  const std::string metrics = read_file(dir + "/metrics.jsonl");
  CommandResult result = run(dir, "--set training.steps=6 --set checkpoint.interval=1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "holds checkpoints of an earlier run")) << result.output;
  result = trainer("validate " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=6");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "holds checkpoints of an earlier run")) << result.output;
  result = run(dir, "--set training.steps=6 --set checkpoint.resume=" + ckpt + "step-00000003");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "holds the newer " + ckpt + "step-00000004")) << result.output;
  EXPECT_EQ(read_file(dir + "/metrics.jsonl"), metrics);
  // Another run's checkpoint, older than ours, in our directory: resuming
  // ours and pruning (keep = 2) leaves it alone.
  ASSERT_EQ(run(other, "--set training.steps=1 --set checkpoint.interval=1").exit_code, 0);
  fs::rename(other + "/checkpoints/step-00000001", ckpt + "step-00000001");
  result = run(dir,
               "--set training.steps=6 --set checkpoint.interval=1 --set checkpoint.keep=2 "
               "--set checkpoint.resume=auto");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(ckpt + "step-00000001")) << "another run's checkpoint was pruned";
  EXPECT_FALSE(fs::exists(ckpt + "step-00000004"));
  EXPECT_TRUE(fs::exists(ckpt + "step-00000005") && fs::exists(ckpt + "step-00000006"));
}

// The manifest's decay flags decide the flat layout: a checkpoint whose
// parameter table differs only there is refused naming the parameter; and a
// resume under another seed (another data order) is refused.
TEST(HostileInput, ACheckpointOfAnotherLayoutOrSeedIsRefused) {
  const std::string dir = scratch_dir("HiDecay");
  // intermediate_size 1: gate_proj.weight (decayed) and input_layernorm.weight
  // (not) have hidden_size elements each, so their decay flags can trade
  // places with every group's size and range unchanged.
  const std::string shape = "--set model.intermediate_size=1 ";
  ASSERT_EQ(run(dir, shape + "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  const std::string manifest = dir + "/checkpoints/step-00000002/manifest.json";
  const std::string original = read_file(manifest);
  CommandResult result = run(dir, shape + "--set training.steps=3 --set checkpoint.resume=auto --set run.seed=99");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "seed")) << result.output;
  Json edited = json_parse(original);
  for (Json& p : edited["parameters"]) {
    const std::string name = p["name"].get<std::string>();
    if (name == "model.layers.0.mlp.gate_proj.weight") p["decay"] = false;
    if (name == "model.layers.0.input_layernorm.weight") p["decay"] = true;
  }
  write_file(manifest, edited.dump(1) + "\n");
  reseal(manifest);
  result = run(dir, shape + "--set training.steps=3 --set checkpoint.resume=auto");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result,
                   "'model.layers.0.mlp.gate_proj.weight' is not weight-decayed in the checkpoint, "
                   "weight-decayed in the model"))
      << result.output;
  write_file(manifest, original);
  reseal(manifest);
  EXPECT_EQ(run(dir, shape + "--set training.steps=3 --set checkpoint.resume=auto").exit_code, 0);
}

// The data a checkpoint was made of changed at the same path (a token file
// grown by appended documents): the resumed run went on over another data
// order without a word. Refused naming both sizes (exit 2), the metrics as
// they were; with the data as it was the checkpoint resumes, and a manifest
// written before the size was recorded resumes too.
TEST(HostileInput, ACheckpointOfOtherDataIsRefused) {
  const std::string recipe = testing::token_file_quickstart("HiDataChanged", 40);
  ASSERT_FALSE(recipe.empty());
  const std::string data = fs::path(recipe).parent_path().string();
  const std::string dir = data + "/run";
  const std::string common = "run " + recipe + " --set run.output_dir=" + dir + " --set checkpoint.interval=2 ";
  ASSERT_EQ(trainer(common + "--set training.steps=2").exit_code, 0);
  const std::string manifest = dir + "/checkpoints/step-00000002/manifest.json";
  EXPECT_EQ(json_parse(read_file(manifest)).at("dataset_samples"), 40);
  const std::string other = data + "/other";  // a copy, for an earlier version's manifest below
  fs::create_directories(other);
  fs::copy(dir + "/checkpoints", other + "/checkpoints", fs::copy_options::recursive);
  const std::string tokens = read_file(data + "/tokens.bin");
  const std::string metrics = read_file(dir + "/metrics.jsonl");
  write_file(data + "/tokens.bin", tokens + tokens.substr(0, 32 * 8 * 2));  // 8 windows more
  const CommandResult refused = trainer(common + "--set training.steps=4 --set checkpoint.resume=auto");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(says(refused, manifest + ": written by a run whose dataset gave 40 samples; this run's gives 48"))
      << refused.output;
  EXPECT_EQ(read_file(dir + "/metrics.jsonl"), metrics);
  // Without the field (an earlier version's manifest) the size is not known: it resumes.
  const std::string copied = other + "/checkpoints/step-00000002/manifest.json";
  Json without = json_parse(read_file(copied));
  without.erase("dataset_samples");
  write_file(copied, without.dump(1) + "\n");
  reseal(copied);
  const CommandResult legacy = trainer("run " + recipe + " --set run.output_dir=" + other +
                                       " --set training.steps=3 --set checkpoint.resume=auto");
  EXPECT_EQ(legacy.exit_code, 0) << legacy.output;
  write_file(data + "/tokens.bin", tokens);
  const CommandResult resumed = trainer(common + "--set training.steps=4 --set checkpoint.resume=auto");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// A resume under another recipe (a longer schedule, another warm-up) keeps
// the recipe its earlier steps were trained with: every checkpoint holds its
// recipe.toml (checksummed), kept as recipe.until-step-N.toml beside the
// new recipe.toml. A resume under the same recipe keeps none; a resume from
// an earlier step removes those of the steps it trains again.
TEST(HostileInput, AResumeUnderAnotherRecipeKeepsTheEarlierOne) {
  const std::string dir = scratch_dir("HiRecipeHistory");
  const std::string common = "--set checkpoint.interval=2 --set checkpoint.keep=3 --set checkpoint.resume=auto ";
  const auto kept = [&dir] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("recipe.until", 0) == 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  ASSERT_EQ(run(dir, common + "--set training.steps=2").exit_code, 0);
  const std::string first = read_file(dir + "/recipe.toml");
  const std::string checkpoints = dir + "/checkpoints/step-0000000";
  EXPECT_EQ(read_file(checkpoints + "2/recipe.toml"), first);
  const CommandResult same = run(dir, common + "--set training.steps=2");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(kept(), std::vector<std::string>{});

  const CommandResult longer = run(dir, common + "--set training.steps=4 --set lr_schedule.warmup_steps=3");
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(
      says(longer, "[lr_schedule] warmup_steps: 10 there, 3 here): kept as " + dir + "/recipe.until-step-2.toml"))
      << longer.output;
  EXPECT_EQ(kept(), std::vector<std::string>{"recipe.until-step-2.toml"});
  EXPECT_EQ(read_file(dir + "/recipe.until-step-2.toml"), first);
  const std::string second = read_file(dir + "/recipe.toml");
  EXPECT_NE(second.find("warmup_steps = 3"), std::string::npos) << second;
  EXPECT_EQ(read_file(checkpoints + "4/recipe.toml"), second);
  const CommandResult compared = trainer("compare " + dir + " " + dir);
  EXPECT_TRUE(says(compared, "note: " + dir +
                                 ": resumed under another recipe; its earlier steps were trained with "
                                 "recipe.until-step-2.toml"))
      << compared.output;

  ASSERT_EQ(run(dir, common + "--set training.steps=6 --set lr_schedule.warmup_steps=3").exit_code, 0);
  EXPECT_EQ(kept(), (std::vector<std::string>{"recipe.until-step-2.toml", "recipe.until-step-4.toml"}));
  EXPECT_EQ(read_file(dir + "/recipe.until-step-4.toml"), second);

  // Back to step 2 (the later checkpoints removed by hand): the steps after
  // it are trained again, and the recipe kept for step 4 goes with them.
  remove_tree(checkpoints + "4");
  remove_tree(checkpoints + "6");
  const CommandResult again = run(dir, common + "--set training.steps=4 --set lr_schedule.warmup_steps=3");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(kept(), std::vector<std::string>{"recipe.until-step-2.toml"});
  EXPECT_EQ(read_file(dir + "/recipe.until-step-2.toml"), first);

  // The recipe is checksummed with the checkpoint.
  replace_in_file(checkpoints + "4/recipe.toml", "warmup_steps = 3", "warmup_steps = 4");
  const CommandResult damaged = run(dir, "--set training.steps=6 --set checkpoint.resume=" + checkpoints + "4");
  EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
  EXPECT_TRUE(says(damaged, checkpoints + "4/recipe.toml: checksum")) << damaged.output;
}

// What a killed run leaves (a checkpoint half written, its own files half
// written beside their names) is removed by the next run in the directory,
// which holds its lock; files of the user's are not.
TEST(HostileInput, WhatAKilledRunLeftIsRemoved) {
  const std::string dir = scratch_dir("HiKilledLeft");
  const std::string checkpoints = dir + "/checkpoints";
  ASSERT_EQ(run(dir, "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  for (const char* name : {"model.safetensors.tmp-a1B2c3", "summary.json.tmp-Zz9Yy8", "model.safetensors.tmp-notes",
                           "notes.txt.tmp-a1B2c3", "metrics.jsonl.tmp-Q1w2E3"}) {
    write_file(dir + "/" + name, "half\n");
  }
  fs::create_directories(checkpoints + "/step-00000007.tmp");
  write_file(checkpoints + "/step-00000007.tmp/rank-00000.safetensors", "half\n");
  fs::create_directories(checkpoints + "/step-x.tmp");
  const CommandResult resumed =
      run(dir, "--set training.steps=3 --set checkpoint.interval=2 --set checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(says(resumed, checkpoints + "/step-00000007.tmp: an incomplete checkpoint (a run stopped while "
                                          "writing it); removed"))
      << resumed.output;
  EXPECT_TRUE(says(resumed, dir + "/model.safetensors.tmp-a1B2c3: left by a run stopped while writing "
                                  "model.safetensors; removed"))
      << resumed.output;
  // A logger's file too (the jsonl logger's metrics.jsonl, rewritten on a resume).
  EXPECT_TRUE(says(resumed, dir + "/metrics.jsonl.tmp-Q1w2E3: left by a run stopped while writing metrics.jsonl; "
                                  "removed"))
      << resumed.output;
  EXPECT_EQ(temporaries_in(checkpoints), std::vector<std::string>{"step-x.tmp"});
  EXPECT_EQ(temporaries_in(dir), (std::vector<std::string>{"model.safetensors.tmp-notes", "notes.txt.tmp-a1B2c3"}));
}

// A checkpoint written before data order "feistel-1" (no run_id, the old
// sampler text, the recipe-only fingerprint) resumes, keeping its order.
TEST(HostileInput, ACheckpointOfThePreviousDataOrderResumesWithIt) {
  const std::string dir = scratch_dir("HiLegacyOrder");
  ASSERT_EQ(run(dir, "--set training.steps=2 --set checkpoint.interval=2").exit_code, 0);
  const std::string manifest = dir + "/checkpoints/step-00000002/manifest.json";
  const CommandResult valid =
      trainer("validate " + kQuickstart + " --set run.output_dir=" + dir + " --set checkpoint.resume=auto");
  ASSERT_EQ(valid.exit_code, 0) << valid.output;
  // The previous fingerprint is what `validate` prints as the recipe's.
  const size_t at = valid.output.find("recipe fingerprint ");
  ASSERT_NE(at, std::string::npos) << valid.output;
  const std::string legacy = valid.output.substr(at + 19, 16);
  std::string text = read_file(manifest);
  const size_t f = text.find("\"fingerprint\": \"");
  text.replace(f + 16, 16, legacy);
  const size_t s = text.find("\"feistel-1\"");
  ASSERT_NE(s, std::string::npos);
  text.replace(s, 11, "\"a function of (seed, step): resumes at step 2\"");
  write_file(manifest, text);
  reseal(manifest);
  const CommandResult resumed = run(dir, "--set training.steps=3 --set checkpoint.resume=auto");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(says(resumed, "the run keeps its Fisher-Yates order")) << resumed.output;
}

// token ids are int32 in a Sample: a vocabulary past 2^31 is refused.
TEST(HostileInput, ATokensVocabularyPastInt32IsRefused) {
  const std::string dir = scratch_dir("HiVocab");
  std::vector<uint32_t> tokens(100, 7);
  std::ofstream(dir + "/tokens.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), 400);
  const CommandResult result = trainer(
      "validate " + data_recipe(dir, "name = 'tokens'\npath = '" + dir +
                                         "/tokens.bin'\ndtype = 'uint32'\nseq_len = 8\nvocab_size = 2147483649\n"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(says(result, "vocab_size")) << result.output;
}

}  // namespace
}  // namespace trainer
