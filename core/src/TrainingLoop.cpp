// The training loop, top to bottom: set up components, then per optimizer
// step prefetch the micro-batches, count N_t, run forward/backward per
// micro-step with loss_sum / N_t, reduce, clip, update, log.
#include "TrainingLoop.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "Checkpoint.h"
#include "DeviceStats.h"
#include "ExactGradients.h"
#include "Files.h"
#include "LrSchedule.h"
#include "Rendezvous.h"
#include "ReproducibleMode.h"
#include "RunLock.h"
#include "RunOutputs.h"
#include "Sampler.h"
#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/FlatParameters.h"
#include "trainer/Log.h"
#include "trainer/Logger.h"
#include "trainer/Strategy.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
void request_stop(int signal) { g_stop_signal.store(signal); }

// SIGTERM and SIGINT ask the loop to finish the step in flight, write a
// checkpoint and stop; the previous handlers come back afterwards.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = request_stop;
    sigaction(SIGTERM, &action, &old_term_);
    sigaction(SIGINT, &action, &old_int_);
    g_stop_signal.store(0);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }

 private:
  struct sigaction old_term_ {
  }, old_int_{};
};

struct MicroBatch {
  Batch batch;
  int64_t input_tokens = 0;  // non-padding input positions
};

// Pads samples to seq_len and turns target masks into labels (kIgnoreIndex
// where a token does not count). Checks what the dataset returned.
MicroBatch collate(const Dataset& dataset, const std::string& dataset_name, const std::vector<int64_t>& indices,
                   torch::Device device) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t seq = dataset.seq_len();
  const int64_t vocab = dataset.vocab_size();
  torch::Tensor inputs = torch::zeros({rows, seq}, torch::kInt64);
  torch::Tensor labels = torch::full({rows, seq}, kIgnoreIndex, torch::kInt64);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  MicroBatch micro;
  for (int64_t row = 0; row < rows; ++row) {
    const Sample sample = dataset.get(indices[row]);
    const int64_t n = static_cast<int64_t>(sample.tokens.size());
    if (n < 2 || n > seq + 1 || sample.target.size() != sample.tokens.size()) {
      throw InputError(
          fmt::format("dataset '{}' sample {}: {} tokens and {} target flags; expected equal counts "
                      "between 2 and seq_len + 1 = {}",
                      dataset_name, indices[row], n, sample.target.size(), seq + 1));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (sample.tokens[i] < 0 || sample.tokens[i] >= vocab) {
        throw InputError(fmt::format("dataset '{}' sample {}: token {} at position {} is outside [0, vocab_size = {})",
                                     dataset_name, indices[row], sample.tokens[i], i, vocab));
      }
    }
    for (int64_t i = 0; i + 1 < n; ++i) {
      in[row][i] = sample.tokens[i];
      if (sample.target[i + 1]) {
        out[row][i] = sample.tokens[i + 1];
        ++micro.batch.target_tokens;
      }
    }
    micro.input_tokens += n - 1;
  }
  // Pinned host memory lets the copies run asynchronously with the GPU's work.
  const bool pinned = device.is_cuda();
  micro.batch.input_ids = (pinned ? inputs.pin_memory() : inputs).to(device, /*non_blocking=*/pinned);
  micro.batch.labels = (pinned ? labels.pin_memory() : labels).to(device, /*non_blocking=*/pinned);
  return micro;
}

// Loggers see finish() on every exit path, so files are flushed even when
// training fails.
class LoggerSet {
 public:
  explicit LoggerSet(std::vector<std::unique_ptr<Logger>> loggers) : loggers_(std::move(loggers)) {}
  ~LoggerSet() {
    for (auto& logger : loggers_) {
      try {
        logger->finish();
      } catch (const std::exception& error) {
        log::error(fmt::format("logger failed to finish: {}", error.what()));
      }
    }
  }
  void start(const RunInfo& info) {
    for (auto& logger : loggers_) logger->start(info);
  }
  void log(const StepRecord& record) {
    for (auto& logger : loggers_) logger->log(record);
  }

 private:
  std::vector<std::unique_ptr<Logger>> loggers_;
};

torch::Device device_of(const Recipe& recipe, const WorldInfo& world) {
  if (recipe.run.text("device") == "cuda") {
    if (!torch::cuda::is_available()) recipe.run.fail("device", "'cpu': this machine has no CUDA device");
    const int count = static_cast<int>(torch::cuda::device_count());
    if (world.local_rank >= count) {
      recipe.run.fail("device", fmt::format("one CUDA device per local rank: local rank {} but {} device(s)",
                                            world.local_rank, count));
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
  }
  return torch::kCPU;
}

// World size 1 needs no rendezvous; otherwise the backend must suit the
// device (the project's two are checked here; another's connect() says).
std::unique_ptr<Comm> connect_comm(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world,
                                   torch::Device device) {
  check_backend(recipe, registry, world.world_size);
  const std::string backend = recipe.distributed.text("backend");
  if (world.world_size > 1 && (backend == "nccl" || backend == "gloo") && (backend == "nccl") != device.is_cuda()) {
    recipe.distributed.fail("backend", fmt::format("'{}' for run.device = '{}'", device.is_cuda() ? "nccl" : "gloo",
                                                   recipe.run.text("device")));
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(recipe.distributed.real("timeout_s") * 1000));
  return connect_world(registry, backend, world, timeout, device, recipe.resolved_toml());
}

LrSchedule schedule_of(const Recipe& recipe) {
  LrSchedule schedule;
  schedule.shape = recipe.lr_schedule.text("name");
  schedule.peak_lr = recipe.optimizer.real("lr");
  schedule.min_lr = recipe.lr_schedule.real("min_lr");
  schedule.warmup_steps = recipe.lr_schedule.integer("warmup_steps");
  schedule.total_steps = recipe.training.integer("steps");
  return schedule;
}

AdamWConfig adamw_of(const Recipe& recipe) {
  AdamWConfig config;
  config.beta1 = recipe.optimizer.real("beta1");
  config.beta2 = recipe.optimizer.real("beta2");
  config.eps = recipe.optimizer.real("eps");
  config.weight_decay = recipe.optimizer.real("weight_decay");
  return config;
}

}  // namespace

std::string output_dir_of(const Recipe& recipe) {
  const std::string& dir = recipe.run.text("output_dir");
  return dir.empty() ? (fs::path("runs") / recipe.run.text("name")).string() : dir;
}

namespace {

// What a run builds before its first step and keeps until its last.
struct RunParts {
  Context context;
  torch::Device device = torch::kCPU;
  bool writer = false;  // only rank 0 writes files and metrics
  torch::Dtype compute_dtype = torch::kFloat32;
  std::unique_ptr<Comm> comm;
  std::unique_ptr<Model> model;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<Strategy> strategy;
  std::string dataset_name, model_name, strategy_name;
  int64_t parameter_count = 0;
  BatchShape shape;
  // Reproducible mode only; declared last, so the hooks go before the model.
  int64_t atom = 1;              // samples per forward and backward
  bool gradient_probed = false;  // install_gradient's check for copies ran
  std::unique_ptr<ReproducibleSettings> reproducible;
  std::unique_ptr<ExactGradients> exact;
};

// Set-up: the output directory (locked by rank 0), the process group, the
// components, and the strategy's hold on the model, checked.
RunParts set_up(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world, std::optional<RunLock>& lock) {
  RunParts run;
  Context& context = run.context;
  context.output_dir = output_dir_of(recipe);
  context.device = recipe.run.text("device");
  context.seed = static_cast<uint64_t>(recipe.run.integer("seed"));
  context.rank = world.rank;
  context.world_size = world.world_size;
  context.local_rank = world.local_rank;
  log::set_rank(world.rank, world.world_size);
  // Local ranks share the machine's cores instead of each taking all of them.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(1, cores / std::max(1, world.local_world_size)));
  if (recipe.training.boolean("reproducible")) run.reproducible = std::make_unique<ReproducibleSettings>();
  run.device = device_of(recipe, world);
  run.writer = world.rank == 0;
  if (run.writer) {
    fs::create_directories(context.output_dir);
    lock.emplace(context.output_dir);
    write_file_atomically(fs::path(context.output_dir) / "recipe.toml", recipe.resolved_toml());
  }
  run.comm = connect_comm(recipe, registry, world, run.device);

  run.model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  run.dataset = PluginRegistry::create<Dataset>(*recipe.dataset.plugin, recipe.dataset.options, context);
  run.strategy = PluginRegistry::create<Strategy>(*recipe.strategy.plugin, recipe.strategy.options, context);
  run.dataset_name = recipe.dataset.plugin->descriptor->name;
  run.model_name = recipe.model.plugin->descriptor->name;
  run.strategy_name = recipe.strategy.plugin->descriptor->name;
  if (run.dataset->vocab_size() > run.model->vocab_size()) {
    recipe.model.options.fail("vocab_size", fmt::format("at least the dataset's vocabulary size {}, got {}",
                                                        run.dataset->vocab_size(), run.model->vocab_size()));
  }
  for (const NamedParameter& p : run.model->parameters()) run.parameter_count += p.tensor.numel();

  run.compute_dtype = recipe.training.text("precision") == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  run.strategy->setup(*run.model, *run.comm, StrategyEnv{run.device, adamw_of(recipe), run.compute_dtype});
  check_state_coverage(*run.strategy, *run.model, *run.comm, run.device, recipe.strategy.plugin->descriptor->name);

  const MemoryReport memory = run.strategy->memory();
  log::info(fmt::format("rank {} holds {} parameter, {} gradient and {} optimizer-state bytes", world.rank,
                        memory.parameter_bytes, memory.gradient_bytes, memory.optimizer_bytes));
  run.shape = batch_shape(recipe, run.comm->world_size());
  // After the strategy's setup: its hooks and bound buffers are in place, and
  // these hooks only read the gradients passing through.
  if (run.reproducible) {
    run.atom = recipe.training.integer("reproducible_atom");
    run.exact = std::make_unique<ExactGradients>(*run.model, run.shape.global_batch_size() / run.atom, run.device);
  }
  return run;
}

// What the loop fixes once: the run's description for loggers and the log.
RunInfo describe_run(const Recipe& recipe, const RunParts& run) {
  RunInfo info;
  info.name = recipe.run.text("name");
  info.total_steps = recipe.training.integer("steps");
  info.global_batch_size = run.shape.global_batch_size();
  info.micro_batch_size = run.shape.micro_batch_size;
  info.grad_accum_steps = run.shape.grad_accum_steps;
  info.world_size = run.shape.world_size;
  info.strategy = recipe.strategy.plugin->descriptor->name;
  info.parameters = run.parameter_count;
  info.flops_per_token = run.model->flops_per_token(run.dataset->seq_len());
  info.peak_flops = recipe.run.real("peak_tflops") * 1e12;
  if (info.peak_flops == 0.0 && run.device.is_cuda()) {
    info.peak_flops = measure_matmul_flops(run.device, run.compute_dtype);
    log::info(
        fmt::format("measured {} matmul rate: {:.0f} TFLOP/s per rank (MFU is relative to it; "
                    "run.peak_tflops sets it instead)",
                    run.compute_dtype == torch::kBFloat16 ? "bf16" : "fp32", info.peak_flops / 1e12));
  }
  return info;
}

// How the loop updates.
struct UpdateRule {
  LrSchedule schedule;
  double max_grad_norm = 0.0;
  bool skip_nonfinite = false;
};

// This rank's part of the window: the split's micro-batches, or in
// reproducible mode one micro-batch per atom (run.atom consecutive samples
// of the global batch, starting at a multiple of the atom), so that each
// atom's forward and backward has the same inputs and shapes, and so the
// same bits, whichever micro-batch or rank it lands in.
std::vector<MicroBatch> collate_window(RunParts& run, const std::vector<int64_t>& global) {
  std::vector<MicroBatch> window;
  for (int64_t m = 0; m < run.shape.grad_accum_steps; ++m) {
    const std::vector<int64_t> indices = local_micro_batch(global, run.shape, run.comm->rank(), m);
    if (!run.exact) {
      window.push_back(collate(*run.dataset, run.dataset_name, indices, run.device));
      continue;
    }
    for (size_t first = 0; first < indices.size(); first += static_cast<size_t>(run.atom)) {
      const std::vector<int64_t> atom(indices.begin() + first, indices.begin() + first + run.atom);
      window.push_back(collate(*run.dataset, run.dataset_name, atom, run.device));
    }
  }
  return window;
}

LossSum checked_forward(RunParts& run, const MicroBatch& micro) {
  LossSum out = run.strategy->forward(*run.model, micro.batch);
  if (out.target_tokens != micro.batch.target_tokens) {
    throw TrainingError(fmt::format("model '{}' counted {} target tokens in a micro-batch that has {}", run.model_name,
                                    out.target_tokens, micro.batch.target_tokens));
  }
  return out;
}

// Reproducible mode's forward, backward and reduction: every atom's
// gradient summed exactly (ExactGradients) and written over the strategy's
// own sum; the norm and the loss computed the same way whatever the split.
// A pass whose gradients left the fixed-point scales' range runs again with
// scales that fit them (the first step's always does: no scale is known yet).
void reproducible_reduction(RunParts& run, const std::vector<MicroBatch>& atoms, int64_t target_tokens,
                            StepRecord& record) {
  Strategy& strategy = *run.strategy;
  Comm& comm = *run.comm;
  ExactGradients& exact = *run.exact;
  const int64_t count = static_cast<int64_t>(atoms.size());
  const int64_t first = comm.rank() * count;  // rank r trains the global atoms [r count, (r + 1) count)
  torch::Tensor losses = torch::zeros({run.shape.global_batch_size() / run.atom},
                                      torch::TensorOptions().dtype(torch::kFloat64).device(run.device));
  const int passes = run_exact_passes(exact, strategy, comm, count, [&](int64_t k) {
    const LossSum out = checked_forward(run, atoms[k]);
    losses.narrow(0, first + k, 1).copy_(out.loss_sum.detach().reshape({1}));
    strategy.backward(out.loss_sum / static_cast<double>(target_tokens),
                      MicroStep{k, k == count - 1, count, target_tokens});
  });
  if (passes > 1) {
    log::info(
        fmt::format("step {}: gradient scales set from this step's gradients; its samples ran again", record.step));
  }
  record.loss = ordered_loss_sum(losses, comm) / static_cast<double>(target_tokens);
  if (exact.nonfinite()) {
    record.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  const std::vector<torch::Tensor> gradient = exact.reduce(comm);
  install_gradient(strategy, gradient, run.strategy_name, /*probe=*/!run.gradient_probed);
  run.gradient_probed = true;
  record.grad_norm = whole_norm(gradient);
}

// One optimizer step: the whole accumulation window is collated first, so
// N_t is known before the first backward (contract, point 2); then forward
// and backward per micro-batch, the reduction, and the update (or a skip).
// Fills the record's loss, norm, counts and data time.
StepRecord optimizer_step(RunParts& run, GlobalBatchSampler& sampler, const UpdateRule& rule, int64_t step,
                          int64_t& applied_updates) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const BatchShape& shape = run.shape;
  Comm& comm = *run.comm;
  const std::vector<MicroBatch> micro_batches =
      collate_window(run, sampler.global_batch(step, shape.global_batch_size()));
  StepRecord record;
  record.data_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t local_counts[2] = {0, 0};
  for (const MicroBatch& micro : micro_batches) {
    local_counts[0] += micro.batch.target_tokens;
    local_counts[1] += micro.input_tokens;
  }
  // Counted on the host; only several ranks need a collective (and a sync).
  if (comm.world_size() > 1) {
    torch::Tensor counts = torch::tensor({local_counts[0], local_counts[1]}, torch::kInt64).to(run.device);
    comm.all_reduce_sum(counts);
    local_counts[0] = counts[0].item<int64_t>();
    local_counts[1] = counts[1].item<int64_t>();
  }
  const int64_t target_tokens = local_counts[0];

  record.step = step + 1;
  record.lr = rule.schedule.at(step);
  record.target_tokens = target_tokens;
  record.samples = shape.global_batch_size();
  record.input_tokens = local_counts[1];
  if (target_tokens == 0) {  // contract, point 7: skip, never divide by zero
    log::warn(fmt::format("step {}: the global batch has no target tokens; update skipped", step + 1));
    record.skipped = true;
    return record;
  }
  Strategy& strategy = *run.strategy;
  if (run.exact) {
    reproducible_reduction(run, micro_batches, target_tokens, record);
  } else {
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(run.device));
    for (int64_t m = 0; m < shape.grad_accum_steps; ++m) {
      const LossSum out = checked_forward(run, micro_batches[m]);
      loss_sum += out.loss_sum.detach().to(torch::kFloat64);
      // Contract, point 3: divide by N_t once; nothing else scales.
      strategy.backward(out.loss_sum / static_cast<double>(target_tokens),
                        MicroStep{m, m == shape.grad_accum_steps - 1, shape.grad_accum_steps, target_tokens});
    }
    // The loss's all-reduce runs behind the strategy's reduction and is waited for after it.
    const std::unique_ptr<CommWork> loss_reduction = comm.all_reduce_sum_async(loss_sum);
    record.grad_norm = strategy.reduce_gradients_and_norm();
    loss_reduction->wait();
    record.loss = loss_sum.item<double>() / static_cast<double>(target_tokens);
  }
  if (!std::isfinite(record.grad_norm) || !std::isfinite(record.loss)) {
    const std::string what =
        fmt::format("step {}: non-finite loss {} or gradient norm {}", step + 1, record.loss, record.grad_norm);
    if (!rule.skip_nonfinite) throw TrainingError(what + " (set training.on_nonfinite = 'skip' to skip such steps)");
    log::warn(what + "; update skipped");
    strategy.discard_gradients();
    record.skipped = true;
  } else {
    ++applied_updates;
    strategy.apply_update(
        UpdateArgs{record.lr, clip_coefficient(record.grad_norm, rule.max_grad_norm), applied_updates});
  }
  return record;
}

// Every rank stops at the same step: the signal may reach them apart.
// Reading the flag waits for the step's last kernel (the update), so a
// step's time ends with the device's work, not only the host's launches.
bool agree_to_stop(RunParts& run) {
  torch::Tensor stop = torch::tensor({static_cast<int64_t>(g_stop_signal.load())}, torch::kInt64).to(run.device);
  if (run.comm->world_size() > 1) run.comm->all_reduce_sum(stop);
  return stop.item<int64_t>() != 0;
}

}  // namespace

void train(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world) {
  std::optional<RunLock> lock;  // held until train() returns
  RunParts run = set_up(recipe, registry, world, lock);
  const Context& context = run.context;
  const int64_t steps = recipe.training.integer("steps");
  const UpdateRule rule{schedule_of(recipe), recipe.training.real("max_grad_norm"),
                        recipe.training.text("on_nonfinite") == "skip"};
  GlobalBatchSampler sampler(context.seed, run.dataset->size(), run.dataset->shuffle());

  std::vector<std::unique_ptr<Logger>> logger_list;
  for (const ComponentChoice& choice : recipe.loggers) {
    if (!run.writer) break;
    logger_list.push_back(PluginRegistry::create<Logger>(*choice.plugin, choice.options, context));
  }
  LoggerSet loggers(std::move(logger_list));
  RunInfo info = describe_run(recipe, run);

  // Checkpoints, and where this run starts.
  const std::string checkpoint_root = recipe.checkpoint.text("dir").empty()
                                          ? (fs::path(context.output_dir) / "checkpoints").string()
                                          : recipe.checkpoint.text("dir");
  if (fs::exists(checkpoint_root) && !fs::is_directory(checkpoint_root)) {
    recipe.checkpoint.fail("dir", fmt::format("a directory for checkpoints; {} is a file", checkpoint_root));
  }
  Checkpointer checkpointer(checkpoint_root, recipe.checkpoint.integer("keep"),
                            recipe.fingerprint(info.global_batch_size), info.strategy);
  const int64_t interval = recipe.checkpoint.integer("interval");
  TrainingPosition position;
  const std::string resume = recipe.checkpoint.text("resume");
  const std::string from = checkpointer.resolve(resume);
  if (!from.empty()) {
    position = checkpointer.load(from, *run.strategy, *run.model, *run.comm);
    if (run.exact && !position.gradient_exponents.empty()) run.exact->set_exponents(position.gradient_exponents);
  } else if (resume == "auto") {
    log::info(fmt::format("no checkpoint under {}; starting at step 0", checkpoint_root));
  }
  info.first_step = position.step;
  StopSignals stop_signals;
  loggers.start(info);
  log::info(
      fmt::format("training {} parameters for {} steps: global batch {} = micro-batch {} x {} accumulation "
                  "steps x {} ranks, strategy {}, output {}",
                  info.parameters, steps, info.global_batch_size, info.micro_batch_size, info.grad_accum_steps,
                  info.world_size, info.strategy, context.output_dir));

  const int64_t profile_start = recipe.run.integer("profile_start");
  if (profile_start > steps) {
    recipe.run.fail("profile_start", fmt::format("a step of this run, 1..{} (training.steps), or 0 for off", steps));
  }
  if (profile_start > 0) {
    const std::string missing = profiler_unavailable();
    if (!missing.empty()) recipe.run.fail("profile_start", missing);
  }
  StepProfiler profiler(profile_start, std::min(recipe.run.integer("profile_steps"), steps - profile_start + 1),
                        (fs::path(context.output_dir) / "profile" / "trace.json").string(), run.device);

  // The steps: update, agree on stopping, record, checkpoint.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point run_start = Clock::now();
  int64_t applied_updates = position.applied_updates;  // Adam's step count: once per applied optimizer step
  for (int64_t step = position.step; step < steps; ++step) {
    profiler.step_begins(step + 1);
    const Clock::time_point step_start = Clock::now();
    reset_memory_peaks(run.device);
    StepRecord record = optimizer_step(run, sampler, rule, step, applied_updates);
    const bool stopping = agree_to_stop(run);
    const Clock::time_point step_end = Clock::now();
    profiler.step_ended(step + 1);
    record.step_seconds = std::chrono::duration<double>(step_end - step_start).count();
    record.elapsed_seconds = std::chrono::duration<double>(step_end - run_start).count();
    record.tokens_per_second = record.step_seconds > 0 ? record.input_tokens / record.step_seconds : 0.0;
    record.mfu = info.flops_per_token > 0 && info.peak_flops > 0
                     ? info.flops_per_token * record.tokens_per_second / (info.peak_flops * run.comm->world_size())
                     : std::numeric_limits<double>::quiet_NaN();
    const MemoryPeaks peaks = memory_peaks(run.device);
    record.memory_allocated_bytes = peaks.allocated_bytes;
    record.memory_reserved_bytes = peaks.reserved_bytes;
    record.rss_bytes = peaks.rss_bytes;
    loggers.log(record);

    if ((interval > 0 && (step + 1) % interval == 0) || stopping) {
      const TrainingPosition here{step + 1, applied_updates,
                                  run.exact ? run.exact->exponents() : std::vector<int64_t>{}};
      const std::string dir = checkpointer.save(*run.strategy, *run.model, *run.comm, here);
      log::info(fmt::format("checkpoint {} written", dir));
    }
    if (stopping) {
      throw Preempted(
          fmt::format("stopped by a signal after step {}; the checkpoint resumes with "
                      "--set checkpoint.resume=auto",
                      step + 1));
    }
  }
  const fs::path out(context.output_dir);
  write_memory_report(*run.strategy, *run.comm, run.device, out / "memory.json", run.writer);
  const std::vector<torch::Tensor> weights =
      consolidated_parameters(*run.model, *run.strategy, *run.comm, run.device, run.writer);
  write_summary(*run.strategy, *run.comm, run.device, out / "summary.json", run.writer, steps, applied_updates,
                weights);
  write_final_weights(*run.model, weights, context.output_dir, run.writer);
}

}  // namespace trainer
