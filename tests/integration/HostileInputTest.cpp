// Hostile but realistic input and faults: each is a clear error (exit 2)
// naming what is wrong, never a crash, and never the loss of what an
// earlier run wrote.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "TestSupport.h"

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
  std::string manifest = read_file(step + "/manifest.json");
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

TEST(HostileInput, SecondRunIntoABusyOutputDirectoryIsRefused) {
  const std::string dir = scratch_dir("HiLock");
  // A first run that lasts a while, in the background.
  const std::string first_log = dir + "-first.log";
  ASSERT_EQ(std::system((std::string(TRAINER_BINARY) + " run " + kQuickstart + " --set run.output_dir=" + dir +
                         " --set training.steps=100000 > " + first_log + " 2>&1 &")
                            .c_str()),
            0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir + "/metrics.jsonl") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(dir + "/metrics.jsonl")) << read_file(first_log);
  const std::string holder = read_file(dir + "/.trainer.lock");
  const CommandResult second = run(dir, "--set training.steps=2");
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(says(second, "is in use by another trainer run (" + holder + ")")) << second.output;
  const pid_t first = static_cast<pid_t>(std::stol(holder.substr(4)));  // "pid N on host"
  kill(first, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
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
  write_file(b + "/metrics.jsonl", metrics.substr(0, metrics.find('\n') + 1));
  result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(says(result, "1 steps are in every run")) << result.output;
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
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
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

}  // namespace
}  // namespace trainer
