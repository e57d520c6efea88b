// The command line: exit codes (0 ok, 2 bad input, 1 training failure), the
// run's outputs, and every recipe in configs/ running. One file: its tests
// drive the one binary through the same recipe helpers below.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <thread>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Tokenizer.h"

namespace trainer {
namespace {

bool contains(const CommandResult& result, const std::string& text) {
  return result.output.find(text) != std::string::npos;
}

TEST(Cli, RunWritesResolvedRecipeAndMetrics) {
  const std::string dir = scratch_dir("CliRun");
  const CommandResult result =
      trainer("run " + kQuickstart + " --set run.output_dir=" + dir + " --set training.steps=4");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result, "step 4/4 | loss ")) << result.output;  // the console progress line
  const std::vector<MetricsRow> rows = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  for (const char* key : {"step", "loss", "grad_norm", "lr", "target_tokens", "samples"}) {
    EXPECT_EQ(rows[0].count(key), 1u) << key;
  }
  EXPECT_EQ(rows[3].at("step"), 4);
  EXPECT_EQ(rows[0].at("samples"), 8);
  EXPECT_GT(rows[0].at("target_tokens"), 0);
  // The resolved recipe records the override and validates on its own.
  const std::string resolved = read_file(dir + "/recipe.toml");
  EXPECT_NE(resolved.find("steps = 4"), std::string::npos) << resolved;
  const CommandResult again = trainer("validate " + dir + "/recipe.toml");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST(Cli, BadRecipesExitWithTwoAndNameTheProblem) {
  const std::string dir = scratch_dir("CliBad");
  struct Case {
    std::string recipe;
    std::string expected;
  };
  const std::string base = "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n";
  const std::vector<Case> cases = {
      {"[training\nsteps = 3\n", "bad.toml:1:"},
      {base + "[training]\nstepz = 3\n", "unknown key 'stepz' (did you mean 'steps'?)"},
      {base + "[training]\nsteps = 2.5\n", "[training] steps = 2.5: expected an integer"},
      {base + "[optimizer]\nlr = -1.0\n", "[optimizer] lr = -1.0: expected a finite number >= 0"},
      {"[model]\nname = 'gpt9'\n[dataset]\nname = 'synthetic'\n", "unknown model plugin 'gpt9'; available: qwen2"},
      {base + "[model]\n", "bad.toml"},  // a table defined twice is a TOML error
      {base + "[training]\nprecision = 'fp8'\n",
       "bad.toml:6:13: [training] precision: expected 'bf16' or 'fp32' with run.device = 'cpu'"},
      {base + "[training]\nprecision = 'fp8'\n", "FP8 GEMMs need CUDA"},
      {base + "[run]\ndevice = 'cuda'\n[training]\nprecision = 'fp8'\nreproducible = true\n",
       "its bits cannot be the same across splits"},
      {base + "[training]\nfp8_scaling = 'rowwise'\n",
       "[training] fp8_scaling: expected 'tensorwise' (the default) with training.precision = 'fp32'"},
      {base + "[training]\nprecision = 'bf16'\nfp8_scaling = 'rowwise'\n", "this run computes in bf16"},
      {base + "[training]\nfp8_scaling = 'blockwise'\n", "fp8_scaling"},
      {base + "[training]\nprecision = 'bf16'\nfp8_weight_casts = 'both'\n",
       "[training] fp8_weight_casts: expected 'transposed' (the default) with training.precision = 'bf16'"},
      {base + "[training]\nfp8_weight_casts = 'all'\n", "fp8_weight_casts"},
      {base + "[training]\nprecision = 'fp8'\nfp8_scaling = 'rowwise'\nfp8_weight_casts = 'both'\n",
       "[training] fp8_weight_casts: expected 'transposed' (the default) with training.fp8_scaling = 'rowwise'"},
      {base + "[training]\ncuda_graphs = true\n",
       "[training] cuda_graphs: expected false with run.device = 'cpu' (CUDA graphs)"},
      {base + "[training]\nreproducible = true\ncuda_graphs = true\n",
       "[training] cuda_graphs: expected false with run.device = 'cpu' (CUDA graphs)"},
  };
  for (const Case& c : cases) {
    const std::string file = write_file(dir + "/bad.toml", c.recipe);
    for (const char* command : {"validate ", "run "}) {
      const CommandResult result = trainer(command + file);
      EXPECT_EQ(result.exit_code, 2) << c.recipe << result.output;
      EXPECT_TRUE(contains(result, c.expected)) << "expected '" << c.expected << "' in:\n" << result.output;
    }
  }
}

// The quickstart with `logger` and a jsonl logger into DIR/run: 4 steps
// with a checkpoint every `interval`, then resumed to 6; the resumed run's output.
std::string run_and_resume(const std::string& dir, const std::string& logger, int interval) {
  const std::string recipe = write_file(dir + "/recipe.toml", read_file(kQuickstart) + "\n[[logger]]\nname = '" +
                                                                  logger + "'\n[[logger]]\nname = 'jsonl'\n");
  const std::string out = " --set run.output_dir=" + dir +
                          "/run --set checkpoint.interval=" + std::to_string(interval) + " --set training.steps=";
  const CommandResult first = trainer("run " + recipe + out + "4");
  EXPECT_EQ(first.exit_code, 0) << first.output;
  const CommandResult resumed = trainer("run " + recipe + out + "6 --set checkpoint.resume=auto");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  return resumed.output;
}

// The csv logger's rows hold the jsonl records' values exactly, and a
// resumed run continues the file with every step once.
TEST(Cli, CsvLoggerWritesTheJsonlColumnsAndSurvivesResume) {
  const std::string dir = scratch_dir("CliCsv");
  const std::string resumed = run_and_resume(dir, "csv", 2);
  EXPECT_NE(resumed.find("resumed from " + dir + "/run/checkpoints/step-00000004"), std::string::npos) << resumed;
  std::istringstream csv(read_file(dir + "/run/metrics.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line,
            "step,loss,grad_norm,lr,target_tokens,samples,input_tokens,documents,pad_fraction,step_seconds,skipped,"
            "tokens_per_second,mfu,mfu_datasheet,data_seconds,memory_allocated_bytes,memory_reserved_bytes,rss_bytes");
  const std::vector<MetricsRow> records = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 6u);
  size_t row = 0;
  for (; std::getline(csv, line); ++row) {
    ASSERT_LT(row, records.size()) << line;
    std::istringstream fields(line);
    std::string field;
    for (const char* key :
         {"step", "loss", "grad_norm", "lr", "target_tokens", "samples", "input_tokens", "documents", "pad_fraction",
          "step_seconds", "skipped", "tokens_per_second", "mfu", "mfu_datasheet", "data_seconds"}) {
      std::getline(fields, field, ',');
      const double value = records[row].at(key);
      if (std::isnan(value))
        EXPECT_EQ(field, "nan") << key << " of row " << row;
      else
        EXPECT_EQ(std::stod(field), value) << key << " of row " << row;
    }
    std::getline(fields, field, ',');
    EXPECT_EQ(field, "") << "memory_allocated_bytes does not apply on the CPU";
    std::getline(fields, field, ',');
    std::getline(fields, field, ',');
    EXPECT_EQ(std::stod(field), records[row].at("rss_bytes"));
  }
  EXPECT_EQ(row, 6u);
}

// A resumed run whose metrics.csv an earlier version wrote with other
// columns (here grad_norm missing, and a column old_metric this version
// does not write): every kept value stays under its name, the rows move
// into this version's columns (empty where they had none), the old column
// stays at the end (empty in the new rows), and every row has the header's
// number of fields. Before, the old rows sat under the new header shifted
// by a column.
TEST(Cli, CsvLoggerResumesAFileOfOtherColumns) {
  const std::string dir = scratch_dir("CliCsvColumns");
  const std::string recipe = write_file(dir + "/recipe.toml", read_file(kQuickstart) + "\n[[logger]]\nname = 'csv'\n");
  const std::string out = " --set run.output_dir=" + dir + "/run --set checkpoint.interval=2 --set training.steps=";
  ASSERT_EQ(trainer("run " + recipe + out + "4").exit_code, 0);
  const auto split = [](const std::string& line) {  // every field, an empty last one included
    std::vector<std::string> fields;
    for (size_t from = 0;;) {
      const size_t comma = line.find(',', from);
      fields.push_back(line.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) return fields;
      from = comma + 1;
    }
  };
  // The earlier version's file: grad_norm (column 2) gone, old_metric = 7 added.
  std::istringstream written(read_file(dir + "/run/metrics.csv"));
  std::string line, forged;
  std::getline(written, line);
  const std::string current_header = line;
  while (true) {
    std::vector<std::string> fields = split(line);
    fields.erase(fields.begin() + 2);
    fields.push_back(forged.empty() ? "old_metric" : "7");
    for (size_t i = 0; i < fields.size(); ++i) forged += (i ? "," : "") + fields[i];
    forged += "\n";
    if (!std::getline(written, line)) break;
  }
  write_file(dir + "/run/metrics.csv", forged);
  const CommandResult resumed = trainer("run " + recipe + out + "6 --set checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<MetricsRow> records = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 6u);
  std::istringstream csv(read_file(dir + "/run/metrics.csv"));
  std::getline(csv, line);
  EXPECT_EQ(line, current_header + ",old_metric");
  const std::vector<std::string> names = split(line);
  size_t row = 0;
  for (; std::getline(csv, line); ++row) {
    ASSERT_LT(row, records.size()) << line;
    const std::vector<std::string> fields = split(line);
    ASSERT_EQ(fields.size(), names.size()) << line;
    EXPECT_EQ(std::stod(fields[0]), records[row].at("step")) << line;
    EXPECT_EQ(std::stod(fields[1]), records[row].at("loss")) << line;
    EXPECT_EQ(names[2], "grad_norm");
    if (row < 4) {
      EXPECT_EQ(fields[2], "") << "the earlier file had no grad_norm: " << line;
      EXPECT_EQ(fields.back(), "7") << line;
    } else {
      EXPECT_EQ(std::stod(fields[2]), records[row].at("grad_norm")) << line;
      EXPECT_EQ(fields.back(), "") << line;
    }
  }
  EXPECT_EQ(row, 6u);
}

// Throughput, MFU, data time and memory in every record: tokens/s is the
// input tokens over the step's time; MFU is the FLOPs the step executes
// over its time and the given peak, with the FLOPs counted here from the
// quickstart shape by enumerating each token's matmuls (the head's only for
// target tokens: the fused head computes logits for target rows alone) and
// attention's products over each sample's own positions (records of known
// lengths, every one in every step), and mfu_datasheet the same over
// run.datasheet_tflops; the CPU reports its resident set, not CUDA memory.
TEST(Cli, MetricsCarryThroughputMfuDataTimeAndMemory) {
  const std::string dir = scratch_dir("CliMetrics");
  const std::vector<int> lengths = {33, 20, 10, 5, 2, 17, 33, 8};  // tokens per record; a window holds 33
  std::string records_text;
  double inputs = 0, pairs = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    Json prompt = Json::array(), completion = Json::array();
    for (int i = 0; i < lengths[r]; ++i)
      (i < 1 + static_cast<int>(r % 3) && i + 1 < lengths[r] ? prompt : completion).push_back((7 * i + r) % 63 + 1);
    records_text += Json{{"prompt_ids", prompt}, {"completion_ids", completion}}.dump() + "\n";
    inputs += lengths[r] - 1;                                         // the last token is no input
    pairs += static_cast<double>(lengths[r] - 1) * (lengths[r] - 1);  // each input attends over its sample's inputs
  }
  write_file(dir + "/records.jsonl", records_text);
  const std::string recipe =
      write_file(dir + "/recipe.toml", read_file(kQuickstart) + "\n[[logger]]\nname = 'jsonl'\n");
  const CommandResult run = trainer("run " + recipe + " --set run.output_dir=" + dir +
                                    "/run --set training.steps=3 --set run.peak_tflops=0.25 --set logger.0.interval=1 "
                                    "--set run.datasheet_tflops=0.5 --set dataset.name=jsonl --set dataset.path=" +
                                    dir + "/records.jsonl --set dataset.shuffle=false");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run, "MFU ")) << run.output;
  EXPECT_TRUE(contains(run, " GiB")) << run.output;
  // Multiply-adds of one token's forward: hidden 64, 4 heads and 2 key/value
  // heads of 16, intermediate 128, 2 layers, vocab 64.
  struct Matmul {
    double in, out;
  };
  const Matmul layer[] = {{64, 64},  {64, 32},  {64, 32}, {64, 64},  // q, k, v, o
                          {64, 128}, {64, 128}, {128, 64}};          // gate, up, down
  double layer_macs = 0;
  for (const Matmul& m : layer) layer_macs += m.in * m.out;
  const double pair_macs = 64 + 64;  // per (query, key) pair: its score and its weighted value, 4 heads of 16
  // 2 FLOPs per multiply-add; backward does twice forward's work.
  const double per_input_token = 3 * 2 * 2 * layer_macs;
  const double per_pair = 3 * 2 * 2 * pair_macs;
  const double per_target_token = 3 * 2 * (64.0 * 64);  // the head, 64 x vocab 64
  const std::vector<MetricsRow> records = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 3u);
  for (const MetricsRow& r : records) {
    const double tps = r.at("input_tokens") / r.at("step_seconds");
    EXPECT_NEAR(r.at("tokens_per_second"), tps, 1e-9 * tps);
    EXPECT_EQ(r.at("input_tokens"), inputs);
    const double flops = per_input_token * inputs + per_pair * pairs + per_target_token * r.at("target_tokens");
    EXPECT_NEAR(r.at("mfu"), flops / r.at("step_seconds") / 0.25e12, 1e-9 * r.at("mfu"));
    EXPECT_NEAR(r.at("mfu_datasheet"), flops / r.at("step_seconds") / 0.5e12, 1e-9 * r.at("mfu"));
    EXPECT_LT(r.at("target_tokens"), r.at("input_tokens")) << "completion-only loss: the head counts fewer rows";
    EXPECT_GE(r.at("data_seconds"), 0.0);
    EXPECT_LE(r.at("data_seconds"), r.at("step_seconds"));
    EXPECT_GT(r.at("rss_bytes"), 16.0 * 1024 * 1024);
    EXPECT_TRUE(std::isnan(r.at("memory_allocated_bytes")));
    EXPECT_TRUE(std::isnan(r.at("memory_reserved_bytes")));
  }
}

// run.profile_start records steps into a Chrome trace where the LibTorch
// build can write one (Kineto); where it cannot, the run refuses the key
// before the first step instead of training without the trace it was asked for.
TEST(Cli, ProfileWritesAChromeTraceOrRefusesTheKey) {
  const std::string dir = scratch_dir("CliProfile");
  const CommandResult run = trainer("run " + kQuickstart + " --set run.output_dir=" + dir +
                                    " --set training.steps=3 --set run.profile_start=2 --set run.profile_steps=5");
  // The branch is the library's, known at build time (tests/integration/CMakeLists.txt).
  if (!TRAINER_TESTS_TORCH_HAS_KINETO) {
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_TRUE(contains(run, "run.profile_start")) << run.output;
    EXPECT_TRUE(contains(run, "profiler traces")) << run.output;
    EXPECT_FALSE(contains(run, "step 1/3")) << run.output;
  } else {
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const Json trace = json_parse(read_file(dir + "/profile/trace.json"));
    const Json* events = json_find(trace, "traceEvents");
    ASSERT_NE(events, nullptr);
    const bool has_matmul = std::any_of(events->begin(), events->end(), [](const Json& e) {
      return e.value("name", std::string()).find("aten::") == 0;
    });
    EXPECT_TRUE(has_matmul);
  }
  const CommandResult beyond = trainer("run " + kQuickstart + " --set run.output_dir=" + dir +
                                       "-beyond --set training.steps=3 --set run.profile_start=4");
  EXPECT_EQ(beyond.exit_code, 2) << beyond.output;
  EXPECT_TRUE(contains(beyond, "1..3 (training.steps)")) << beyond.output;
}

// A reader of TensorBoard event files written from the format's definition
// (TFRecord framing, masked CRC-32C computed bit by bit, protobuf wire
// format), independent of the logger's code.
uint32_t masked_crc32c_reference(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  crc ^= 0xFFFFFFFFu;
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct Wire {
  const std::string& s;
  size_t at = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; at < s.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(s[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  }
  std::string take(size_t n) {
    std::string out = s.substr(at, n);
    at += n;
    return out;
  }
};

struct EventScalars {
  int64_t step = -1;
  bool session_start = false;
  std::map<std::string, float> values;
};

std::vector<EventScalars> read_events(const std::string& file) {
  const std::string bytes = read_file(file);
  std::vector<EventScalars> events;
  for (size_t at = 0; at < bytes.size();) {
    EXPECT_LE(at + 12, bytes.size()) << "a torn record";
    if (at + 12 > bytes.size()) break;
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c_reference(bytes.substr(at, 8)));
    const std::string data = bytes.substr(at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c_reference(data));
    at += 12 + length + 4;
    EventScalars event;
    for (Wire w{data}; w.at < data.size();) {
      const uint64_t k = w.varint();
      const int field = static_cast<int>(k >> 3), type = static_cast<int>(k & 7);
      if (type == 0) {
        const uint64_t v = w.varint();
        if (field == 2) event.step = static_cast<int64_t>(v);
      } else if (type == 1) {
        w.take(8);
      } else if (type == 2) {
        const std::string inner = w.take(w.varint());
        // event.proto: `SessionLog session_log = 7` (6 is the deprecated LogMessage, which TensorBoard does not
        // act on); SessionLog's `status = 1` is START = 1.
        if (field == 7) event.session_start = inner == std::string("\x08\x01", 2);
        if (field != 5) continue;
        for (Wire summary{inner}; summary.at < inner.size();) {
          summary.varint();  // Summary.value (1, length-delimited)
          const std::string value = summary.take(summary.varint());
          std::string tag;
          float number = NAN;
          for (Wire v{value}; v.at < value.size();) {
            const uint64_t vk = v.varint();
            if (vk == (1 << 3 | 2))
              tag = v.take(v.varint());
            else if (vk == (2 << 3 | 5))
              std::memcpy(&number, v.take(4).data(), 4);
          }
          event.values[tag] = number;
        }
      } else if (type == 5) {
        w.take(4);
      }
    }
    events.push_back(event);
  }
  return events;
}

// The tensorboard logger's files decode (framing, CRCs, protobuf) to the
// same scalars as metrics.jsonl, within float32; each run's file starts
// with TensorBoard's restart marker at its first step (TensorBoard drops
// the earlier files' events from there: a resumed run's replaced steps, a
// re-run's earlier run).
TEST(Cli, TensorBoardEventFilesHoldTheMetrics) {
  const std::string dir = scratch_dir("CliTensorBoard");
  run_and_resume(dir, "tensorboard", 3);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/run/tensorboard"))
    files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].find("/events.out.tfevents."), std::string::npos);
  const std::vector<MetricsRow> records = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 6u);
  std::map<int64_t, EventScalars> by_step;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::vector<EventScalars> events = read_events(files[f]);
    ASSERT_GE(events.size(), 2u);
    EXPECT_TRUE(events[0].values.empty()) << "the first event carries the file version";
    EXPECT_TRUE(events[1].session_start) << "every run marks its start";
    EXPECT_EQ(events[1].step, f == 0 ? 1 : 4);
    for (const EventScalars& e : events) {
      if (!e.values.empty()) by_step[e.step] = e;  // the resumed run's steps replace the first run's 4
    }
  }
  ASSERT_EQ(by_step.size(), 6u);
  for (const MetricsRow& r : records) {
    const EventScalars& e = by_step.at(static_cast<int64_t>(r.at("step")));
    EXPECT_EQ(e.values.at("loss_metrics/global_avg_loss"), static_cast<float>(r.at("loss")));
    EXPECT_EQ(e.values.at("grad_norm"), static_cast<float>(r.at("grad_norm")));
    EXPECT_EQ(e.values.at("lr"), static_cast<float>(r.at("lr")));
    EXPECT_EQ(e.values.at("throughput(tps)"), static_cast<float>(r.at("tokens_per_second")));
    EXPECT_EQ(e.values.at("target_tokens"), static_cast<float>(r.at("target_tokens")));
    EXPECT_EQ(e.values.at("memory/rss(GiB)"), static_cast<float>(r.at("rss_bytes") / (1024.0 * 1024.0 * 1024.0)));
    EXPECT_EQ(e.values.count("mfu(%)"), 0u) << "no MFU on the CPU without run.peak_tflops";
  }
}

TEST(Cli, BrokenPluginFilesExitWithTwo) {
  const std::string dir = scratch_dir("CliPlugin");
  const std::string fixtures = TRAINER_FIXTURE_DIR;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fixtures + "/not-a-plugin/trainer-fixture-not-a-plugin.so", "not a trainer plugin"},
      {fixtures + "/bad-abi/trainer-fixture-badabi.so", "plugin ABI version 999 does not match"},
  };
  for (const auto& [file, expected] : cases) {
    const std::string recipe =
        write_file(dir + "/recipe.toml",
                   "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n[[logger]]\nname = '" + file + "'\n");
    const CommandResult result = trainer("validate " + recipe);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_TRUE(contains(result, expected)) << result.output;
  }
  const CommandResult result = trainer("--plugin-dir " + fixtures + "/bad-abi plugins");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "trainer-fixture-badabi.so: plugin ABI version 999 does not match")) << result.output;
}

TEST(Cli, PluginsListsKindsNamesAndKeys) {
  const CommandResult list = trainer("plugins");
  ASSERT_EQ(list.exit_code, 0) << list.output;
  for (const char* text : {"strategy  ddp", "model     qwen2", "dataset   synthetic", "logger    console",
                           "logger    jsonl", "trainer-model-qwen2.so", "micro_batch_size"}) {
    EXPECT_TRUE(contains(list, text)) << text << "\n" << list.output;
  }
  const CommandResult keys = trainer("plugins qwen2");
  ASSERT_EQ(keys.exit_code, 0) << keys.output;
  EXPECT_TRUE(contains(keys, "num_key_value_heads")) << keys.output;
  EXPECT_EQ(trainer("plugins nosuch").exit_code, 2);
}

TEST(Cli, NonFiniteGradientFailsWithOneOrIsSkipped) {
  // A huge learning rate sends the parameters to ~1e30 after one update;
  // the next forward pass overflows.
  const std::string dir = scratch_dir("CliNonFinite");
  const std::string args = "run " + kQuickstart + " --set run.output_dir=" + dir +
                           " --set training.steps=4 --set optimizer.lr=1e30 --set lr_schedule.warmup_steps=0";
  const CommandResult failed = trainer(args);
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_TRUE(contains(failed, "non-finite")) << failed.output;
  // Every step before the failing one is in the metrics: a step's record
  // waits for its time until the next step has reduced, and an error in that
  // step must not lose it.
  const size_t named = failed.output.find(": non-finite");
  const size_t step_word = failed.output.rfind("step ", named);
  ASSERT_TRUE(named != std::string::npos && step_word != std::string::npos) << failed.output;
  const int64_t failed_at = std::stoll(failed.output.substr(step_word + 5, named - step_word - 5));
  ASSERT_GE(failed_at, 2) << failed.output;
  const std::vector<MetricsRow> before = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(static_cast<int64_t>(before.size()), failed_at - 1) << failed.output;
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].at("step"), static_cast<double>(i + 1));
  const CommandResult skipped = trainer(args + " --set training.on_nonfinite=skip");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  const std::vector<MetricsRow> rows = read_metrics(dir + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].at("skipped"), 0.0);
  EXPECT_EQ(rows[3].at("skipped"), 1.0);
}

// Every config in the tree, subfolders included, validates and runs three
// steps here, or is named with the test that runs it on the inputs it needs.
TEST(Cli, EveryConfigValidatesAndRuns) {
  const std::map<std::string, std::string> run_elsewhere = {
      {"finetune/hf-text.toml",
       "Datasets.FineTuneConfigTrainsAHuggingFaceDirectoryOnText (a Hugging Face "
       "directory and text it makes)"}};
  int configs = 0;
  const std::filesystem::path root = source_path("configs");
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".toml") continue;
    ++configs;
    const std::string relative = entry.path().lexically_relative(root).string();
    if (run_elsewhere.count(relative)) continue;
    std::string name = relative;
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string dir = scratch_dir("CliConfig_" + name);
    const std::string file = entry.path().string();
    EXPECT_EQ(trainer("validate " + file).exit_code, 0) << file;
    const CommandResult run = trainer("run " + file + " --set run.output_dir=" + dir + " --set training.steps=3");
    EXPECT_EQ(run.exit_code, 0) << file << "\n" << run.output;
    EXPECT_EQ(read_metrics(dir + "/metrics.jsonl").size(), 3u) << file;
  }
  for (const auto& [relative, test] : run_elsewhere) {
    EXPECT_TRUE(std::filesystem::exists(root / relative)) << relative << " is gone: update this list";
  }
  EXPECT_GE(configs, 3);
}

// trainer tokenize: documents are their ids and EOS, back to back, in input
// order whatever the thread count; OUT.docs holds the offsets; a bad line is
// named (file, line) and leaves an existing output as it was, or is counted
// with --skip-bad-lines; the file trains as a tokens dataset.
TEST(Cli, TokenizeWritesTheTokensFileAndItsDocumentOffsets) {
  const std::string tokenizer_dir = testing::qwen3_tokenizer_dir();
  ASSERT_TRUE(std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/fetch-tokenizer.sh";
  const auto tokenizer = Tokenizer::load(tokenizer_dir);
  const std::string dir = scratch_dir("CliTokenize");
  const std::vector<std::string> texts = {"First document.", "二番目の文書 😀", "def third():\n    return 3\n"};
  std::string corpus;
  std::vector<uint32_t> expected;
  std::vector<uint64_t> offsets{0};
  for (int copy = 0; copy < 700; ++copy) {  // more lines than one block of the thread pool
    for (const std::string& text : texts) {
      corpus += Json{{"text", text}}.dump() + "\n";
      for (const int64_t id : tokenizer->encode(text)) expected.push_back(static_cast<uint32_t>(id));
      expected.push_back(static_cast<uint32_t>(*tokenizer->eos_id()));
      offsets.push_back(expected.size());
    }
  }
  write_file(dir + "/corpus.jsonl", corpus + "\n");
  auto read_u32 = [](const std::string& path) {
    const std::string bytes = read_file(path);
    std::vector<uint32_t> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
  };
  for (const char* threads : {"1", "3"}) {
    const CommandResult run = trainer("tokenize " + dir + "/corpus.jsonl --tokenizer " + tokenizer_dir + " --out " +
                                      dir + "/t" + threads + ".bin --threads " + threads);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(contains(run, "tokens/s")) << run.output;
    EXPECT_EQ(read_u32(dir + "/t" + threads + ".bin"), expected) << threads << " thread(s)";
    const std::string docs = read_file(dir + "/t" + threads + ".bin.docs");
    std::vector<uint64_t> got(docs.size() / 8);
    std::memcpy(got.data(), docs.data(), got.size() * 8);
    EXPECT_EQ(got, offsets);
    // The length distribution: 700 documents of each of three lengths, so
    // the median is the middle length and p90 and p99 the longest.
    std::vector<size_t> lengths;
    for (const std::string& text : texts) lengths.push_back(tokenizer->encode(text).size() + 1);
    std::sort(lengths.begin(), lengths.end());
    const std::string distribution = "document lengths in tokens: min " + std::to_string(lengths[0]) + ", median " +
                                     std::to_string(lengths[1]) + ", p90 " + std::to_string(lengths[2]) + ", p99 " +
                                     std::to_string(lengths[2]) + ", max " + std::to_string(lengths[2]);
    EXPECT_TRUE(contains(run, distribution)) << distribution << "\n" << run.output;
  }
  // A bad line: exit 2 naming file and line, the earlier output untouched.
  write_file(dir + "/bad.jsonl", corpus + "{\"txt\": \"no text field\"}\n");
  const std::string before = read_file(dir + "/t1.bin");
  const CommandResult bad =
      trainer("tokenize " + dir + "/bad.jsonl --tokenizer " + tokenizer_dir + " --out " + dir + "/t1.bin");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad, dir + "/bad.jsonl:2101: expected a JSON object with a string field \"text\""))
      << bad.output;
  EXPECT_EQ(read_file(dir + "/t1.bin"), before);
  EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{});
  const CommandResult skipped = trainer("tokenize " + dir + "/bad.jsonl --tokenizer " + tokenizer_dir + " --out " +
                                        dir + "/skip.bin --skip-bad-lines");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_TRUE(contains(skipped, "skipped 1 bad line(s); the first: " + dir + "/bad.jsonl:2101")) << skipped.output;
  EXPECT_EQ(read_u32(dir + "/skip.bin"), expected);
  // The output trains as the tokens dataset.
  const std::string recipe = write_file(
      dir + "/recipe.toml",
      "[run]\noutput_dir = '" + dir +
          "/run'\n[model]\nname = 'qwen2'\nvocab_size = " + std::to_string(tokenizer->vocab_size()) +
          "\nhidden_size = 16\nintermediate_size = 32\nnum_attention_heads = 2\nnum_key_value_heads = 1\n"
          "[dataset]\nname = 'tokens'\npath = '" +
          dir + "/t3.bin'\ndtype = 'uint32'\nseq_len = 32\nvocab_size = " + std::to_string(tokenizer->vocab_size()) +
          "\n[training]\nsteps = 2\nmicro_batch_size = 2\n");
  const CommandResult train = trainer("run " + recipe);
  EXPECT_EQ(train.exit_code, 0) << train.output;
}

// tokenize's destinations are checked before any work: --out equal to an
// input (it would become token ids), OUT or OUT.docs a directory. A write
// that fails (a file-size limit) is exit 1 naming the file, never SIGXFSZ,
// and leaves no partial files.
TEST(Cli, TokenizeNeverReplacesItsInputsOrLeavesHalfAPair) {
  const std::string tokenizer_dir = testing::qwen3_tokenizer_dir();
  ASSERT_TRUE(std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/fetch-tokenizer.sh";
  const std::string dir = scratch_dir("CliTokenizeOut");
  std::string corpus;
  for (int i = 0; i < 4000; ++i) corpus += Json{{"text", "document number " + std::to_string(i)}}.dump() + "\n";
  write_file(dir + "/corpus.jsonl", corpus);
  const std::string tokenize = "tokenize " + dir + "/corpus.jsonl --tokenizer " + tokenizer_dir + " --out ";
  CommandResult result = trainer(tokenize + dir + "/corpus.jsonl");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "is the --input file")) << result.output;
  EXPECT_EQ(read_file(dir + "/corpus.jsonl"), corpus);
  result = trainer(tokenize + tokenizer_dir + "/tokenizer.json");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "is the --tokenizer file")) << result.output;
  ASSERT_EQ(trainer(tokenize + dir + "/t.bin").exit_code, 0);
  const std::string old_tokens = read_file(dir + "/t.bin");
  std::filesystem::remove(dir + "/t.bin.docs");
  std::filesystem::create_directories(dir + "/t.bin.docs");
  result = trainer(tokenize + dir + "/t.bin");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "t.bin.docs is a directory")) << result.output;
  EXPECT_FALSE(contains(result, "tokens/s")) << "it tokenized first:\n" << result.output;
  EXPECT_EQ(read_file(dir + "/t.bin"), old_tokens);
  std::filesystem::create_directories(dir + "/outdir");
  result = trainer(tokenize + dir + "/outdir");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "outdir: is a directory")) << result.output;
  result = trainer(tokenize + dir + "/no/such/t.bin");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "the directory " + dir + "/no/such does not exist")) << result.output;
  // ulimit -f 8: 4 kB blocks of 512 bytes; the tokens need more.
  result = run_command("ulimit -f 8; " + std::string(TRAINER_BINARY) + " " + tokenize + dir + "/limited.bin");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result, "limited.bin: write failed") || contains(result, "limited.bin.docs: write failed"))
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/limited.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/limited.bin.docs"));
  EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{});
  // An input named as OUT's temporaries once were (OUT.partial and
  // OUT.docs.partial, truncated before the input was read): the command
  // writes files of its own, and both are as they were.
  const std::string named = scratch_dir("CliTokenizeTmpName");
  const std::string input = write_file(named + "/n.bin.partial", corpus);
  const std::string other = write_file(named + "/n.bin.docs.partial", "someone's file\n");
  result = trainer("tokenize " + input + " --tokenizer " + tokenizer_dir + " --out " + named + "/n.bin");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(read_file(input), corpus);
  EXPECT_EQ(read_file(other), "someone's file\n");
  EXPECT_EQ(read_file(named + "/n.bin"), old_tokens);
}

// SIGINT or SIGTERM while tokenizing (the partial files exist: the fault
// hook's marker): the command removes them and ends by the signal; an
// earlier output of the same name is as it was. After SIGKILL the next
// tokenize to that --out removes them.
TEST(Cli, TokenizeStoppedBySignalLeavesNothing) {
  const std::string tokenizer_dir = testing::qwen3_tokenizer_dir();
  ASSERT_TRUE(std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/fetch-tokenizer.sh";
  const std::string dir = scratch_dir("CliTokenizeSignal");
  std::string corpus;
  for (int i = 0; i < 5000; ++i) corpus += Json{{"text", "document " + std::to_string(i)}}.dump() + "\n";
  write_file(dir + "/corpus.jsonl", corpus);
  write_file(dir + "/t.bin", "earlier ids");
  write_file(dir + "/t.bin.docs", "earlier offsets");
  for (const int number : {SIGINT, SIGTERM, SIGKILL}) {
    const std::string marker = dir + "/writing-" + std::to_string(number);
    Job job({TRAINER_BINARY, "tokenize", dir + "/corpus.jsonl", "--tokenizer", tokenizer_dir, "--out", dir + "/t.bin"},
            dir + "/log.txt",
            {"TRAINER_FAULT_INJECT=slow-tokenize", "TRAINER_FAULT_DELAY_S=2", "TRAINER_FAULT_MARKER=" + marker});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(marker) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(std::filesystem::exists(marker)) << read_file(dir + "/log.txt");
    if (number == SIGINT) {
      // Meanwhile (the first held still, lock and all, so that the others'
      // time does not matter), a second tokenize to the same --out is
      // refused (the two could pair one's ids with the other's offsets);
      // another --out is not.
      job.signal(SIGSTOP);
      const std::string args = " --tokenizer " + tokenizer_dir + " --out " + dir;
      const CommandResult second = trainer("tokenize " + dir + "/corpus.jsonl" + args + "/t.bin");
      EXPECT_EQ(second.exit_code, 2) << second.output;
      EXPECT_TRUE(contains(second, "--out " + dir + "/t.bin is being written by another trainer tokenize (pid "))
          << second.output;
      const CommandResult other = trainer("tokenize " + dir + "/corpus.jsonl" + args + "/u.bin");
      EXPECT_EQ(other.exit_code, 0) << other.output;
      job.signal(number);  // pending until it continues
      job.signal(SIGCONT);
    } else {
      job.signal(number);
    }
    EXPECT_EQ(job.wait(), 128 + number) << read_file(dir + "/log.txt");
    if (number == SIGKILL) {
      // No clean-up of its own: its partial files stay until the next
      // tokenize to that --out removes them under its lock.
      const std::vector<std::string> left = temporaries_in(dir);
      ASSERT_EQ(left.size(), 2u) << "a t.bin.tmp-XXXXXX and a t.bin.docs.tmp-XXXXXX";
      const CommandResult next =
          trainer("tokenize " + dir + "/corpus.jsonl --tokenizer " + tokenizer_dir + " --out " + dir + "/t.bin");
      ASSERT_EQ(next.exit_code, 0) << next.output;
      for (const std::string& name : left) {
        EXPECT_TRUE(contains(next, dir + "/" + name + ": left by a tokenize stopped while writing")) << next.output;
      }
      EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{});
      EXPECT_FALSE(std::filesystem::exists(dir + "/.t.bin.lock")) << "the killed one's lock file goes with the next";
      EXPECT_NE(read_file(dir + "/t.bin"), "earlier ids");
      continue;
    }
    EXPECT_NE(read_file(dir + "/log.txt").find("t.bin: stopped by"), std::string::npos) << read_file(dir + "/log.txt");
    EXPECT_EQ(temporaries_in(dir), std::vector<std::string>{});
    EXPECT_FALSE(std::filesystem::exists(dir + "/.t.bin.lock")) << "the lock file goes with the lock";
    EXPECT_EQ(read_file(dir + "/t.bin"), "earlier ids");
    EXPECT_EQ(read_file(dir + "/t.bin.docs"), "earlier offsets");
  }
}

// new-plugin: DIR with a trailing slash is DIR; an empty DIR is named; an installed plugin's name is refused.
TEST(Cli, NewPluginTakesDirectoriesAsWritten) {
  const std::string dir = scratch_dir("CliNewPluginDir");
  CommandResult result = trainer("new-plugin logger tally " + dir + "/tally/");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/tally/src/TallyLogger.cpp")) << result.output;
  result = trainer("new-plugin logger tally ''");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "new-plugin: DIR is empty")) << result.output;
  result = trainer("new-plugin logger tally " + dir + "/deeper/still/");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/deeper/still/CMakeLists.txt")) << result.output;
  // An installed plugin's kind and name: both plugins on the search path would refuse every command.
  result = trainer("new-plugin optimizer adamw " + dir + "/mine");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result, "new-plugin: name 'adamw': the optimizer plugin ")) << result.output;
  EXPECT_TRUE(contains(result, "trainer-optimizer-adamw.so has it")) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/mine"));
  result = trainer("new-plugin logger adamw " + dir + "/mine");  // another kind's name is free
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// trainer compare --html in a real browser: headless Chromium (Debian's
// chromium; test.sh installs it) loads the report offline, the page's own
// script marks the five charts it drew (data-rendered) and collects any
// script error (data-errors); a screenshot goes beside the report. The text
// report names the recipe keys that differ; bad input exits 2.
TEST(Cli, CompareHtmlReportRendersInChromium) {
  const std::string dir = scratch_dir("CliCompareHtml");
  for (const auto& [name, split] : std::vector<std::pair<std::string, std::string>>{
           {"a", " --set training.micro_batch_size=8"},
           {"b", " --set training.micro_batch_size=2 --set training.grad_accum_steps=4"}}) {
    const CommandResult run =
        trainer("run " + kQuickstart + " --set run.output_dir=" + dir + "/" + name + " --set training.steps=8" + split);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  const std::string report = dir + "/report.html";
  const CommandResult compare = trainer("compare " + dir + "/a " + dir + "/b --html " + report);
  ASSERT_EQ(compare.exit_code, 0) << compare.output;
  EXPECT_TRUE(contains(compare, "training.grad_accum_steps: 1 | 4")) << compare.output;
  EXPECT_TRUE(contains(compare, "training.micro_batch_size: 8 | 2")) << compare.output;
  const std::string page = read_file(report);
  // Self-contained: nothing loaded from elsewhere.
  EXPECT_EQ(page.find("<script src="), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  const CommandResult which = testing::run_command("command -v chromium");
  ASSERT_EQ(which.exit_code, 0) << "chromium is not installed (scripts/test.sh installs it)";
  const std::string flags =
      " --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1900"
      " --virtual-time-budget=5000 --user-data-dir=" +
      dir + "/chromium ";
  const CommandResult dom =
      testing::run_command("timeout 120 chromium" + flags + "--dump-dom file://" + report + " 2>/dev/null");
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_NE(dom.output.find("data-rendered=\"5\""), std::string::npos) << dom.output.substr(0, 2000);
  EXPECT_EQ(dom.output.find("data-errors"), std::string::npos) << dom.output.substr(0, 2000);
  const CommandResult shot = testing::run_command("timeout 120 chromium" + flags + "--screenshot=" + dir +
                                                  "/report.png file://" + report + " 2>/dev/null");
  EXPECT_EQ(shot.exit_code, 0) << shot.output;
  EXPECT_GT(std::filesystem::file_size(dir + "/report.png"), 20000u);
  // Bad input: a missing run, an empty metrics file, an unwritable report.
  EXPECT_EQ(trainer("compare " + dir + "/a " + dir + "/nowhere --html " + report).exit_code, 2);
  write_file(dir + "/empty/metrics.jsonl", "");
  EXPECT_EQ(trainer("compare " + dir + "/a " + dir + "/empty").exit_code, 2);
  const CommandResult unwritable = trainer("compare " + dir + "/a " + dir + "/b --html " + dir + "/no/such/dir/r.html");
  EXPECT_EQ(unwritable.exit_code, 2) << unwritable.output;
  EXPECT_TRUE(contains(unwritable,
                       "--html " + dir + "/no/such/dir/r.html: the directory " + dir + "/no/such/dir does not exist"))
      << unwritable.output;
  EXPECT_FALSE(contains(unwritable, "dloss[1]")) << "the table came before the error:\n" << unwritable.output;
  // The report replaces an earlier report, never a run's own file nor a directory.
  EXPECT_EQ(trainer("compare " + dir + "/a " + dir + "/b --html " + report).exit_code, 0);
  const std::string metrics = read_file(dir + "/b/metrics.jsonl");
  for (const std::string& target : {dir + "/b/metrics.jsonl", dir + "/b/model.safetensors", dir + "/b"}) {
    const CommandResult refused = trainer("compare " + dir + "/a " + dir + "/b --html " + target);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_TRUE(contains(refused, "--html " + target + ": ")) << refused.output;
  }
  EXPECT_EQ(read_file(dir + "/b/metrics.jsonl"), metrics);
}

TEST(Cli, BadCommandLineExitsWithTwo) {
  EXPECT_EQ(trainer("fly").exit_code, 2);
  EXPECT_EQ(trainer("run").exit_code, 2);
  // A --plugin-dir that is not a directory is named, never skipped.
  const CommandResult missing = trainer("--plugin-dir /no/such/plugins plugins");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing, "--plugin-dir")) << missing.output;
  EXPECT_TRUE(contains(missing, "/no/such/plugins")) << missing.output;
  EXPECT_EQ(trainer("--help").exit_code, 0);
}

}  // namespace
}  // namespace trainer
