// The training loop, top to bottom: set up (SetUp.h), then per optimizer
// step prefetch the micro-batches, count N_t, run forward/backward per
// micro-step with loss_sum / N_t, reduce, clip, update, log, checkpoint.
#include "run/TrainingLoop.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "checkpoint/Checkpoint.h"
#include "distributed/Rendezvous.h"
#include "ops/Dispatch.h"
#include "reproducible/ExactGradients.h"
#include "reproducible/ReproducibleMode.h"
#include "run/Collate.h"
#include "run/DeviceStats.h"
#include "run/RunConfig.h"
#include "run/RunOutputs.h"
#include "run/Sampler.h"
#include "run/SetUp.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/Logger.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/AdamW.h"
#include "util/FaultInjection.h"
#include "util/Files.h"
#include "util/OutputClaims.h"

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
    action.sa_flags = SA_RESTART;  // a write or read in flight resumes; the loop reads the flag
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

// This rank's part of the window: the split's micro-batches, or in
// reproducible mode one micro-batch per atom (run.config->reproducible_atom consecutive samples
// of the global batch, starting at a multiple of the atom), so that each
// atom's forward and backward has the same inputs and shapes, and so the
// same bits, whichever micro-batch or rank it lands in.
std::vector<MicroBatch> collate_window(RunParts& run, const std::vector<int64_t>& global) {
  std::vector<MicroBatch> window;
  for (int64_t m = 0; m < run.config->shape.grad_accum_steps; ++m) {
    const std::vector<int64_t> indices = local_micro_batch(global, run.config->shape, run.comm->rank(), m);
    if (!run.exact) {
      window.push_back(collate(*run.dataset, run.dataset_name, indices, run.device));
      continue;
    }
    for (size_t first = 0; first < indices.size(); first += static_cast<size_t>(run.config->reproducible_atom)) {
      const std::vector<int64_t> atom(indices.begin() + first, indices.begin() + first + run.config->reproducible_atom);
      window.push_back(collate(*run.dataset, run.dataset_name, atom, run.device));
    }
  }
  return window;
}

LossSum checked_forward(RunParts& run, const Batch& batch) {
  LossSum out = run.strategy->forward(*run.model, batch);
  if (out.target_tokens != batch.target_tokens) {
    throw TrainingError(fmt::format("model '{}' counted {} target tokens in a micro-batch that has {}", run.model_name,
                                    out.target_tokens, batch.target_tokens));
  }
  return out;
}

// What one optimizer step computed; step_record() adds its timing and the
// machine's figures for the loggers.
struct StepOutcome {
  int64_t step = 0;  // 1-based
  double loss = 0.0;
  double grad_norm = 0.0;
  double lr = 0.0;
  int64_t target_tokens = 0;
  int64_t samples = 0;
  int64_t input_tokens = 0;
  int64_t documents = 0;
  int64_t attended_pairs = 0;
  bool skipped = false;
  double data_seconds = 0.0;
};

// Reproducible mode's forward, backward and reduction: every atom's
// gradient summed exactly (ExactGradients) and written into the gradient
// the strategy holds (set up with exact_gradients, it sums nothing itself);
// the norm and the loss computed the same way whatever the split.
// A pass whose gradients left the fixed-point scales' range runs again with
// scales that fit them (the first step's always does: no scale is known yet).
void reproducible_reduction(RunParts& run, const std::vector<MicroBatch>& atoms, int64_t target_tokens,
                            StepOutcome& outcome) {
  Strategy& strategy = *run.strategy;
  Comm& comm = *run.comm;
  ExactGradients& exact = *run.exact;
  const int64_t count = static_cast<int64_t>(atoms.size());
  const int64_t first = comm.rank() * count;  // rank r trains the global atoms [r count, (r + 1) count)
  torch::Tensor losses = torch::zeros({run.config->shape.global_batch_size() / run.config->reproducible_atom},
                                      torch::TensorOptions().dtype(torch::kFloat64).device(run.device));
  ForwardBackwardRunner& runner = *run.passes;
  runner.begin_step(target_tokens);
  const int passes = run_exact_passes(exact, strategy, comm, count, [&](int64_t k) {
    // With training.cuda_graphs this may run once per atom shape and be replayed for the others.
    const torch::Tensor loss = runner.run(atoms[k].batch, &exact, [&](const Batch& batch) {
      const LossSum out = checked_forward(run, batch);
      strategy.backward(runner.scaled(out.loss_sum), MicroStep{k, k == count - 1, count, target_tokens});
      return out.loss_sum.detach().reshape({1});
    });
    losses.narrow(0, first + k, 1).copy_(loss);
  });
  if (passes > 1) {
    log::info(
        fmt::format("step {}: gradient scales set from this step's gradients; its samples ran again", outcome.step));
  }
  outcome.loss = ordered_loss_sum(losses, comm) / static_cast<double>(target_tokens);
  if (exact.nonfinite()) {
    outcome.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  const std::vector<torch::Tensor> gradient = exact.reduce(comm);
  install_gradient(strategy, gradient, run.strategy_name);
  // From the whole groups every rank holds: no sum over ranks, so every
  // rank and split gets the same bits.
  outcome.grad_norm = total_norm(gradient);
}

// One optimizer step: the whole accumulation window is collated first, so
// N_t is known before the first backward (contract, point 2); then forward
// and backward per micro-batch, the reduction, and the update (or a skip).
StepOutcome optimizer_step(RunParts& run, GlobalBatchSampler& sampler, const UpdateRule& rule, int64_t step,
                           int64_t& applied_updates) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const BatchShape& shape = run.config->shape;
  Comm& comm = *run.comm;
  const std::vector<MicroBatch> micro_batches =
      collate_window(run, sampler.global_batch(step, shape.global_batch_size()));
  StepOutcome outcome;
  outcome.data_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int64_t local_counts[4] = {0, 0, 0, 0};
  for (const MicroBatch& micro : micro_batches) {
    local_counts[0] += micro.batch.target_tokens;
    local_counts[1] += micro.input_tokens;
    local_counts[2] += micro.documents;
    local_counts[3] += micro.attended_pairs;
  }
  // Counted on the host; only several ranks need a collective (and a sync).
  if (comm.world_size() > 1) {
    torch::Tensor counts =
        torch::tensor({local_counts[0], local_counts[1], local_counts[2], local_counts[3]}, torch::kInt64)
            .to(run.device);
    comm.all_reduce_sum(counts);
    const torch::Tensor summed = counts.cpu();
    for (int i = 0; i < 4; ++i) local_counts[i] = summed[i].item<int64_t>();
  }
  const int64_t target_tokens = local_counts[0];

  outcome.step = step + 1;
  outcome.lr = rule.schedule.at(step);
  outcome.target_tokens = target_tokens;
  outcome.samples = shape.global_batch_size();
  outcome.input_tokens = local_counts[1];
  outcome.documents = local_counts[2];
  outcome.attended_pairs = local_counts[3];
  if (target_tokens == 0) {  // contract, point 7: skip, never divide by zero
    log::warn(fmt::format("step {}: the global batch has no target tokens; update skipped", step + 1));
    outcome.skipped = true;
    return outcome;
  }
  Strategy& strategy = *run.strategy;
  if (run.exact) {
    reproducible_reduction(run, micro_batches, target_tokens, outcome);
  } else {
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(run.device));
    // With training.cuda_graphs the micro-steps the strategy calls
    // replayable run from a CUDA graph (ForwardBackwardRunner), 1 / N_t read from the
    // device: the same bits as dividing by N_t here.
    ForwardBackwardRunner* runner = run.passes.get();
    if (runner != nullptr) runner->begin_step(target_tokens);
    // FP8: the weights' casts made by the first micro-step, reused by the
    // others and released before the update writes the weights.
    std::optional<ops::Fp8WeightReuse> reuse;
    if (run.reuse_fp8_weight_casts) {
      reuse.emplace(run.reuse_keeps_both_casts ? ops::Fp8WeightReuse::Keep::both
                                               : ops::Fp8WeightReuse::Keep::transposed);
    }
    for (int64_t m = 0; m < shape.grad_accum_steps; ++m) {
      const MicroStep micro{m, m == shape.grad_accum_steps - 1, shape.grad_accum_steps, target_tokens};
      // Contract, point 3: divide by N_t once; nothing else scales.
      const auto micro_step = [&](const Batch& batch) {
        const LossSum out = checked_forward(run, batch);
        strategy.backward(
            runner != nullptr ? runner->scaled(out.loss_sum) : out.loss_sum / static_cast<double>(target_tokens),
            micro);
        return out.loss_sum.detach();
      };
      const torch::Tensor loss = runner != nullptr && strategy.replayable_micro_step(micro)
                                     ? runner->run(micro_batches[m].batch, nullptr, micro_step)
                                     : micro_step(micro_batches[m].batch);
      loss_sum += loss.to(torch::kFloat64);
    }
    reuse.reset();
    // The loss's all-reduce runs behind the strategy's reduction and is waited for after it.
    const std::unique_ptr<CommWork> loss_reduction = comm.all_reduce_sum_async(loss_sum);
    outcome.grad_norm = strategy.reduce_gradients_and_norm();
    loss_reduction->wait();
    outcome.loss = loss_sum.item<double>() / static_cast<double>(target_tokens);
  }
  if (!std::isfinite(outcome.grad_norm) || !std::isfinite(outcome.loss)) {
    const std::string what =
        fmt::format("step {}: non-finite loss {} or gradient norm {}", step + 1, outcome.loss, outcome.grad_norm);
    if (!rule.skip_nonfinite) throw TrainingError(what + " (set training.on_nonfinite = 'skip' to skip such steps)");
    log::warn(what + "; update skipped");
    strategy.discard_gradients();
    outcome.skipped = true;
  } else {
    ++applied_updates;
    strategy.apply_update(
        UpdateArgs{outcome.lr, clip_coefficient(outcome.grad_norm, rule.max_grad_norm), applied_updates});
  }
  return outcome;
}

// The loggers' record of a step, filled here alone.
StepRecord step_record(const StepOutcome& outcome, double step_seconds, double elapsed_seconds, const RunInfo& info,
                       const MemoryPeaks& peaks) {
  StepRecord record;
  record.step = outcome.step;
  record.loss = outcome.loss;
  record.grad_norm = outcome.grad_norm;
  record.lr = outcome.lr;
  record.target_tokens = outcome.target_tokens;
  record.samples = outcome.samples;
  record.input_tokens = outcome.input_tokens;
  record.documents = outcome.documents;
  const double positions = static_cast<double>(outcome.samples) * static_cast<double>(info.seq_len);
  record.pad_fraction = positions > 0 ? 1.0 - static_cast<double>(outcome.input_tokens) / positions : 0.0;
  record.skipped = outcome.skipped;
  record.data_seconds = outcome.data_seconds;
  record.step_seconds = step_seconds;
  record.elapsed_seconds = elapsed_seconds;
  record.tokens_per_second = step_seconds > 0 ? outcome.input_tokens / step_seconds : 0.0;
  const double flops = info.flops_per_input_token * static_cast<double>(outcome.input_tokens) +
                       info.flops_per_target_token * static_cast<double>(outcome.target_tokens) +
                       info.flops_per_attended_pair * static_cast<double>(outcome.attended_pairs);
  const auto utilisation = [&](double peak) {
    return flops > 0 && peak > 0 && step_seconds > 0 ? flops / step_seconds / (peak * info.world_size)
                                                     : std::numeric_limits<double>::quiet_NaN();
  };
  record.mfu = utilisation(info.peak_flops);
  record.mfu_datasheet = utilisation(info.datasheet_flops);
  record.memory_allocated_bytes = peaks.allocated_bytes;
  record.memory_reserved_bytes = peaks.reserved_bytes;
  record.rss_bytes = peaks.rss_bytes;
  return record;
}

// Every rank stops at the same step: the signal may reach them apart, so
// several ranks sum their flags (a collective, and a wait for the step's
// last kernel). One rank reads its own flag and does not wait: the host
// goes on to launch the next step while the device runs this one's update.
bool agree_to_stop(RunParts& run) {
  if (run.comm->world_size() == 1) return g_stop_signal.load() != 0;
  torch::Tensor stop = torch::tensor({static_cast<int64_t>(g_stop_signal.load())}, torch::kInt64).to(run.device);
  run.comm->all_reduce_sum(stop);
  return stop.item<int64_t>() != 0;
}

// A step's record waits for its time: the device reaches the step's end
// mark after the host has gone on, so the record is logged once the next
// step has waited for its own reduction (by then the mark is behind it),
// or before a checkpoint, a stop, an error or the run's end.
class PendingRecord {
 public:
  PendingRecord(LoggerSet& loggers, const StepClock& clock, const RunInfo& info)
      : loggers_(loggers), clock_(clock), info_(info) {}
  void hold(const StepOutcome& outcome, const MemoryPeaks& peaks, std::shared_ptr<const StepClock::Mark> begin,
            std::shared_ptr<const StepClock::Mark> end) {
    flush();
    held_ = Held{outcome, peaks, std::move(begin), std::move(end), before_begin_, before_end_};
    before_begin_ = held_->begin;
    before_end_ = held_->end;
  }
  void flush() {
    if (!held_) return;
    const double seconds =
        StepClock::step_seconds(held_->before_begin.get(), held_->before_end.get(), *held_->begin, *held_->end);
    const StepRecord record = step_record(
        held_->outcome, seconds, StepClock::seconds_between(clock_.origin(), *held_->end), info_, held_->peaks);
    held_.reset();  // before the loggers: a logger that fails does not get the record twice
    loggers_.log(record);
  }
  // On an error's way out: the record is kept if the device can still say
  // when the step ended; the error in flight is the one reported.
  void flush_on_error() noexcept {
    const int64_t step = held_ ? held_->outcome.step : 0;
    try {
      flush();
    } catch (const std::exception& error) {
      log::error(fmt::format("step {}'s record was not logged: {}", step, error.what()));
    }
  }

 private:
  struct Held {
    StepOutcome outcome;
    MemoryPeaks peaks;
    std::shared_ptr<const StepClock::Mark> begin, end;
    std::shared_ptr<const StepClock::Mark> before_begin, before_end;  // the step before's, null for the first
  };
  LoggerSet& loggers_;
  const StepClock& clock_;
  const RunInfo& info_;
  std::optional<Held> held_;
  std::shared_ptr<const StepClock::Mark> before_begin_, before_end_;  // the last step held
};

}  // namespace

void train(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world) {
  const RunConfig config = run_config(recipe, world.world_size);
  // A run refused before its first file is written leaves no directory it made (after the locks go).
  MadeDirectories made;
  std::optional<RunLock> lock, checkpoint_lock;  // held until train() returns
  RunParts run = set_up(recipe, config, registry, world, made, lock, checkpoint_lock);
  const Context& context = run.context;
  const fs::path out(context.output_dir);
  const CheckpointPolicy& policy = config.checkpoint;

  // The loggers claim their files before anything is written; no two
  // outputs may be one file, nor a logger's one of the run's own files or
  // one it reads (`path = "../recipe.toml"` would replace the recipe).
  std::vector<OutputClaim> own = own_outputs(out);
  own.push_back({policy.dir, "checkpoint.dir", true});
  for (const auto& [what, path] : recipe.input_files()) own.push_back({path, what + " (an input of the run)"});
  struct ClaimsScope {
    ClaimsScope(const fs::path& dir, const std::vector<OutputClaim>& own) { begin_output_claims(dir, own); }
    ~ClaimsScope() { end_output_claims(); }
  } claims(out, own);
  std::vector<std::unique_ptr<Logger>> logger_list;
  for (const ComponentChoice& choice : recipe.loggers) {
    if (!run.writer) break;
    logger_list.push_back(PluginRegistry::create<Logger>(*choice.plugin, choice.options, context));
  }
  LoggerSet loggers(std::move(logger_list));
  RunInfo info = describe_run(config, run);

  // Checkpoints, and where this run starts.
  Checkpointer checkpointer(policy.dir, policy.keep, run_fingerprint(config.fingerprint, config.seed, *run.model),
                            config.fingerprint, info.strategy, run.device, run.optimizer->state_names());
  checkpointer.set_dataset_samples(run.dataset->size());
  checkpointer.set_recipe(recipe.resolved_toml());
  TrainingPosition position;
  int64_t from_step = 0;
  const std::string from = checkpointer.resolve(policy.resume, *run.comm, &from_step);
  if (from_step > config.steps) {
    recipe.training.fail("steps", fmt::format("at least the resumed checkpoint's step {} ({}); a run never ends "
                                              "before the step it resumes from",
                                              from_step, from));
  }
  if (!from.empty()) {
    position = checkpointer.load(from, *run.strategy, *run.model, *run.comm);
    if (run.exact && !position.gradient_exponents.empty()) run.exact->set_exponents(position.gradient_exponents);
  } else {
    if (policy.resume == "auto") log::info(fmt::format("no checkpoint under {}; starting at step 0", policy.dir));
    // A resumed run continues its own results; a fresh one replaces none of another recipe's.
    check_earlier_results(recipe, context.output_dir);
  }
  GlobalBatchSampler sampler(context.seed, run.dataset->size(), run.dataset->shuffle(), position.order);
  // Every input check has passed: the run's files may be written now.
  made.keep();
  if (run.writer) {
    // Left by a run killed while writing them (this run holds the lock).
    for (const RunFile& file : kRunFiles) remove_files_left_beside(out / file.name, "a run");
    keep_recipe_history(recipe, context.output_dir, from.empty() ? std::nullopt : Checkpointer::recipe_of(from),
                        position.step);
    write_file_atomically(out / "recipe.toml", recipe.resolved_toml());
  }
  info.first_step = position.step;
  StopSignals stop_signals;
  loggers.start(info);
  log::info(
      fmt::format("training {} parameters for {} steps: global batch {} = micro-batch {} x {} accumulation "
                  "steps x {} ranks, strategy {}, output {}",
                  info.parameters, config.steps, info.global_batch_size, info.micro_batch_size, info.grad_accum_steps,
                  info.world_size, info.strategy, context.output_dir));
  StepProfiler profiler(config.profile.first, config.profile.count,
                        (fs::path(context.output_dir) / "profile" / "trace.json").string(), run.device);

  // The steps: update, agree on stopping, record, checkpoint.
  StepClock clock(run.device);
  PendingRecord record(loggers, clock, info);
  int64_t applied_updates = position.applied_updates;  // Adam's step count: once per applied optimizer step
  try {
    for (int64_t step = position.step; step < config.steps; ++step) {
      profiler.step_begins(step + 1);
      reset_memory_peaks(run.device);
      std::shared_ptr<const StepClock::Mark> begin = clock.mark();
      const StepOutcome outcome = optimizer_step(run, sampler, config.update, step, applied_updates);
      record.flush();  // the previous step's: the device has passed its end
      // The end waits for an update the strategy left running (Strategy::wait_for_update).
      record.hold(outcome, memory_peaks(run.device), std::move(begin),
                  clock.mark_after([&run] { run.strategy->wait_for_update(); }));
      const bool stopping = agree_to_stop(run);
      if (step == position.step) {  // outside the step's time: settling waits
        run.measured_step_peak_bytes = peak_live_bytes(run.device) - run.memory_baseline;
        run.measured_after_step_bytes = settled_live_bytes(run.device) - run.memory_baseline;
      }
      profiler.step_ended(step + 1);
      inject_stop(step + 1);

      if ((policy.interval > 0 && (step + 1) % policy.interval == 0) || stopping) {
        record.flush();
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
    record.flush();
  } catch (...) {
    record.flush_on_error();
    throw;
  }
  if (config.cuda_graphs) {
    log::info(fmt::format("training.cuda_graphs: {} {} replayed from {} graphs", run.passes->replays(),
                          run.exact ? "atoms" : "micro-steps", run.passes->captures()));
  }
  write_memory_report(*run.strategy, *run.comm, run.device, out / "memory.json", run.writer,
                      {run.measured_setup_bytes, run.measured_after_step_bytes, run.measured_step_peak_bytes});
  const std::vector<torch::Tensor> weights =
      consolidated_parameters(*run.model, *run.strategy, *run.comm, run.device, run.writer);
  write_summary(*run.strategy, *run.comm, run.device, out / "summary.json", run.writer, config.steps, applied_updates,
                weights);
  // Rank 0 writes alone; the others wait on the host for as long as it
  // takes (no collective timeout), so no rank leaves while it writes and no
  // launcher stops it. A stop signal now lets the write finish.
  WriterGate gate(run.store, world.rank, config.comm.timeout());
  if (run.writer) inject_slow_write("slow-final-write");
  write_final_weights(*run.model, weights, context.output_dir, run.writer);
  gate.close();
  if (const int signal = g_stop_signal.load()) {
    log::warn(fmt::format("{} came during the final write; the write was finished first", strsignal(signal)));
  }
}

}  // namespace trainer
