// A run's set-up (see SetUp.h).
#include "run/SetUp.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include "checkpoint/Checkpoint.h"
#include "distributed/Rendezvous.h"
#include "ops/Dispatch.h"
#include "run/DeviceStats.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

// Before anything else touches CUDA: this rank's GPU becomes current.
torch::Device device_of(const Recipe& recipe, const RunConfig& config, const WorldInfo& world) {
  if (config.device == "cuda" && !torch::cuda::is_available()) {
    recipe.run.fail("device", "'cpu': this machine has no CUDA device");
  }
  try {
    return bind_rank_device(config.device == "cuda", world);
  } catch (const InputError& error) {
    recipe.run.fail("device", fmt::format("a usable CUDA device ({})", error.what()));
  }
}

// World size 1 needs no rendezvous; otherwise the backend must suit the
// device (the project's two are checked here; another's connect() says).
std::unique_ptr<Comm> connect_comm(const Recipe& recipe, const RunConfig& config, PluginRegistry& registry,
                                   const WorldInfo& world, torch::Device device,
                                   c10::intrusive_ptr<c10d::Store>* store) {
  check_backend(recipe, registry, world.world_size);
  const std::string& backend = config.comm.backend;
  if (world.world_size > 1 && (backend == "nccl" || backend == "gloo") && (backend == "nccl") != device.is_cuda()) {
    recipe.distributed.fail(
        "backend", fmt::format("'{}' for run.device = '{}'", device.is_cuda() ? "nccl" : "gloo", config.device));
  }
  return connect_world(registry, backend, world, config.comm.timeout(), device, recipe.resolved_toml(), false, store);
}

}  // namespace

RunParts set_up(const Recipe& recipe, const RunConfig& config, PluginRegistry& registry, const WorldInfo& world,
                MadeDirectories& made, std::optional<RunLock>& lock, std::optional<RunLock>& checkpoint_lock) {
  RunParts run;
  run.context = Context{config.output_dir, config.device, config.seed, world.rank, world.world_size, world.local_rank};
  const Context& context = run.context;
  run.config = &config;
  log::set_rank(world.rank, world.world_size);
  // Local ranks share the machine's cores instead of each taking all of them.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(1, cores / std::max(1, world.local_world_size)));
  if (config.reproducible) run.reproducible = std::make_unique<ReproducibleSettings>();
  run.device = device_of(recipe, config, world);
  if (config.cuda_graphs) run.capture_stream = std::make_unique<CaptureStream>(run.device);
  if (run.device.is_cuda()) {
    log::info(fmt::format("rank {} (local rank {}) computes on {}", world.rank, world.local_rank, run.device.str()));
  }
  ops::set_fp8_linear(config.fp8);
  // Reproducible mode's settings (above) turned them off; they stay off.
  ops::set_lt_gemms(config.lt_gemms && !config.reproducible);
  ops::set_lt_gemm_timing(config.lt_gemm_timing);
  ops::set_fp8_rowwise_scaling(config.fp8 && config.fp8_rowwise);
  if (config.fp8 && config.fp8_rowwise) {
    log::info(
        "linear layers in FP8: E4M3 forward, E5M2 output gradients, one power-of-two scale per row (per token, "
        "per channel); weight gradients in bf16 added into fp32; MFU against the bf16 peak");
  } else if (config.fp8) {
    log::info(
        "linear layers in FP8: E4M3 forward, E5M2 output gradients, one power-of-two scale per tensor; "
        "weight gradients E5M2 x E4M3 added into fp32; MFU against the bf16 peak");
  }
  run.writer = world.rank == 0;
  if (run.writer) {
    // Locked, not yet written: recipe.toml and the loggers' files wait until every input check has passed.
    const auto make_dir = [&](const Options& section, const std::string& key, const std::string& dir) {
      std::error_code error;
      made.create(dir, error);
      if (error || !fs::is_directory(dir)) {
        section.fail(key, fmt::format("a directory this run can create and write; {}: {}", dir,
                                      error ? error.message() : "not a directory"));
      }
    };
    make_dir(recipe.run, "output_dir", context.output_dir);
    lock.emplace(context.output_dir, "run.output_dir");
    make_dir(recipe.checkpoint, "dir", config.checkpoint.dir);
    std::error_code error;
    if (!fs::equivalent(config.checkpoint.dir, context.output_dir, error)) {
      checkpoint_lock.emplace(config.checkpoint.dir, "checkpoint.dir");
    }
  }
  run.comm = connect_comm(recipe, config, registry, world, run.device, &run.store);

  // Tensor memory from here to the end of the strategy's setup is the
  // model's and the strategy's: memory.json holds it beside the strategy's
  // own report.
  count_cpu_allocations();
  run.memory_baseline = live_bytes(run.device);
  run.model = PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
  run.dataset = PluginRegistry::create<Dataset>(*recipe.dataset.plugin, recipe.dataset.options, context);
  run.optimizer =
      PluginRegistry::create<Optimizer>(*recipe.optimizer_plugin.plugin, recipe.optimizer_plugin.options, context);
  run.strategy = PluginRegistry::create<Strategy>(*recipe.strategy.plugin, recipe.strategy.options, context);
  run.optimizer_name = recipe.optimizer_plugin.plugin->descriptor->name;
  run.dataset_name = recipe.dataset.plugin->descriptor->name;
  run.model_name = recipe.model.plugin->descriptor->name;
  run.strategy_name = recipe.strategy.plugin->descriptor->name;
  if (run.dataset->vocab_size() > run.model->vocab_size()) {
    recipe.model.options.fail("vocab_size", fmt::format("at least the dataset's vocabulary size {}, got {}",
                                                        run.dataset->vocab_size(), run.model->vocab_size()));
  }
  if (run.dataset->packs_documents() && !run.model->separates_documents()) {
    recipe.dataset.options.fail(
        "pack", fmt::format("false with model '{}': it does not keep packed documents apart (attention and positions "
                            "per document: Model::separates_documents)",
                            run.model_name));
  }
  for (const NamedParameter& p : run.model->parameters()) run.parameter_count += p.tensor.numel();

  run.strategy->setup(*run.model, *run.comm,
                      StrategyEnv{run.device, run.optimizer.get(), config.compute_dtype, config.reproducible});
  check_state_coverage(*run.strategy, *run.model, *run.comm, run.device, run.strategy_name);
  run.measured_setup_bytes = live_bytes(run.device) - run.memory_baseline;

  const MemoryReport memory = run.strategy->memory();
  // A strategy that frees parameters' memory between uses (zero3 gathers a
  // unit at a time; outside that its parameters hold no memory, as after
  // setup): FP8 casts of the weights kept from forward to backward would
  // hold 1 byte a parameter of the whole model beside its shards.
  bool released = false;
  for (const NamedParameter& p : run.model->parameters()) {
    released = released || (p.tensor.numel() > 0 && p.tensor.storage().nbytes() == 0);
  }
  ops::set_fp8_keeps_transposed_weights(!released);
  if (config.fp8 && !config.fp8_rowwise) {  // rowwise casts W per input channel in backward, always
    log::info(released ? "FP8: the weights are cast transposed again in backward (the strategy releases parameters "
                         "between uses)"
                       : "FP8: the weights' transposed casts are kept from forward to backward (about 1 byte a "
                         "weight element)");
  }
  log::info(fmt::format("rank {} holds {} parameter, {} gradient and {} optimizer-state bytes", world.rank,
                        memory.parameter_bytes, memory.gradient_bytes, memory.optimizer_bytes));
  // After the strategy's setup: its hooks and bound buffers are in place, and
  // these hooks only read the gradients passing through.
  if (run.reproducible) {
    run.exact =
        std::make_unique<ExactGradients>(*run.model, config.shape.global_batch_size() / config.reproducible_atom,
                                         run.device, run.strategy.get(), run.strategy_name);
    if (config.cuda_graphs && !run.strategy->replayable_atoms()) {
      recipe.training.fail("cuda_graphs",
                           fmt::format("false with strategy '{}': its atoms cannot be replayed from a CUDA graph "
                                       "(Strategy::replayable_atoms; ddp, zero1 and zero2 can)",
                                       run.strategy_name));
    }
    if (config.cuda_graphs && run.dataset->packs_documents()) {
      recipe.training.fail("cuda_graphs",
                           "false with a dataset that packs documents (each atom's documents lie elsewhere, which "
                           "one graph cannot replay)");
    }
    run.passes = std::make_unique<ForwardBackwardRunner>(run.device, config.cuda_graphs);
    if (config.cuda_graphs) {
      log::info("training.cuda_graphs: each atom shape runs once, is captured the second time and replayed after");
    }
  } else if (config.cuda_graphs) {
    const int64_t steps = config.shape.grad_accum_steps;
    std::vector<std::string> eager;  // the micro-steps of a step that run eagerly
    for (int64_t k = 0; k < steps; ++k) {
      if (run.strategy->replayable_micro_step(MicroStep{k, k == steps - 1, steps, 0})) continue;
      eager.push_back(k == steps - 1 ? "last" : k == 0 ? "first" : fmt::format("#{}", k + 1));
    }
    if (static_cast<int64_t>(eager.size()) == steps) {
      recipe.training.fail(
          "cuda_graphs",
          fmt::format("false with strategy '{}'{}: none of its micro-steps can be replayed from a CUDA graph "
                      "(Strategy::replayable_micro_step; zero1 replays every micro-step, ddp every one but a last "
                      "one that starts all-reduces, so at world size > 1 it needs accumulation steps, and with "
                      "overlap_update every one but a step's first)",
                      run.strategy_name,
                      world.world_size > 1 ? fmt::format(" at world size {}", world.world_size) : std::string()));
    }
    if (run.dataset->packs_documents()) {
      recipe.training.fail("cuda_graphs",
                           "false with a dataset that packs documents (each micro-batch's documents lie elsewhere, "
                           "which one graph cannot replay)");
    }
    run.passes = std::make_unique<ForwardBackwardRunner>(run.device, /*graphs=*/true);
    log::info(
        fmt::format("training.cuda_graphs: each micro-batch shape runs once, is captured the second time and "
                    "replayed after ({})",
                    eager.empty() ? std::string("every micro-step")
                                  : fmt::format("all but the {} micro-step of a step", fmt::join(eager, " and the "))));
  }
  // Nothing writes the weights between a step's first forward and its
  // update, so its later micro-steps may reuse the first's casts of them:
  // where the forwards keep their transposed casts anyway, and not from a
  // CUDA graph (a replay reads what its capture cast).
  run.reuse_fp8_weight_casts = config.fp8 && !config.fp8_rowwise && !released && !config.reproducible &&
                               !config.cuda_graphs && config.shape.grad_accum_steps > 1;
  run.reuse_keeps_both_casts = run.reuse_fp8_weight_casts && config.fp8_keep_both_casts;
  if (run.reuse_fp8_weight_casts) {
    log::info(
        fmt::format("FP8: the weights are cast once a step and the casts reused by its {} micro-steps{}",
                    config.shape.grad_accum_steps,
                    run.reuse_keeps_both_casts ? " (both layouts kept: a byte a weight element more memory)" : ""));
  } else if (config.fp8_keep_both_casts) {
    log::warn(fmt::format(
        "training.fp8_weight_casts = 'both' keeps nothing in this run: no cast is reused across "
        "micro-steps {}",
        config.shape.grad_accum_steps == 1 ? std::string("with grad_accum_steps = 1")
        : config.cuda_graphs               ? std::string("under training.cuda_graphs (a replay reads what its "
                                                                       "capture cast)")
                             : fmt::format("where the strategy ({}) releases parameters", run.strategy_name)));
  }
  return run;
}

RunInfo describe_run(const RunConfig& config, const RunParts& run) {
  RunInfo info;
  info.name = config.name;
  info.total_steps = config.steps;
  info.global_batch_size = config.shape.global_batch_size();
  info.micro_batch_size = config.shape.micro_batch_size;
  info.grad_accum_steps = config.shape.grad_accum_steps;
  info.seq_len = run.dataset->seq_len();
  info.world_size = config.shape.world_size;
  info.strategy = run.strategy_name;
  info.parameters = run.parameter_count;
  const TrainingFlops flops = run.model->training_flops();
  info.flops_per_input_token = flops.per_input_token;
  info.flops_per_target_token = flops.per_target_token;
  info.flops_per_attended_pair = flops.per_attended_pair;
  info.peak_flops = config.peak_tflops * 1e12;
  info.datasheet_flops = config.datasheet_tflops * 1e12;
  if (info.datasheet_flops == 0.0 && run.device.is_cuda()) {
    std::string device_name;
    info.datasheet_flops = datasheet_flops(run.device, config.compute_dtype, &device_name);
    log::info(info.datasheet_flops > 0
                  ? fmt::format("{}: datasheet dense {} peak {:.0f} TFLOP/s per rank (mfu_datasheet)", device_name,
                                config.compute_dtype == torch::kBFloat16 ? "bf16" : "fp32", info.datasheet_flops / 1e12)
                  : fmt::format("{}: no datasheet peak known (run.datasheet_tflops sets it)", device_name));
  }
  if (info.peak_flops == 0.0 && run.device.is_cuda()) {
    info.peak_flops = measure_matmul_flops(run.device, config.compute_dtype);
    log::info(
        fmt::format("measured {} matmul rate: {:.0f} TFLOP/s per rank (MFU is relative to it; "
                    "run.peak_tflops sets it instead)",
                    config.compute_dtype == torch::kBFloat16 ? "bf16" : "fp32", info.peak_flops / 1e12));
  }
  return info;
}

}  // namespace trainer
