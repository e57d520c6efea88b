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

#include <fmt/format.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include "Checkpoint.h"
#include "DeviceStats.h"
#include "Files.h"
#include "LrSchedule.h"
#include "RunLock.h"
#include "RunOutputs.h"
#include "Rendezvous.h"
#include "Sampler.h"
#include "trainer/Dataset.h"
#include "trainer/FlatParameters.h"
#include "trainer/Errors.h"
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
  struct sigaction old_term_ {}, old_int_ {};
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
      throw InputError(fmt::format("dataset '{}' sample {}: {} tokens and {} target flags; expected equal counts "
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

void train(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world) {
  Context context;
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
  const torch::Device device = device_of(recipe, world);
  const bool writer = world.rank == 0;  // only rank 0 writes files and metrics
  std::optional<RunLock> lock;           // held until train() returns
  if (writer) {
    fs::create_directories(context.output_dir);
    lock.emplace(context.output_dir);
    write_file_atomically(fs::path(context.output_dir) / "recipe.toml", recipe.resolved_toml());
  }
  std::unique_ptr<Comm> comm = connect_comm(recipe, registry, world, device);

  auto model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  auto dataset = PluginRegistry::create<Dataset>(*recipe.dataset.plugin, recipe.dataset.options, context);
  auto strategy = PluginRegistry::create<Strategy>(*recipe.strategy.plugin, recipe.strategy.options, context);
  const std::string dataset_name = recipe.dataset.plugin->descriptor->name;
  if (dataset->vocab_size() > model->vocab_size()) {
    recipe.model.options.fail("vocab_size", fmt::format("at least the dataset's vocabulary size {}, got {}",
                                                        dataset->vocab_size(), model->vocab_size()));
  }
  int64_t parameter_count = 0;
  for (const NamedParameter& p : model->parameters()) parameter_count += p.tensor.numel();

  const torch::Dtype compute_dtype = recipe.training.text("precision") == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  strategy->setup(*model, *comm, StrategyEnv{device, adamw_of(recipe), compute_dtype});
  check_state_coverage(*strategy, *model, *comm, device, recipe.strategy.plugin->descriptor->name);

  const MemoryReport memory = strategy->memory();
  log::info(fmt::format("rank {} holds {} parameter, {} gradient and {} optimizer-state bytes", world.rank,
                        memory.parameter_bytes, memory.gradient_bytes, memory.optimizer_bytes));
  const BatchShape shape = batch_shape(recipe, comm->world_size());
  const int64_t global_batch_size = shape.global_batch_size();
  const int64_t steps = recipe.training.integer("steps");
  const double max_grad_norm = recipe.training.real("max_grad_norm");
  const bool skip_nonfinite = recipe.training.text("on_nonfinite") == "skip";
  const LrSchedule schedule = schedule_of(recipe);
  GlobalBatchSampler sampler(context.seed, dataset->size(), dataset->shuffle());

  std::vector<std::unique_ptr<Logger>> logger_list;
  for (const ComponentChoice& choice : recipe.loggers) {
    if (!writer) break;
    logger_list.push_back(PluginRegistry::create<Logger>(*choice.plugin, choice.options, context));
  }
  LoggerSet loggers(std::move(logger_list));
  RunInfo info;
  info.name = recipe.run.text("name");
  info.total_steps = steps;
  info.global_batch_size = global_batch_size;
  info.micro_batch_size = shape.micro_batch_size;
  info.grad_accum_steps = shape.grad_accum_steps;
  info.world_size = shape.world_size;
  info.strategy = recipe.strategy.plugin->descriptor->name;
  info.parameters = parameter_count;
  info.flops_per_token = model->flops_per_token(dataset->seq_len());
  info.peak_flops = recipe.run.real("peak_tflops") * 1e12;
  if (info.peak_flops == 0.0 && device.is_cuda()) {
    info.peak_flops = measure_matmul_flops(device, compute_dtype);
    log::info(fmt::format("measured {} matmul rate: {:.0f} TFLOP/s per rank (MFU is relative to it; "
                          "run.peak_tflops sets it instead)",
                          compute_dtype == torch::kBFloat16 ? "bf16" : "fp32", info.peak_flops / 1e12));
  }
  const std::string checkpoint_root = recipe.checkpoint.text("dir").empty()
                                          ? (fs::path(context.output_dir) / "checkpoints").string()
                                          : recipe.checkpoint.text("dir");
  if (fs::exists(checkpoint_root) && !fs::is_directory(checkpoint_root)) {
    recipe.checkpoint.fail("dir", fmt::format("a directory for checkpoints; {} is a file", checkpoint_root));
  }
  Checkpointer checkpointer(checkpoint_root, recipe.checkpoint.integer("keep"), recipe.fingerprint(global_batch_size),
                            info.strategy);
  const int64_t interval = recipe.checkpoint.integer("interval");
  TrainingPosition position;
  const std::string resume = recipe.checkpoint.text("resume");
  const std::string from = checkpointer.resolve(resume);
  if (!from.empty()) {
    position = checkpointer.load(from, *strategy, *model, *comm);
  } else if (resume == "auto") {
    log::info(fmt::format("no checkpoint under {}; starting at step 0", checkpoint_root));
  }
  info.first_step = position.step;
  StopSignals stop_signals;
  loggers.start(info);
  log::info(fmt::format("training {} parameters for {} steps: global batch {} = micro-batch {} x {} accumulation "
                        "steps x {} ranks, strategy {}, output {}",
                        parameter_count, steps, global_batch_size, shape.micro_batch_size, shape.grad_accum_steps,
                        shape.world_size, info.strategy, context.output_dir));

  const int64_t profile_start = recipe.run.integer("profile_start");
  if (profile_start > steps) {
    recipe.run.fail("profile_start", fmt::format("a step of this run, 1..{} (training.steps), or 0 for off", steps));
  }
  if (profile_start > 0) {
    const std::string missing = profiler_unavailable();
    if (!missing.empty()) recipe.run.fail("profile_start", missing);
  }
  StepProfiler profiler(profile_start, std::min(recipe.run.integer("profile_steps"), steps - profile_start + 1),
                        (fs::path(context.output_dir) / "profile" / "trace.json").string(), device);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point run_start = Clock::now();
  int64_t applied_updates = position.applied_updates;  // Adam's step count: once per applied optimizer step
  for (int64_t step = position.step; step < steps; ++step) {
    profiler.step_begins(step + 1);
    const Clock::time_point step_start = Clock::now();
    reset_memory_peaks(device);
    // Prefetch the whole accumulation window so N_t is known before the
    // first backward (contract, point 2).
    const std::vector<int64_t> global = sampler.global_batch(step, global_batch_size);
    std::vector<MicroBatch> micro_batches;
    for (int64_t m = 0; m < shape.grad_accum_steps; ++m) {
      micro_batches.push_back(collate(*dataset, dataset_name, local_micro_batch(global, shape, comm->rank(), m), device));
    }
    const double data_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    int64_t local_counts[2] = {0, 0};
    for (const MicroBatch& micro : micro_batches) {
      local_counts[0] += micro.batch.target_tokens;
      local_counts[1] += micro.input_tokens;
    }
    // Counted on the host; only several ranks need a collective (and a sync).
    if (comm->world_size() > 1) {
      torch::Tensor counts = torch::tensor({local_counts[0], local_counts[1]}, torch::kInt64).to(device);
      comm->all_reduce_sum(counts);
      local_counts[0] = counts[0].item<int64_t>();
      local_counts[1] = counts[1].item<int64_t>();
    }
    const int64_t target_tokens = local_counts[0];

    StepRecord record;
    record.step = step + 1;
    record.lr = schedule.at(step);
    record.target_tokens = target_tokens;
    record.samples = global_batch_size;
    record.input_tokens = local_counts[1];
    if (target_tokens == 0) {  // contract, point 7: skip, never divide by zero
      log::warn(fmt::format("step {}: the global batch has no target tokens; update skipped", step + 1));
      record.skipped = true;
    } else {
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
      for (int64_t m = 0; m < shape.grad_accum_steps; ++m) {
        const LossSum out = strategy->forward(*model, micro_batches[m].batch);
        if (out.target_tokens != micro_batches[m].batch.target_tokens) {
          throw TrainingError(fmt::format("model '{}' counted {} target tokens in a micro-batch that has {}",
                                          recipe.model.plugin->descriptor->name, out.target_tokens,
                                          micro_batches[m].batch.target_tokens));
        }
        loss_sum += out.loss_sum.detach().to(torch::kFloat64);
        // Contract, point 3: divide by N_t once; nothing else scales.
        strategy->backward(out.loss_sum / static_cast<double>(target_tokens),
                           MicroStep{m, m == shape.grad_accum_steps - 1, shape.grad_accum_steps, target_tokens});
      }
      comm->all_reduce_sum(loss_sum);
      record.loss = loss_sum.item<double>() / static_cast<double>(target_tokens);
      record.grad_norm = strategy->reduce_gradients_and_norm();
      if (!std::isfinite(record.grad_norm) || !std::isfinite(record.loss)) {
        const std::string what = fmt::format("step {}: non-finite loss {} or gradient norm {}", step + 1,
                                             record.loss, record.grad_norm);
        if (!skip_nonfinite) throw TrainingError(what + " (set training.on_nonfinite = 'skip' to skip such steps)");
        log::warn(what + "; update skipped");
        strategy->discard_gradients();
        record.skipped = true;
      } else {
        ++applied_updates;
        strategy->apply_update(UpdateArgs{record.lr, clip_coefficient(record.grad_norm, max_grad_norm), applied_updates});
      }
    }
    // Every rank stops at the same step: the signal may reach them apart.
    // Reading the flag waits for the step's last kernel (the update), so the
    // step's time below is the device's, not only the host's launches.
    torch::Tensor stop = torch::tensor({static_cast<int64_t>(g_stop_signal.load())}, torch::kInt64).to(device);
    if (comm->world_size() > 1) comm->all_reduce_sum(stop);
    const bool stopping = stop.item<int64_t>() != 0;
    const Clock::time_point step_end = Clock::now();
    profiler.step_ended(step + 1);
    record.step_seconds = std::chrono::duration<double>(step_end - step_start).count();
    record.elapsed_seconds = std::chrono::duration<double>(step_end - run_start).count();
    record.data_seconds = data_seconds;
    record.tokens_per_second = record.step_seconds > 0 ? record.input_tokens / record.step_seconds : 0.0;
    record.mfu = info.flops_per_token > 0 && info.peak_flops > 0
                     ? info.flops_per_token * record.tokens_per_second / (info.peak_flops * comm->world_size())
                     : std::numeric_limits<double>::quiet_NaN();
    const MemoryPeaks peaks = memory_peaks(device);
    record.memory_allocated_bytes = peaks.allocated_bytes;
    record.memory_reserved_bytes = peaks.reserved_bytes;
    record.rss_bytes = peaks.rss_bytes;
    loggers.log(record);

    if ((interval > 0 && (step + 1) % interval == 0) || stopping) {
      const std::string dir = checkpointer.save(*strategy, *model, *comm, TrainingPosition{step + 1, applied_updates});
      log::info(fmt::format("checkpoint {} written", dir));
    }
    if (stopping) {
      throw Preempted(fmt::format("stopped by a signal after step {}; the checkpoint resumes with "
                                  "--set checkpoint.resume=auto",
                                  step + 1));
    }
  }
  write_memory_report(*strategy, *comm, device, fs::path(context.output_dir) / "memory.json", writer);
  write_summary(*strategy, *comm, device, fs::path(context.output_dir) / "summary.json", writer, steps, applied_updates);
  write_final_weights(*model, *strategy, *comm, device, context.output_dir, writer);
}

}  // namespace trainer
