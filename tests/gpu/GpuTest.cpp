// Tests that need CUDA (label gpu; skipped without a device): the nccl
// backend's collectives at one rank, and training on the GPU agreeing with
// the CPU and with itself across accumulation splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>
#include <tuple>

#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "TestSupport.h"
#include "checkpoint/Checkpoint.h"
#include "gpu/GpuTestSupport.h"
#include "kit/Reference.h"
#include "plugin/PluginRegistry.h"
#include "trainer/Comm.h"
#include "trainer/Errors.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/ShardGroups.h"

namespace trainer {
namespace {

using testing::kCuda;

// The nccl plugin, connected as the only rank on GPU 0.
std::unique_ptr<Comm> nccl_at_one_rank(std::chrono::milliseconds timeout) {
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  auto comm = PluginRegistry::create<Comm>(registry.find(PluginKind::Comm, "nccl"), Options(), Context());
  comm->connect(CommSetup{c10::make_intrusive<c10d::HashStore>(), 0, 1, timeout, kCuda});
  return comm;
}

// At one rank every collective's result equals its input, so a backend
// that did nothing would pass an in-place check: outputs go into a slice of
// a sentinel-filled buffer (the slice written, nothing around it), and a
// tensor nccl cannot take is refused by name.
TEST(NcclComm, CollectivesAtOneRank) {
  REQUIRE_CUDA();
  const std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(30));
  const auto on_gpu = torch::TensorOptions().device(kCuda);
  for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kInt64}) {
    torch::Tensor t = torch::arange(10, on_gpu.dtype(dtype)) + 1;
    const torch::Tensor expected = t.clone();
    comm->all_reduce_sum(t);
    EXPECT_TRUE(torch::equal(t, expected)) << dtype;
    for (const bool gather : {false, true}) {
      torch::Tensor buffer = torch::full({16}, -7, on_gpu.dtype(dtype));
      torch::Tensor out = buffer.narrow(0, 3, 10);
      if (gather) {
        comm->all_gather(t, out);
      } else {
        comm->reduce_scatter_sum(t, out);
      }
      EXPECT_TRUE(torch::equal(out, expected)) << dtype << (gather ? " all_gather" : " reduce_scatter");
      EXPECT_TRUE(torch::equal(buffer.narrow(0, 0, 3), torch::full({3}, -7, on_gpu.dtype(dtype))));
      EXPECT_TRUE(torch::equal(buffer.narrow(0, 13, 3), torch::full({3}, -7, on_gpu.dtype(dtype))));
    }
    comm->broadcast(t, 0);
    EXPECT_TRUE(torch::equal(t, expected));
  }
  torch::Tensor strided = torch::zeros({4, 4}, on_gpu).t();
  EXPECT_THROW(comm->all_reduce_sum(strided), std::invalid_argument);
  torch::Tensor on_host = torch::zeros({4});
  EXPECT_THROW(comm->all_reduce_sum(on_host), std::invalid_argument);
  comm->barrier();
}

// Hybrid sharding's groups over nccl at one rank (the CUDA build has no
// gloo for CommGroups.*): every size but 1 and 0 is refused naming the key;
// 1 and 0 give a shard group and a replica group of one, whose sums are the
// rank's own value, on sub-communicators that work.
TEST(CommGroupsNccl, ShardGroupsAtOneRank) {
  REQUIRE_CUDA();
  const std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(30));
  for (const int64_t size : {int64_t(1), int64_t(0)}) {
    ShardGroups groups(*comm, size, "zero2");
    EXPECT_EQ(groups.shard().world_size(), 1);
    EXPECT_EQ(groups.replicas().world_size(), 1);
    torch::Tensor t = torch::full({5}, 3.0, torch::TensorOptions().device(kCuda));
    groups.sum_over_replicas(t);
    EXPECT_TRUE(torch::equal(t, torch::full({5}, 3.0, t.options())));
    torch::Tensor gathered = torch::zeros({5}, t.options());
    groups.shard().all_gather(t, gathered);
    EXPECT_TRUE(torch::equal(gathered, t));
  }
  try {
    const ShardGroups groups(*comm, 3, "zero3");
    FAIL() << "a size that does not divide the world";
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()),
              "strategy.shard_group_size = 3: must divide the world size 1 (strategy 'zero3')");
  }
}

// Sub-groups at one rank (ncclCommSplit): the new communicator has its own
// rank and size, works while the parent's collectives are in flight, splits
// again, and both are destroyed cleanly (child first, then parent).
TEST(NcclComm, SplitGivesAWorkingSubGroup) {
  REQUIRE_CUDA();
  const std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(30));
  std::unique_ptr<Comm> group = comm->split(0, 7);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->world_size(), 1);
  const auto on_gpu = torch::TensorOptions().device(kCuda);
  torch::Tensor a = torch::arange(1 << 20, on_gpu), b = torch::arange(1 << 20, on_gpu) * 2;
  const torch::Tensor a0 = a.clone(), b0 = b.clone();
  auto in_parent = comm->all_reduce_sum_async(a);
  auto in_group = group->all_reduce_sum_async(b);
  in_group->wait();
  in_parent->wait();
  EXPECT_TRUE(torch::equal(a, a0));
  EXPECT_TRUE(torch::equal(b, b0));
  std::unique_ptr<Comm> nested = group->split(3, 0);
  const torch::Tensor four = torch::arange(4, on_gpu.dtype(torch::kFloat32));
  torch::Tensor gathered = torch::zeros({4}, on_gpu.dtype(torch::kFloat32));
  nested->all_gather(four, gathered);
  EXPECT_TRUE(torch::equal(gathered, four));
  nested.reset();
  group.reset();
  comm->barrier();
}

// The watchdog, at one rank: with every collective held back on its stream
// (TRAINER_FAULT_INJECT=nccl-hang, a peer that never comes), wait() returns
// while the collective is still pending (the host does not spin: the
// stream, queried after wait(), has not finished), the communicator is
// aborted after the timeout, the next collective fails naming the hung one
// and the rank, and the aborted communicator is not destroyed again.
// Returns what the next collective (a host barrier, which waits for the
// watchdog) throws ("" when it does not); `pending`: whether wait()
// returned before the collective's stream work was done.
std::string failure_after_a_hang(Comm& comm, bool* pending) {
  torch::Tensor t = torch::ones({16}, torch::TensorOptions().device(kCuda));
  comm.all_reduce_sum_async(t)->wait();
  *pending = !c10::cuda::getCurrentCUDAStream(kCuda.index()).query();
  try {
    comm.barrier();
  } catch (const TrainingError& error) {
    return error.what();
  }
  return "";
}

TEST(NcclComm, AHungCollectiveIsAbortedOnceAndNamed) {
  REQUIRE_CUDA();
  setenv("TRAINER_FAULT_INJECT", "nccl-hang", 1);
  std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(1));
  unsetenv("TRAINER_FAULT_INJECT");
  bool pending = false;
  const std::string what = failure_after_a_hang(*comm, &pending);
  EXPECT_FALSE(what.empty()) << "a collective after the abort did not fail";
  EXPECT_TRUE(pending) << "wait() held the host until the collective finished";
  EXPECT_NE(what.find("nccl all-reduce on rank 0 did not finish within 1 s"), std::string::npos) << what;
  EXPECT_NE(what.find("aborted"), std::string::npos) << what;
  torch::cuda::synchronize();
  comm.reset();  // no ncclCommDestroy on the aborted communicator: no crash, no hang
}

// A sub-group's watchdog names the sub-group and the rank it came from.
TEST(NcclComm, AHungCollectiveInASubGroupNamesIt) {
  REQUIRE_CUDA();
  setenv("TRAINER_FAULT_INJECT", "nccl-hang", 1);
  std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(1));
  std::unique_ptr<Comm> group = comm->split(0, 0);
  unsetenv("TRAINER_FAULT_INJECT");
  bool pending = false;
  const std::string what = failure_after_a_hang(*group, &pending);
  EXPECT_FALSE(what.empty()) << "a collective after the abort did not fail";
  EXPECT_NE(what.find("nccl all-reduce on rank 0 of a sub-group of 1 (rank 0) did not finish within 1 s"),
            std::string::npos)
      << what;
  torch::cuda::synchronize();
  group.reset();
  comm.reset();
}

// barrier() is a host barrier: with the collective held back (a peer that
// never comes), it does not return until the watchdog aborted, and then it
// throws. A barrier that only ordered the stream would return at once.
TEST(NcclComm, BarrierBlocksTheHostUntilEveryRankArrives) {
  REQUIRE_CUDA();
  setenv("TRAINER_FAULT_INJECT", "nccl-hang", 1);
  std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(1));
  unsetenv("TRAINER_FAULT_INJECT");
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    comm->barrier();
  } catch (const TrainingError& error) {
    what = error.what();
  }
  const auto held = std::chrono::steady_clock::now() - start;
  EXPECT_NE(what.find("nccl all-reduce on rank 0 did not finish within 1 s"), std::string::npos)
      << "barrier returned without the peer: '" << what << "'";
  EXPECT_GE(held, std::chrono::milliseconds(900)) << "barrier returned before the timeout";
  torch::cuda::synchronize();
  comm.reset();
}

// Once one communicator of the process is aborted, every other one is: the
// parent of a hung sub-group fails its next collective naming the cause, and
// both are torn down without ncclCommDestroy (which would wait for a dead
// peer).
TEST(NcclComm, AnAbortAbortsEveryCommunicatorOfTheProcess) {
  REQUIRE_CUDA();
  std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(1));
  setenv("TRAINER_FAULT_INJECT", "nccl-hang", 1);
  std::unique_ptr<Comm> group = comm->split(0, 0);
  unsetenv("TRAINER_FAULT_INJECT");
  bool pending = false;
  EXPECT_FALSE(failure_after_a_hang(*group, &pending).empty());
  std::string what;
  try {
    comm->barrier();
  } catch (const TrainingError& error) {
    what = error.what();
  }
  EXPECT_NE(what.find("aborted because another communicator of this process was"), std::string::npos)
      << "the parent went on: '" << what << "'";
  torch::cuda::synchronize();
  group.reset();
  comm.reset();
}

// A rank that holds no state slice still meets the others in a checkpoint's
// collectives, on the run's device: with its tensors on the CPU (where the
// first slice's device was taken from before), nccl refused them. At one
// rank, a strategy that holds nothing reaches the coverage check, which
// names the missing range, instead of nccl's refusal.
TEST(NcclComm, ACheckpointOfARankWithoutStateUsesTheRunsDevice) {
  REQUIRE_CUDA();
  class HoldsNothing final : public Strategy {
   public:
    void setup(Model&, Comm&, const StrategyEnv&) override {}
    void backward(const torch::Tensor&, const MicroStep&) override {}
    double reduce_gradients_and_norm() override { return 0.0; }
    void apply_update(const UpdateArgs&) override {}
    void discard_gradients() override {}
    MemoryReport memory() const override { return {}; }
    std::vector<FlatSlice> gradient_slices() const override { return {}; }
    std::vector<FlatSlice> parameter_slices() const override { return {}; }
    std::vector<StateSlice> state_slices() override { return {}; }
    void state_loaded() override {}
  } strategy;
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  std::unique_ptr<Model> model = kit::make_model(registry);
  const std::unique_ptr<Comm> comm = nccl_at_one_rank(std::chrono::seconds(30));
  Checkpointer checkpointer(scratch_dir("NoStateCheckpoint"), 1, "test", "test", "holds-nothing", kCuda);
  try {
    checkpointer.save(strategy, *model, *comm, TrainingPosition{1, 1, {}});
    FAIL() << "a checkpoint of nothing was written";
  } catch (const std::logic_error& error) {
    EXPECT_NE(std::string(error.what()).find("no rank holds elements"), std::string::npos) << error.what();
  } catch (const std::exception& error) {
    FAIL() << "the collectives failed: " << error.what();
  }
}

// One GPU per task (Slurm's --gpus-per-task=1, or CUDA_VISIBLE_DEVICES of
// one device): local rank 1 sees one device and trains on it as device 0.
TEST(GpuTraining, OneVisibleGpuPerTaskIsAccepted) {
  REQUIRE_CUDA();
  const std::string dir = scratch_dir("OneGpuPerTask");
  const auto result = run_command("CUDA_VISIBLE_DEVICES=0 RANK=0 WORLD_SIZE=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 " +
                                  std::string(TRAINER_BINARY) + " run " + kQuickstart +
                                  " --set run.device=cuda --set training.steps=2 --set run.output_dir=" + dir);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(read_metrics(dir + "/metrics.jsonl").size(), 2u) << result.output;
}

std::vector<double> losses(const std::string& name, const std::string& overrides) {
  const std::string dir = scratch_dir(name);
  const auto result = trainer("run " + source_path("configs/quickstart.toml") + " --set run.output_dir=" + dir +
                              " --set training.steps=30 " + overrides);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return column(read_metrics(dir + "/metrics.jsonl"), "loss");
}

TEST(GpuTraining, CudaMatchesCpuAndAccumulationSplits) {
  REQUIRE_CUDA();
  const std::vector<double> cpu = losses("GpuCpu", "");
  const std::vector<double> cuda = losses("GpuCuda", "--set run.device=cuda");
  const std::vector<double> split =
      losses("GpuSplit", "--set run.device=cuda --set training.micro_batch_size=2 --set training.grad_accum_steps=4");
  ASSERT_EQ(cpu.size(), 30u);
  ASSERT_EQ(cuda.size(), 30u);
  ASSERT_EQ(split.size(), 30u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    // Different kernels (cuBLAS vs CPU BLAS) round differently; 30 Adam
    // steps keep fp32 runs within 1e-3 on this small model.
    EXPECT_LE(std::abs(cuda[i] - cpu[i]), 1e-3 * cpu[i]) << "step " << i + 1;
    EXPECT_LE(std::abs(split[i] - cuda[i]), 1e-5 * cuda[i]) << "step " << i + 1;
  }
}

// Packed records on CUDA (the document mask through SDPA, per-token RoPE
// rows through the kernel) train as on the CPU, and alike across splits.
TEST(GpuTraining, PackedRecordsOnCudaMatchTheCpuAndSplits) {
  REQUIRE_CUDA();
  const std::string dir = scratch_dir("GpuPacked");
  std::string records;
  torch::manual_seed(9);
  for (int r = 0; r < 64; ++r) {  // ragged: 2 to 40 tokens, a third of them prompt
    const int64_t length = torch::randint(2, 41, {1}).item<int64_t>();
    const torch::Tensor ids = torch::randint(0, 250, {length});
    std::string prompt, completion;
    for (int64_t i = 0; i < length; ++i) {
      std::string& part = i < std::max<int64_t>(1, length / 3) ? prompt : completion;
      part += (part.empty() ? "" : ", ") + std::to_string(ids[i].item<int64_t>());
    }
    records += "{\"prompt_ids\": [" + prompt + "], \"completion_ids\": [" + completion + "]}\n";
  }
  const std::string recipe =
      write_file(dir + "/packed.toml",
                 "[model]\nname = 'qwen2'\nvocab_size = 256\nhidden_size = 64\nintermediate_size = 128\n"
                 "num_hidden_layers = 2\nnum_attention_heads = 4\nnum_key_value_heads = 2\n"
                 "[dataset]\nname = 'jsonl'\npath = '" +
                     write_file(dir + "/records.jsonl", records) +
                     "'\nvocab_size = 256\nseq_len = 64\npack = true\n[training]\nsteps = 20\nmicro_batch_size = 4\n"
                     "grad_accum_steps = 1\n");
  const auto run = [&](const std::string& name, const std::string& overrides) {
    const std::string out = dir + "/" + name;
    const auto result = trainer("run " + recipe + " --set run.output_dir=" + out + " " + overrides);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return column(read_metrics(out + "/metrics.jsonl"), "loss");
  };
  const std::vector<double> cpu = run("cpu", "");
  const std::vector<double> cuda = run("cuda", "--set run.device=cuda");
  const std::vector<double> split =
      run("split", "--set run.device=cuda --set training.micro_batch_size=1 --set training.grad_accum_steps=4");
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(cuda.size(), 20u);
  ASSERT_EQ(split.size(), 20u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    // As CudaMatchesCpuAndAccumulationSplits: other kernels, other roundings.
    EXPECT_LE(std::abs(cuda[i] - cpu[i]), 1e-3 * cpu[i]) << "step " << i + 1;
    EXPECT_LE(std::abs(split[i] - cuda[i]), 1e-5 * cuda[i]) << "step " << i + 1;
  }
}

// The seed scenario in bf16 on the GPU: micro-batch 2 x 4 accumulation steps
// against 8 x 1, for every strategy, and each against ddp.
TEST(GpuTraining, SeedScenarioInBf16AgreesAcrossSplitsAndStrategies) {
  REQUIRE_CUDA();
  auto run = [](const std::string& name, const std::string& overrides) {
    const std::string dir = scratch_dir(name);
    const auto result = trainer("run " + source_path("configs/seed-zero2.toml") + " --set run.output_dir=" + dir +
                                " --set run.device=cuda --set training.precision=bf16 " + overrides);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return dir;
  };
  const std::string ddp = run("SeedBf16Ddp",
                              "--set strategy.name=ddp --set training.micro_batch_size=8 "
                              "--set training.grad_accum_steps=1");
  std::string dirs;
  for (const char* s : {"zero1", "zero2", "zero3"}) {
    dirs += " " + run(std::string("SeedBf16_2x4_") + s, std::string("--set strategy.name=") + s);
    dirs += " " + run(std::string("SeedBf16_8x1_") + s,
                      std::string("--set strategy.name=") + s +
                          " --set training.micro_batch_size=8 --set training.grad_accum_steps=1");
  }
  // bf16 compute rounds each micro-batch differently (~2^-8 relative);
  // fp32 accumulation keeps 100 steps within 1e-2.
  const auto result = trainer("compare --rtol 1e-2 " + ddp + dirs);
  std::cout << result.output.substr(result.output.rfind("largest")) << std::endl;
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// training.precision = "fp8" trains the quickstart like bf16, with one
// scale per tensor and with one per row (training.fp8_scaling): the same
// recipe, the losses apart (FP8 rounds the linear layers' products at
// 2^-4 where bf16 rounds at 2^-9) but learning as fast: the last ten
// steps' mean loss within 10% of bf16's, all under half the first step's.
TEST(GpuTraining, Fp8TrainsTheQuickstartLikeBf16) {
  REQUIRE_CUDA();
  auto run = [](const std::string& precision, const std::string& scaling) {
    const std::string dir = scratch_dir("GpuFp8_" + precision + "_" + scaling);
    const auto result = trainer("run " + source_path("configs/quickstart.toml") + " --set run.output_dir=" + dir +
                                " --set run.device=cuda --set training.precision=" + precision +
                                (scaling.empty() ? "" : " --set training.fp8_scaling=" + scaling));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    if (precision == "fp8") {
      EXPECT_NE(result.output.find("linear layers in FP8"), std::string::npos) << result.output;
      EXPECT_EQ(result.output.find("scale per row") != std::string::npos, scaling == "rowwise") << result.output;
    }
    return column(read_metrics(dir + "/metrics.jsonl"), "loss");
  };
  const std::vector<double> bf16 = run("bf16", ""), fp8 = run("fp8", ""), rowwise = run("fp8", "rowwise");
  ASSERT_EQ(bf16.size(), 200u);
  ASSERT_EQ(fp8.size(), 200u);
  ASSERT_EQ(rowwise.size(), 200u);
  const auto tail = [](const std::vector<double>& v) {
    double sum = 0;
    for (size_t i = v.size() - 10; i < v.size(); ++i) sum += v[i];
    return sum / 10;
  };
  EXPECT_NE(bf16, fp8) << "the FP8 run rounded nothing differently";
  EXPECT_NE(fp8, rowwise) << "the rowwise run scaled as the tensorwise one";
  EXPECT_NE(bf16, rowwise) << "the rowwise run rounded nothing differently";
  EXPECT_LT(tail(bf16), 0.5 * bf16.front());
  for (const std::vector<double>* v : {&fp8, &rowwise}) {
    EXPECT_LT(tail(*v), 0.5 * v->front());
    EXPECT_LE(std::abs(tail(*v) - tail(bf16)), 0.1 * tail(bf16)) << "bf16 " << tail(bf16) << ", fp8 " << tail(*v);
  }
}

// The FP8 weights' transposed casts are kept from forward to backward,
// except where the strategy releases parameters between uses (zero3): it
// would hold a byte a parameter of the whole model. Either way the run
// trains (the bits are the same: OpsGpu.Fp8KeptTransposedWeightsGiveTheSameBits).
TEST(GpuTraining, Fp8KeepsTransposedWeightsUnlessTheStrategyReleasesParameters) {
  REQUIRE_CUDA();
  for (const std::string strategy : {"ddp", "zero3"}) {
    const std::string dir = scratch_dir("GpuFp8Keep_" + strategy);
    const auto result = trainer("run " + source_path("configs/quickstart.toml") + " --set run.output_dir=" + dir +
                                " --set run.device=cuda --set training.precision=fp8 --set training.steps=2" +
                                " --set strategy.name=" + strategy);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    const bool kept = result.output.find("transposed casts are kept") != std::string::npos;
    const bool again = result.output.find("cast transposed again in backward") != std::string::npos;
    EXPECT_EQ(kept, strategy == "ddp") << strategy << ": " << result.output;
    EXPECT_EQ(again, strategy == "zero3") << strategy << ": " << result.output;
    EXPECT_EQ(read_metrics(dir + "/metrics.jsonl").size(), 2u) << result.output;
  }
}

// The runs in `dirs` trained the same bits as dirs[0] where two runs of
// dirs[0]'s recipe, dirs[0] and `again`, repeat theirs, else agree within
// that spread (at least 2^-8) by `compare`.
void expect_the_same_bits(const std::vector<std::string>& dirs, const std::string& what);
void expect_what_repeats(const std::vector<std::string>& dirs, const std::string& again, const std::string& what) {
  const std::vector<double> first = column(read_metrics(dirs[0] + "/metrics.jsonl"), "loss");
  const std::vector<double> second = column(read_metrics(again + "/metrics.jsonl"), "loss");
  ASSERT_FALSE(first.empty()) << what;
  ASSERT_EQ(first.size(), second.size()) << what;
  double spread = 0.0;
  for (size_t i = 0; i < first.size(); ++i)
    spread = std::max(spread, std::abs(first[i] - second[i]) / std::abs(first[i]));
  for (size_t arm = 1; arm < dirs.size(); ++arm) {
    if (spread == 0.0) {
      expect_the_same_bits({dirs[0], dirs[arm]}, what + ": " + dirs[arm]);
    } else {
      const double rtol = std::max(spread, std::ldexp(1.0, -8));
      const auto close = trainer("compare --rtol " + std::to_string(rtol) + " " + dirs[0] + " " + dirs[arm]);
      EXPECT_EQ(close.exit_code, 0) << what << ": " << dirs[arm] << " (two runs differ by " << spread << ")\n"
                                    << close.output;
    }
  }
}

// FP8 with accumulation: a step's later micro-steps reuse the weights' casts
// of its first (ops::Fp8WeightReuse, held to the same bits op by op in
// OpsGpu.Fp8WeightCastsReusedWithinAStepGiveTheSameBits). The run trains
// the bits of one that casts them at every micro-step (CUDA graphs, which
// never reuse: a replay reads what its capture cast), with ddp and zero1,
// and with the update run behind the next step's forward (overlap_update),
// whose first micro-step must cast the updated weights; a stale cast kept
// across steps would train other bits. The same bits with both layouts
// kept (training.fp8_weight_casts = "both"). zero3 releases its parameters
// between uses and casts at every micro-step (and says that "both" keeps
// nothing there).
TEST(GpuTraining, Fp8WeightCastsReusedAcrossMicroStepsTrainTheSameBits) {
  REQUIRE_CUDA();
  const std::string recipe_file = testing::token_file_quickstart("GpuFp8Reuse_data", 8 * 6);
  ASSERT_FALSE(recipe_file.empty());
  const std::string common =
      " --set run.device=cuda --set training.steps=6 --set training.precision=fp8"
      " --set training.micro_batch_size=2 --set training.grad_accum_steps=4";
  const std::string reuse_line = "casts reused by its 4 micro-steps";
  for (const std::string strategy : {"ddp", "zero1"}) {
    std::vector<std::string> dirs;
    std::string again;
    for (const std::string arm : {"reused", "reused_again", "graphs", "overlapped", "both", "both_overlapped"}) {
      if (arm.find("overlapped") != std::string::npos && strategy != "ddp") continue;
      const std::string dir = scratch_dir("GpuFp8Reuse_" + strategy + "_" + arm);
      std::string extra = " --set strategy.name=" + strategy;
      if (arm == "graphs") extra += " --set training.cuda_graphs=true";
      if (arm.find("overlapped") != std::string::npos) extra += " --set strategy.overlap_update=true";
      if (arm.rfind("both", 0) == 0) extra += " --set training.fp8_weight_casts=both";
      const auto result = trainer("run " + recipe_file + " --set run.output_dir=" + dir + common + extra);
      ASSERT_EQ(result.exit_code, 0) << strategy << " " << arm << "\n" << result.output;
      EXPECT_EQ(result.output.find(reuse_line) != std::string::npos, arm != "graphs") << strategy << " " << arm << "\n"
                                                                                      << result.output;
      EXPECT_EQ(result.output.find("both layouts kept") != std::string::npos, arm.rfind("both", 0) == 0)
          << strategy << " " << arm << "\n"
          << result.output;
      EXPECT_EQ(read_metrics(dir + "/metrics.jsonl").size(), 6u) << result.output;
      (arm == "reused_again" ? again : dirs.emplace_back()) = dir;
    }
    expect_what_repeats(dirs, again, "fp8 " + strategy);
  }
  const std::string dir = scratch_dir("GpuFp8Reuse_zero3");
  const auto zero3 = trainer("run " + recipe_file + " --set run.output_dir=" + dir + common +
                             " --set strategy.name=zero3 --set training.fp8_weight_casts=both");
  ASSERT_EQ(zero3.exit_code, 0) << zero3.output;
  EXPECT_EQ(zero3.output.find(reuse_line), std::string::npos) << zero3.output;
  EXPECT_NE(zero3.output.find("fp8_weight_casts = 'both' keeps nothing in this run"), std::string::npos)
      << zero3.output;
  EXPECT_NE(zero3.output.find("(zero3) releases parameters"), std::string::npos) << zero3.output;
}

// The runs in `dirs` logged the same losses at every step (compare --rtol 0)
// and ended with the same weights (their hash).
void expect_the_same_bits(const std::vector<std::string>& dirs, const std::string& what) {
  std::string all;
  for (const std::string& dir : dirs) all += " " + dir;
  const auto same = trainer("compare --rtol 0" + all);
  EXPECT_EQ(same.exit_code, 0) << what << "\n" << same.output;
  const auto hash = [](const std::string& dir) {
    const std::string text = testing::read_file(dir + "/summary.json");
    return text.substr(text.find("parameters_xxh3_128"));
  };
  for (const std::string& dir : dirs) EXPECT_EQ(hash(dir), hash(dirs.front())) << what << " " << dir;
}

// training.reproducible on CUDA: the (8,1) and (2,4) splits, and other
// strategies, train the same bits in fp32, in bf16, and in bf16 with bf16
// optimizer state (AdamW's one-pass kernel).
TEST(GpuTraining, ReproducibleSplitsAreBitIdenticalOnCuda) {
  REQUIRE_CUDA();
  for (const std::string variant : {"fp32", "bf16", "bf16_state"}) {
    const std::string precision = variant == "fp32" ? "fp32" : "bf16";
    const std::string state = variant == "bf16_state" ? " --set optimizer.state_dtype=bf16" : "";
    std::vector<std::string> dirs;
    for (const auto& [strategy, micro, accum] : std::vector<std::tuple<std::string, int, int>>{
             {"ddp", 8, 1}, {"ddp", 2, 4}, {"zero2", 2, 4}, {"zero3", 1, 8}}) {
      const std::string dir = scratch_dir("GpuRepro_" + variant + "_" + strategy + "_" + std::to_string(micro) + "x" +
                                          std::to_string(accum));
      const auto result =
          trainer("run " + source_path("configs/quickstart.toml") + " --set run.output_dir=" + dir +
                  " --set run.device=cuda --set training.steps=8 --set training.reproducible=true" +
                  " --set training.precision=" + precision + state + " --set strategy.name=" + strategy +
                  " --set training.micro_batch_size=" + std::to_string(micro) +
                  " --set training.grad_accum_steps=" + std::to_string(accum));
      ASSERT_EQ(result.exit_code, 0) << result.output;
      dirs.push_back(dir);
    }
    expect_the_same_bits(dirs, variant);
  }
}

// training.cuda_graphs: the atoms replayed from CUDA graphs train the bits
// of the eager atoms, at two splits and under ddp and zero2 (graphs share
// nothing with the split: every atom has one shape), and the runs did
// replay (their last log line counts the replays). zero3 gathers per unit,
// so its atoms are not replayable: refused by key.
TEST(GpuTraining, CudaGraphAtomsTrainTheBitsOfEagerAtoms) {
  REQUIRE_CUDA();
  for (const char* precision : {"fp32", "bf16"}) {
    std::vector<std::string> dirs;
    for (const auto& [strategy, micro, accum, graphs] : std::vector<std::tuple<std::string, int, int, bool>>{
             {"ddp", 8, 1, false}, {"ddp", 8, 1, true}, {"ddp", 2, 4, true}, {"zero2", 4, 2, true}}) {
      const std::string dir =
          scratch_dir(std::string("GpuGraphs_") + precision + "_" + strategy + "_" + std::to_string(micro) + "x" +
                      std::to_string(accum) + (graphs ? "_graphs" : ""));
      const auto result = trainer("run " + source_path("configs/quickstart.toml") + " --set run.output_dir=" + dir +
                                  " --set run.device=cuda --set training.steps=8 --set training.reproducible=true" +
                                  " --set training.precision=" + precision + " --set strategy.name=" + strategy +
                                  " --set training.micro_batch_size=" + std::to_string(micro) +
                                  " --set training.grad_accum_steps=" + std::to_string(accum) +
                                  " --set training.cuda_graphs=" + (graphs ? "true" : "false"));
      ASSERT_EQ(result.exit_code, 0) << result.output;
      const size_t counted = result.output.find(" atoms replayed from ");
      if (graphs) {
        ASSERT_NE(counted, std::string::npos) << result.output;
        const size_t at = result.output.rfind("training.cuda_graphs: ", counted);
        ASSERT_NE(at, std::string::npos) << result.output;
        const int64_t replays = std::stoll(result.output.substr(at + std::string("training.cuda_graphs: ").size()));
        EXPECT_GT(replays, 8) << precision << " " << strategy << ": " << result.output;
        EXPECT_NE(result.output.find("captured"), std::string::npos) << result.output;
      } else {
        EXPECT_EQ(result.output.find("captured"), std::string::npos) << result.output;
      }
      dirs.push_back(dir);
    }
    expect_the_same_bits(dirs, precision);
  }
  const auto refused = trainer("run " + source_path("configs/quickstart.toml") +
                               " --set run.output_dir=" + scratch_dir("GpuGraphs_zero3") +
                               " --set run.device=cuda --set training.steps=2 --set training.reproducible=true"
                               " --set training.cuda_graphs=true --set strategy.name=zero3");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("cuda_graphs: expected false with strategy 'zero3'"), std::string::npos)
      << refused.output;
}

// training.cuda_graphs in the fast mode: micro-steps replayed from CUDA
// graphs train the bits of the same split run eagerly, under ddp (every
// micro-step replayed at world size 1) and zero1, with accumulation and
// without. The fast mode's own kernels must repeat their bits for that to
// be asked: each split runs eagerly twice, and where those two differ (an
// attention backward with atomic adds on this device) the graphs' run is
// held to their difference instead (compare --rtol at the eager pair's
// largest relative loss difference, at least bf16's unit roundoff 2^-8:
// graphs change no arithmetic, only who launches it). The quickstart's
// model on windows of a token file: every micro-batch has one target count,
// so one graph serves the run, and the log counts its replays. zero2 and
// zero3 reduce or gather during a micro-step: refused by key.
TEST(GpuTraining, CudaGraphMicroStepsTrainTheBitsOfEagerOnes) {
  REQUIRE_CUDA();
  const std::string recipe_file = testing::token_file_quickstart("GpuFastGraphs_data", 8 * 8);
  ASSERT_FALSE(recipe_file.empty());
  for (const char* precision : {"fp32", "bf16"}) {
    for (const auto& [strategy, micro, accum] :
         std::vector<std::tuple<std::string, int, int>>{{"ddp", 8, 1}, {"ddp", 2, 4}, {"zero1", 4, 2}}) {
      const std::string what =
          std::string(precision) + " " + strategy + " " + std::to_string(micro) + "x" + std::to_string(accum);
      std::vector<std::string> dirs;
      for (const char* arm : {"eager", "eager_again", "graphs"}) {
        const bool graphs = std::string(arm) == "graphs";
        const std::string dir = scratch_dir(std::string("GpuFastGraphs_") + precision + "_" + strategy + "_" +
                                            std::to_string(micro) + "x" + std::to_string(accum) + "_" + arm);
        const auto result =
            trainer("run " + recipe_file + " --set run.output_dir=" + dir +
                    " --set run.device=cuda --set training.steps=8 --set training.precision=" + precision +
                    " --set strategy.name=" + strategy + " --set training.micro_batch_size=" + std::to_string(micro) +
                    " --set training.grad_accum_steps=" + std::to_string(accum) +
                    " --set training.cuda_graphs=" + (graphs ? "true" : "false"));
        ASSERT_EQ(result.exit_code, 0) << what << "\n" << result.output;
        const size_t counted = result.output.find(" micro-steps replayed from 1 graphs");
        if (graphs) {
          ASSERT_NE(counted, std::string::npos) << what << "\n" << result.output;
          const size_t at = result.output.rfind("training.cuda_graphs: ", counted);
          ASSERT_NE(at, std::string::npos) << result.output;
          // The first micro-step runs eagerly, the second is captured and replayed, and so is every later one.
          const int64_t replays = std::stoll(result.output.substr(at + std::string("training.cuda_graphs: ").size()));
          EXPECT_EQ(replays, 8 * accum - 1) << what << ": " << result.output;
        } else {
          EXPECT_EQ(result.output.find("captured"), std::string::npos) << result.output;
        }
        dirs.push_back(dir);
      }
      expect_what_repeats({dirs[0], dirs[2]}, dirs[1], what);
    }
  }
  for (const char* strategy : {"zero2", "zero3"}) {
    const auto refused = trainer("run " + source_path("configs/quickstart.toml") +
                                 " --set run.output_dir=" + scratch_dir(std::string("GpuFastGraphs_") + strategy) +
                                 " --set run.device=cuda --set training.steps=2 --set training.cuda_graphs=true" +
                                 " --set strategy.name=" + strategy);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(std::string("cuda_graphs: expected false with strategy '") + strategy + "'"),
              std::string::npos)
        << refused.output;
  }
}

// ddp's overlap_update on CUDA: the update runs unit by unit on a stream of
// its own behind the next forward, whose units each wait for their own
// update before reading their parameters. The embedding (the first unit)
// is made large, 32768 x 512 = 16.8M parameters (~0.1 ms of AdamW at the
// device's bandwidth, against the few microseconds the host takes to launch
// the next forward's lookup), so a forward that did not wait would read
// rows the update had not written yet. Held to the ordered run's bits where
// two ordered runs repeat theirs, else to their spread (as the test above);
// also with cuda_graphs, which replays only micro-steps after a step's first.
TEST(GpuTraining, OverlappedUpdateTrainsTheBitsOfTheOrderedOne) {
  REQUIRE_CUDA();
  const std::string recipe_file = testing::token_file_quickstart("GpuOverlap_data", 8 * 8);
  ASSERT_FALSE(recipe_file.empty());
  const std::string common =
      " --set run.device=cuda --set training.steps=8 --set training.precision=bf16 --set training.micro_batch_size=4"
      " --set training.grad_accum_steps=2 --set model.vocab_size=32768 --set model.hidden_size=512"
      " --set model.intermediate_size=1024 --set model.num_attention_heads=8";
  std::vector<std::string> dirs;
  for (const char* arm : {"ordered", "ordered_again", "overlapped", "overlapped_graphs"}) {
    const std::string name = arm;
    const std::string dir = scratch_dir("GpuOverlap_" + name);
    std::string extra = name.rfind("overlapped", 0) == 0 ? " --set strategy.overlap_update=true" : "";
    if (name == "overlapped_graphs") extra += " --set training.cuda_graphs=true";
    const auto result = trainer("run " + recipe_file + " --set run.output_dir=" + dir + common + extra);
    ASSERT_EQ(result.exit_code, 0) << name << "\n" << result.output;
    if (name == "overlapped_graphs") {
      EXPECT_NE(result.output.find("all but the first micro-step of a step"), std::string::npos) << result.output;
      EXPECT_NE(result.output.find(" micro-steps replayed from 1 graphs"), std::string::npos) << result.output;
    }
    dirs.push_back(dir);
  }
  ASSERT_EQ(read_metrics(dirs[0] + "/metrics.jsonl").size(), 8u);
  expect_what_repeats({dirs[0], dirs[2], dirs[3]}, dirs[1], "overlap_update");
}

}  // namespace
}  // namespace trainer
