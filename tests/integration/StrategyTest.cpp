// The four strategies side by side through `trainer run`: bit-identical at
// world size 1, the ZeRO memory formulas at world size 4, agreement across
// strategies and splits of one global batch, and the seed scenario.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "TestSupport.h"
#include "trainer/util/JsonSupport.h"

namespace trainer {
namespace {

std::string run(const std::string& name, const std::string& recipe, const std::string& overrides) {
  const std::string dir = scratch_dir(name);
  const auto result = trainer("run " + source_path(recipe) + " --set run.output_dir=" + dir + " " + overrides);
  EXPECT_EQ(result.exit_code, 0) << name << "\n" << result.output;
  return dir;
}

TEST(Strategies, WorldSizeOneIsBitIdenticalToDdp) {
  std::vector<std::string> dirs;
  for (const std::string& s : kStrategies) {
    dirs.push_back(run("W1_" + s, "configs/quickstart.toml", "--set training.steps=20 --set strategy.name=" + s));
  }
  const auto reference = read_metrics(dirs[0] + "/metrics.jsonl");
  for (size_t i = 1; i < dirs.size(); ++i) {
    const auto rows = read_metrics(dirs[i] + "/metrics.jsonl");
    EXPECT_EQ(column(rows, "loss"), column(reference, "loss")) << kStrategies[i];
    EXPECT_EQ(column(rows, "grad_norm"), column(reference, "grad_norm")) << kStrategies[i];
    // The hash of the final parameters' bytes.
    EXPECT_EQ(read_file(dirs[i] + "/summary.json"), read_file(dirs[0] + "/summary.json")) << kStrategies[i];
  }
}

// Recomputing each block in backward runs the same kernels on the same
// inputs, so it changes no bit, under any strategy; nor does keeping what
// the default recomputes (no_recompute).
TEST(Strategies, ActivationCheckpointingChangesNoBitAtWorldSizeOne) {
  const std::string plain = run("AC_none", "configs/quickstart.toml", "--set training.steps=10");
  const auto reference = read_metrics(plain + "/metrics.jsonl");
  for (const std::string& s : kStrategies) {
    const std::string dir =
        run("AC_" + s, "configs/quickstart.toml",
            "--set training.steps=10 --set model.activation_checkpointing=full --set strategy.name=" + s);
    const auto rows = read_metrics(dir + "/metrics.jsonl");
    EXPECT_EQ(column(rows, "loss"), column(reference, "loss")) << s;
    EXPECT_EQ(column(rows, "grad_norm"), column(reference, "grad_norm")) << s;
    EXPECT_EQ(read_file(dir + "/summary.json"), read_file(plain + "/summary.json")) << s;
  }
  // Two ranks: zero3 gathers each unit again for the recomputation's backward.
  const std::string two =
      "--set training.steps=6 --set training.micro_batch_size=2 --set training.grad_accum_steps=2 "
      "--nproc 2 --set strategy.name=zero3";
  const std::string off = run("AC_zero3_2_none", "configs/quickstart.toml", two);
  const std::string on =
      run("AC_zero3_2_full", "configs/quickstart.toml", two + " --set model.activation_checkpointing=full");
  EXPECT_EQ(column(read_metrics(on + "/metrics.jsonl"), "loss"), column(read_metrics(off + "/metrics.jsonl"), "loss"));
  EXPECT_EQ(read_file(on + "/summary.json"), read_file(off + "/summary.json"));
  // Keeping the norms' and SwiGLU's outputs (their weights re-gathered for backward as every unit's are).
  const std::string kept =
      run("AC_zero3_2_keep", "configs/quickstart.toml", two + " --set model.activation_checkpointing=no_recompute");
  EXPECT_EQ(column(read_metrics(kept + "/metrics.jsonl"), "loss"),
            column(read_metrics(off + "/metrics.jsonl"), "loss"));
  EXPECT_EQ(read_file(kept + "/summary.json"), read_file(off + "/summary.json"));
}

// bytes of rank `rank` for `key` in memory.json
int64_t memory_of(const std::string& dir, int rank, const std::string& key) {
  const Json ranks = json_parse(read_file(dir + "/memory.json"));
  for (const Json& r : ranks) {
    if (r.at("rank") == rank) return r.at(key).get<int64_t>();
  }
  ADD_FAILURE() << "no rank " << rank << " in " << dir << "/memory.json";
  return -1;
}

// The strategy's report held to what the run measured: the tensor bytes its
// setup left live on the rank's device (the CPU allocator counted, or the
// CUDA caching allocator), and those still live after the first step (its
// activations and transient buffers freed), each above the level before the
// model was made. They differ only by small tensors the loop and the
// strategies keep besides the state (scalars: 0 to 2.3 kB measured at
// quickstart's shape) and, after the step, by what autograd's worker
// threads may not have released yet when backward() returns on a loaded
// machine (5.1 kB seen once under ctest -j2), hence 16 kB; one unreported
// copy of the quickstart's gradient or parameters would be 330 kB.
void expect_measured_as_reported(const std::string& dir, int rank, const std::string& what) {
  const int64_t reported = memory_of(dir, rank, "parameter_bytes") + memory_of(dir, rank, "gradient_bytes") +
                           memory_of(dir, rank, "optimizer_bytes");
  for (const char* key : {"measured_after_setup_bytes", "measured_after_first_step_bytes"}) {
    const int64_t measured = memory_of(dir, rank, key);
    EXPECT_GE(measured, reported) << what << " rank " << rank << ": " << key << " below what the strategy reports";
    EXPECT_LE(measured, reported + 16384) << what << " rank " << rank << ": " << key << " beyond the report";
  }
}

// A step's transients held to what the run measured: the first step's
// peak above the level after it (the model's activations and the
// strategy's step-local buffers) is at least what the strategy reports it
// held at once. With `ddp` (a ddp run at the same shape: its buffers all
// outlive the step, so its figure is the activations and autograd's
// temporaries alone) it is also at most that plus the reported buffers,
// `backend` (what the communication backend stages for the strategy's
// collectives in flight at the peak) and the 16 kB above. A strategy that
// holds a step-local copy of the gradient or the parameters it does not
// report (330 kB at quickstart's shape) fails the second; one that reports
// more than it holds, the first.
void expect_transients_measured(const std::string& dir, const std::string& ddp, int64_t backend, int rank,
                                const std::string& what) {
  const auto transient = [&](const std::string& d) {
    return memory_of(d, rank, "measured_first_step_peak_bytes") - memory_of(d, rank, "measured_after_first_step_bytes");
  };
  const int64_t reported = memory_of(dir, rank, "peak_transient_bytes");
  EXPECT_GE(transient(dir), reported) << what << " rank " << rank << ": reports more step-local bytes than it held";
  if (ddp.empty()) return;
  EXPECT_LE(transient(dir), transient(ddp) + reported + backend + 16384)
      << what << " rank " << rank << ": the step held more than ddp's activations and the reported buffers";
}

TEST(Strategies, ZeroMemoryFormulasAtWorldSizeFour) {
  std::map<std::string, std::string> dirs;
  for (const std::string& s : kStrategies) {
    dirs[s] = run("W4_" + s, "configs/quickstart.toml",
                  "--set training.steps=2 --set training.micro_batch_size=2 --nproc 4 --set strategy.name=" + s);
  }
  dirs["zero3_prefetch0"] = run("W4_zero3_prefetch0", "configs/quickstart.toml",
                                "--set training.steps=2 --set training.micro_batch_size=2 --nproc 4 "
                                "--set strategy.name=zero3 --set strategy.prefetch=0");
  EXPECT_EQ(read_file(dirs["zero3"] + "/summary.json"), read_file(dirs["zero3_prefetch0"] + "/summary.json"))
      << "prefetch changes when parameters arrive, not the result";
  // quickstart's qwen2: 82496 parameters in two groups, each padded to a
  // multiple of 4 x 64 (shard_padding): at most 2 x 64 elements per rank in
  // each of three fp32 state tensors.
  const double padding = 2 * 64 * 4 * 3;
  auto quarter_of = [&](double ddp_bytes) { return 1.05 * ddp_bytes / 4 + padding; };
  for (int rank = 0; rank < 4; ++rank) {
    for (const auto& [name, dir] : dirs) {
      expect_measured_as_reported(dir, rank, name);
      // gloo stages zero3's collectives of a unit: its reduce-scatter
      // all-reduces a copy of the unit's gradient, its all-gather lands in
      // a buffer of its own first; up to the largest unit (37120 parameters,
      // below) in fp32 each. Measured: 196 kB of the 290 kB allowed (160 kB
      // without prefetch). zero1's and zero2's: none measured at the peak.
      const int64_t backend = name.rfind("zero3", 0) == 0 ? 2 * 37120 * 4 : 0;
      expect_transients_measured(dir, dirs["ddp"], backend, rank, name);
    }
    // zero3's step-local buffers beyond its gathered parameters: the
    // gathers' staging, the units' gradients and their reduce-scatters.
    EXPECT_GT(memory_of(dirs["zero3"], rank, "peak_transient_bytes"),
              memory_of(dirs["zero3"], rank, "peak_gathered_parameter_bytes"));
    EXPECT_EQ(memory_of(dirs["zero2"], rank, "peak_transient_bytes"),
              memory_of(dirs["zero2"], rank, "peak_transient_gradient_bytes"));
    const double p = memory_of(dirs["ddp"], rank, "parameter_bytes");
    const double g = memory_of(dirs["ddp"], rank, "gradient_bytes");
    const double o = memory_of(dirs["ddp"], rank, "optimizer_bytes");
    EXPECT_EQ(p, 82496 * 4);
    EXPECT_LE(memory_of(dirs["zero1"], rank, "optimizer_bytes"), quarter_of(o));
    EXPECT_LE(memory_of(dirs["zero2"], rank, "gradient_bytes") + memory_of(dirs["zero2"], rank, "optimizer_bytes"),
              quarter_of(g + o));
    EXPECT_LE(memory_of(dirs["zero3"], rank, "parameter_bytes") + memory_of(dirs["zero3"], rank, "gradient_bytes") +
                  memory_of(dirs["zero3"], rank, "optimizer_bytes"),
              quarter_of(p + g + o));
    // Largest units: a block of 2 * 64^2 (q, o) + 2 * 32 * 64 (k, v) + 3 * 64 * 128 (MLP) + 64 + 2 * 32 (biases)
    // + 2 * 64 (norms) = 37120 parameters; 2 + prefetch (default 1) of them in fp32.
    const int64_t peak = memory_of(dirs["zero3"], rank, "peak_gathered_parameter_bytes");
    const int64_t unprefetched = memory_of(dirs["zero3_prefetch0"], rank, "peak_gathered_parameter_bytes");
    EXPECT_GT(unprefetched, 0);
    EXPECT_LE(unprefetched, 2 * 37120 * 4);
    EXPECT_GT(peak, unprefetched) << "a block computes while the next one is gathered";
    EXPECT_LE(peak, 3 * 37120 * 4);
    // zero2's full-gradient buckets during backward: with the default 25 MB one bucket holds the whole model.
    EXPECT_EQ(memory_of(dirs["zero2"], rank, "peak_transient_gradient_bytes"), 82496 * 4);
  }
}

// Hybrid sharding at world size 4 in shard groups of 2: each rank holds
// half of what it shards (the ZeRO formulas with the group's size), the two
// replicas of every shard end each step with the same bits, and training
// agrees with ddp's (the sums in another order: ~1e-7).
TEST(Strategies, HybridShardingHoldsItsGroupsShareAndAgrees) {
  const std::string common =
      "--set training.steps=3 --set training.micro_batch_size=1 --set "
      "training.grad_accum_steps=2 --nproc 4";
  const std::string ddp = run("Hybrid_ddp", "configs/quickstart.toml", common + " --set strategy.name=ddp");
  std::string dirs = " " + ddp;
  // Padding to a multiple of 2 adds at most 2 x 1 elements per rank.
  auto half_of = [](double ddp_bytes) { return 1.05 * ddp_bytes / 2 + 2 * 4; };
  for (const std::string s : {"zero1", "zero2", "zero3"}) {
    const std::string dir = run("Hybrid_" + s, "configs/quickstart.toml",
                                common + " --set strategy.shard_group_size=2 --set strategy.name=" + s);
    dirs += " " + dir;
    const Json summary = Json::parse(read_file(dir + "/summary.json"));
    const Json& hashes = summary.at("parameter_fnv1a_per_rank");
    EXPECT_EQ(hashes.at(0), hashes.at(2)) << s << ": ranks 0 and 2 hold one shard";
    EXPECT_EQ(hashes.at(1), hashes.at(3)) << s << ": ranks 1 and 3 hold one shard";
    EXPECT_NE(hashes.at(0), hashes.at(1)) << s;
    for (int rank = 0; rank < 4; ++rank) {
      expect_measured_as_reported(dir, rank, s);
      // The lower bound only: gloo's staging of the groups' collectives
      // (reduce-scatter over a copy of the whole input, sums over replicas)
      // outweighs the buffers here; ZeroMemoryFormulasAtWorldSizeFour holds
      // the upper bound.
      expect_transients_measured(dir, "", 0, rank, s);
      const double p = memory_of(ddp, rank, "parameter_bytes");
      const double g = memory_of(ddp, rank, "gradient_bytes");
      const double o = memory_of(ddp, rank, "optimizer_bytes");
      const double sharded = memory_of(dir, rank, "optimizer_bytes") +
                             (s == "zero1" ? 0 : memory_of(dir, rank, "gradient_bytes")) +
                             (s == "zero3" ? memory_of(dir, rank, "parameter_bytes") : 0);
      const double whole = o + (s == "zero1" ? 0 : g) + (s == "zero3" ? p : 0);
      EXPECT_LE(sharded, half_of(whole)) << s << " rank " << rank;
      // The second rank of a pair may own up to 64 elements per group and
      // state tensor fewer than half (the first holds the padding).
      EXPECT_GE(sharded, whole / 2 - 2 * 64 * 4 * 3) << s << " rank " << rank << ": half, not a quarter";
    }
  }
  const auto result = trainer("compare --rtol 1e-5" + dirs);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // A size that does not divide the world is refused, naming the key.
  const auto refused = trainer("run " + source_path("configs/quickstart.toml") +
                               " --set run.output_dir=" + scratch_dir("Hybrid_refused") + " " + common +
                               " --set strategy.name=zero2 --set strategy.shard_group_size=3");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("[strategy] shard_group_size: expected a divisor of the world size 4"),
            std::string::npos)
      << refused.output;
}

// With buckets smaller than the model, zero2 never holds its full gradient:
// at most two buckets at once (the largest: one MLP matrix of 64 x 128,
// larger than the 0.02 MB asked for) plus the group of biases and norms
// (2 x 256 + 64 elements), whose gradients arrive in every layer and so
// live through backward. The sums are the same ones.
// Reproducible mode: the core sums every gradient exactly
// (StrategyEnv::exact_gradients), so a strategy keeps only the gradient its
// update reads. zero1 holds no full gradient beside its shard, zero2 no
// bucket: their reports say so, and the run's counting allocator agrees
// after setup. What a step leaves beyond that is the exact accumulator
// alone, allocated after setup: 8 bytes a parameter, or 4 where its low
// limbs live in the strategy's gradient (ddp; any stage at world size 1); no gradient
// autograd stored in .grad outlives its backward (one would be 330 kB).
TEST(Strategies, ReproducibleModeKeepsOnlyTheGradientTheUpdateReads) {
  const std::string common =
      "--set training.steps=2 --set training.micro_batch_size=2 --set training.grad_accum_steps=2";
  const std::string repro = " --set training.reproducible=true --set strategy.name=";
  std::map<std::string, std::string> dirs;
  for (const std::string s : {"zero1", "zero2"}) {
    dirs[s] = run("Exact_" + s, "configs/quickstart.toml", common + " --nproc 2" + repro + s);
    dirs[s + "_plain"] =
        run("Exact_" + s + "_plain", "configs/quickstart.toml", common + " --nproc 2 --set strategy.name=" + s);
  }
  dirs["ddp"] = run("Exact_ddp", "configs/quickstart.toml", common + repro + "ddp");
  constexpr int64_t kParameters = 82496;  // the quickstart model's
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t shard = memory_of(dirs["zero1"], rank, "gradient_bytes");
    EXPECT_EQ(shard, memory_of(dirs["zero2_plain"], rank, "gradient_bytes")) << rank << ": zero2 keeps the shard alone";
    // Without the mode zero1 also keeps the full gradient: the shard twice over at world size 2 (rank 0's, padded).
    EXPECT_GE(memory_of(dirs["zero1_plain"], rank, "gradient_bytes") - shard, kParameters * 4) << rank;
    EXPECT_EQ(memory_of(dirs["zero2"], rank, "gradient_bytes"), shard) << rank;
    EXPECT_EQ(memory_of(dirs["zero2"], rank, "peak_transient_gradient_bytes"), 0) << rank;
    EXPECT_GT(memory_of(dirs["zero2_plain"], rank, "peak_transient_gradient_bytes"), 0) << rank;
  }
  for (const auto& [name, dir] : dirs) {
    if (name.find("_plain") != std::string::npos) continue;
    for (int rank = 0; rank < (name == "ddp" ? 1 : 2); ++rank) {
      const int64_t reported = memory_of(dir, rank, "parameter_bytes") + memory_of(dir, rank, "gradient_bytes") +
                               memory_of(dir, rank, "optimizer_bytes");
      const int64_t after_setup = memory_of(dir, rank, "measured_after_setup_bytes");
      EXPECT_GE(after_setup, reported) << name << " rank " << rank;
      EXPECT_LE(after_setup, reported + 16384) << name << " rank " << rank << ": more than the report after setup";
      // The accumulator per parameter, and the 16 kB of small tensors (expect_measured_as_reported).
      const int64_t bytes = name == "ddp" ? 4 : 8;
      const int64_t left = memory_of(dir, rank, "measured_after_first_step_bytes") - after_setup;
      EXPECT_GE(left, kParameters * bytes) << name << " rank " << rank;
      EXPECT_LE(left, kParameters * bytes + 16384) << name << " rank " << rank << ": a step left more than the sums";
    }
  }
}

// ddp's overlap_update cuts the update by the model's units (on CUDA it
// runs behind the next forward: tests/gpu): an element-wise optimizer gives
// the same bits however its elements are cut, so the run is the ordered
// one's: with accumulation, two ranks, bf16 compute and bf16 optimizer
// state, Lion, and across a resume (the checkpoint reads the state the
// update writes).
TEST(Strategies, DdpOverlapUpdateTrainsTheBitsOfTheOrderedUpdate) {
  const std::string base = "--set training.steps=6 --set training.micro_batch_size=4 --set training.grad_accum_steps=2";
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"plain", ""},
      {"ranks", " --nproc 2 --set training.micro_batch_size=2"},
      {"bf16", " --set training.precision=bf16 --set optimizer.state_dtype=bf16"},
      {"lion", " --set optimizer.name=lion --set optimizer.lr=3e-4"},
  };
  for (const auto& [name, extra] : variants) {
    const std::string ordered = run("Ordered_" + name, "configs/quickstart.toml", base + extra);
    const std::string overlapped =
        run("Overlapped_" + name, "configs/quickstart.toml", base + extra + " --set strategy.overlap_update=true");
    const auto reference = read_metrics(ordered + "/metrics.jsonl");
    const auto rows = read_metrics(overlapped + "/metrics.jsonl");
    ASSERT_EQ(rows.size(), 6u) << name;
    EXPECT_EQ(column(rows, "loss"), column(reference, "loss")) << name;
    EXPECT_EQ(column(rows, "grad_norm"), column(reference, "grad_norm")) << name;
    EXPECT_EQ(read_file(overlapped + "/summary.json"), read_file(ordered + "/summary.json")) << name;
  }
  // Checkpointed at step 3 with the update overlapped, resumed to step 6.
  const std::string straight = run("Ordered_plain_again", "configs/quickstart.toml", base);
  const std::string dir = scratch_dir("Overlapped_resumed");
  const std::string on = " --set strategy.overlap_update=true --set run.output_dir=" + dir;
  const std::string recipe = "run " + source_path("configs/quickstart.toml") + " " + base;
  const auto first = trainer(recipe + on + " --set training.steps=3 --set checkpoint.interval=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = trainer(recipe + on + " --set checkpoint.resume=auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(read_file(dir + "/summary.json"), read_file(straight + "/summary.json"));
  EXPECT_EQ(column(read_metrics(dir + "/metrics.jsonl"), "loss"),
            column(read_metrics(straight + "/metrics.jsonl"), "loss"));
}

// Where the cut cannot hold, the option is refused by name before training.
TEST(Strategies, DdpOverlapUpdateIsRefusedWhereTheCutCannotHold) {
  const std::string recipe = "run " + source_path("configs/quickstart.toml") +
                             " --set training.steps=2 --set strategy.overlap_update=true --set run.output_dir=";
  const auto muon = trainer(recipe + scratch_dir("OverlapMuon") + " --set optimizer.name=muon");
  EXPECT_EQ(muon.exit_code, 2) << muon.output;
  EXPECT_NE(muon.output.find("overlap_update: expected false with an optimizer that transforms whole matrices"),
            std::string::npos)
      << muon.output;
  const auto exact = trainer(recipe + scratch_dir("OverlapExact") + " --set training.reproducible=true");
  EXPECT_EQ(exact.exit_code, 2) << exact.output;
  EXPECT_NE(exact.output.find("overlap_update: expected false with training.reproducible"), std::string::npos)
      << exact.output;
}

TEST(Strategies, ZeroTwoHoldsAtMostTwoBucketsOfFullGradient) {
  const std::string overrides =
      "--set training.steps=3 --set training.micro_batch_size=2 --set training.grad_accum_steps=2"
      " --nproc 4 --set strategy.name=zero2";
  const std::string whole = run("Z2Buckets_whole", "configs/quickstart.toml", overrides);
  const std::string small =
      run("Z2Buckets_small", "configs/quickstart.toml", overrides + " --set strategy.bucket_mb=0.02");
  const int64_t bound = 2 * 64 * 128 * 4 + (2 * 256 + 64) * 4;
  for (int rank = 0; rank < 4; ++rank) {
    expect_measured_as_reported(small, rank, "zero2 small buckets");
    const int64_t peak = memory_of(small, rank, "peak_transient_gradient_bytes");
    EXPECT_GE(peak, 64 * 128 * 4) << rank;
    EXPECT_LE(peak, bound) << rank;
    // The shard, a quarter of each group padded to 4 x 64 elements, in fp32:
    // 81920 decay elements (a multiple of 256) and 576 biases and norms
    // padded to 768.
    EXPECT_EQ(memory_of(small, rank, "gradient_bytes"), (81920 + 768) / 4 * 4) << rank;
  }
  // Other buckets reduce the same elements in other messages: the same sums up to their order.
  const auto result = trainer("compare --rtol 1e-6 " + whole + " " + small);
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST(Strategies, AllStrategiesAndSplitsOfOneGlobalBatchAgree) {
  std::string dirs;
  for (const std::string& s : kStrategies) {
    for (const auto& [micro, accum, world] :
         std::vector<std::tuple<int, int, int>>{{8, 1, 1}, {2, 4, 1}, {4, 1, 2}, {1, 4, 2}}) {
      const std::string name =
          "Matrix_" + s + "_" + std::to_string(micro) + "x" + std::to_string(accum) + "x" + std::to_string(world);
      dirs += " " + run(name, "configs/quickstart.toml",
                        "--set training.steps=15 --set strategy.name=" + s + " --set training.micro_batch_size=" +
                            std::to_string(micro) + " --set training.grad_accum_steps=" + std::to_string(accum) +
                            " --nproc " + std::to_string(world));
    }
  }
  // Same samples per step; fp32 sums in other orders: seen ~1e-7.
  const auto result = trainer("compare --rtol 1e-5" + dirs);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("all agree"), std::string::npos) << result.output;
}

TEST(Strategies, SeedScenarioAccumulationAgreesOnTheCpu) {
  const std::string split = run("Seed2x4", "configs/seed-zero2.toml", "");
  const std::string whole =
      run("Seed8x1", "configs/seed-zero2.toml", "--set training.micro_batch_size=8 --set training.grad_accum_steps=1");
  const std::string ddp =
      run("Seed8x1Ddp", "configs/seed-zero2.toml",
          "--set training.micro_batch_size=8 --set training.grad_accum_steps=1 --set strategy.name=ddp");
  EXPECT_EQ(read_metrics(split + "/metrics.jsonl").size(), 100u);
  const auto result = trainer("compare --rtol 1e-5 " + whole + " " + split + " " + ddp);
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST(Compare, DisagreementExitsWithOne) {
  const std::string a = run("CompareA", "configs/quickstart.toml", "--set training.steps=5");
  const std::string b = run("CompareB", "configs/quickstart.toml", "--set training.steps=5 --set optimizer.lr=1e-2");
  const auto result = trainer("compare " + a + " " + b);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("DIFFER"), std::string::npos) << result.output;
  EXPECT_EQ(trainer("compare " + a + " " + a).exit_code, 0);
}

}  // namespace
}  // namespace trainer
