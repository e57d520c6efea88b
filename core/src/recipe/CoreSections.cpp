// The keys of the core's own recipe sections: [run], [training],
// [optimizer], [lr_schedule], [distributed], [checkpoint].
#include "recipe/Recipe.h"

namespace trainer {

namespace {

using VT = ValueType;
constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr KeySpec kRunKeys[] = {
    {"name", VT::String, "'run'", "name of the run, shown by loggers"},
    {"seed", VT::Int, "0", "seed of parameter init, data and sampling", 0, 9.0e15},
    {"output_dir", VT::String, "''", "where recipe.toml and metrics.jsonl go; '' means runs/<name>"},
    {"overwrite", VT::Bool, "false",
     "true: a run that starts at step 0 may replace an earlier run's results (model.safetensors, summary.json) in "
     "its output directory although its recipe differs; false: refused (the same recipe runs again)"},
    {"device", VT::String, "'cpu'", "compute device", -kInf, kInf, "cpu|cuda"},
    {"peak_tflops", VT::Float, "0",
     "per-rank peak TFLOP/s that MFU is relative to; 0: measured at start on CUDA (a bf16 or fp32 matmul), "
     "no MFU on the CPU",
     0, 1e9},
    {"datasheet_tflops", VT::Float, "0",
     "per-rank datasheet dense peak TFLOP/s for mfu_datasheet (the field's convention); 0: looked up for known "
     "CUDA devices (H100, H200: 989 bf16, 67 fp32; A100: 312, 19.5), none on the CPU",
     0, 1e9},
    {"profile_start", VT::Int, "0",
     "first step (1-based) recorded with the PyTorch profiler into <output_dir>/profile/trace.json "
     "(a Chrome trace: host operators and CUDA kernels); 0: off",
     0, 1e12},
    {"profile_steps", VT::Int, "1", "steps recorded from run.profile_start", 1, 1000},
};
constexpr KeySpec kTrainingKeys[] = {
    {"steps", VT::Int, "100", "optimizer steps to run", 1, 1e12},
    {"micro_batch_size", VT::Int, "8", "samples per micro-step on each rank", 1, 1 << 20},
    {"grad_accum_steps", VT::Int, "1", "micro-steps per optimizer step", 1, 1 << 20},
    {"global_batch_size", VT::Int, "0", "samples per optimizer step; when set, grad_accum_steps is derived from it", 0,
     1 << 30},
    {"precision", VT::String, "'fp32'",
     "compute precision; bf16 keeps fp32 master weights, optimizer state and gradient accumulation; fp8 is bf16 "
     "with the blocks' linear layers in FP8 (E4M3 forward, E5M2 gradients, one scale per tensor; CUDA only)",
     -kInf, kInf, "fp32|bf16|fp8"},
    {"fp8_scaling", VT::String, "'tensorwise'",
     "precision = 'fp8': one power-of-two scale per tensor (tensorwise), or per row (rowwise: forward and input "
     "gradient scaled per token and per channel, so an outlying token or channel costs only its own precision; "
     "the weight gradient in bf16 with fp32 accumulation; slower)",
     -kInf, kInf, "tensorwise|rowwise"},
    {"fp8_weight_casts", VT::String, "'transposed'",
     "precision = 'fp8' (tensorwise) with grad_accum_steps > 1: the weights' E4M3 casts that a step's first "
     "micro-step keeps for the others (the weights do not change within a step): transposed (the input gradient's "
     "layout, held for the backward anyway; each later forward casts the weights again as laid out) or both (that "
     "layout too: another byte a weight element held through the step, no cast in later forwards); the same bits "
     "either way; no effect under cuda_graphs, zero3 or reproducible mode",
     -kInf, kInf, "transposed|both"},
    {"gemm_library", VT::String, "'cublaslt-timed'",
     "on CUDA in bf16: the linear layers' and the head's GEMMs through the project's cuBLASLt calls (cublaslt: "
     "the heuristic's first algorithm; cublaslt-timed: the fastest of its first eight that writes the first's bits, "
     "timed at each shape's first call, with one output's scratch where the GEMM accumulates) or LibTorch's "
     "(libtorch); reproducible mode always takes LibTorch's (its format's bits)",
     -kInf, kInf, "cublaslt|cublaslt-timed|libtorch"},
    {"max_grad_norm", VT::Float, "1.0", "clip the global gradient norm to this; 0 turns clipping off", 0, kInf},
    {"on_nonfinite", VT::String, "'error'",
     "a non-finite gradient norm stops the run (error) or skips the update (skip)", -kInf, kInf, "error|skip"},
    {"reproducible", VT::Bool, "false",
     "the same bits whatever the micro-batch size, accumulation steps, world size and strategy: one sample per "
     "forward and backward, deterministic kernels, gradients summed exactly in fixed point (README: cost)"},
    {"reproducible_atom", VT::Int, "1",
     "reproducible mode: samples per forward and backward; splits whose micro_batch_size is a multiple of it "
     "train the same bits (1: every split; larger: fewer, faster launches)",
     1, 1 << 20},
    {"cuda_graphs", VT::Bool, "false",
     "on CUDA: capture one micro-step's (reproducible mode: one atom's) forward and backward in a CUDA graph and "
     "replay it for the others of its shape (the same bits, far fewer launches); needs unpacked samples and a "
     "strategy that can replay them: ddp and zero1 (reproducible mode also zero2); at world size > 1 the fast "
     "mode's last micro-step of a step runs eagerly (it starts the all-reduces)"},
};
constexpr KeySpec kOptimizerKeys[] = {
    // The rest of [optimizer] are the chosen optimizer plugin's keys (adamw:
    // beta1, beta2, eps, weight_decay; `trainer plugins NAME` lists them).
    {"name", VT::String, "'adamw'", "optimizer plugin (a name or .so file): adamw, muon, lion, or another"},
    {"lr", VT::Float, "1e-3", "peak learning rate", 0, kInf},
};
constexpr KeySpec kScheduleKeys[] = {
    {"name", VT::String, "'constant'", "shape after warmup", -kInf, kInf, "constant|linear|cosine"},
    {"warmup_steps", VT::Int, "0", "linear warmup from lr/warmup_steps to lr", 0, 1e12},
    {"min_lr", VT::Float, "0.0", "learning rate at the last step (linear, cosine)", 0, kInf},
};
constexpr KeySpec kDistributedKeys[] = {
    {"backend", VT::String, "'gloo'",
     "communication plugin (a comm plugin's name or .so file) when world size > 1: gloo (CPU), nccl (CUDA), or "
     "another"},
    {"nproc", VT::Int, "1", "local worker processes `trainer run` starts (ignored under an external launcher)", 1,
     4096},
    // At most 1e7 s (116 days): the millisecond count stays far inside int64.
    {"timeout_s", VT::Float, "300", "a collective or peer silent this long ends the job", 1, 1e7},
};

constexpr KeySpec kCheckpointKeys[] = {
    {"interval", VT::Int, "0", "write a checkpoint every this many optimizer steps; 0: only when stopped by a signal",
     0, 1e12},
    {"keep", VT::Int, "2", "newest checkpoints kept", 1, 1e6},
    {"resume", VT::String, "''", "'' (start fresh), 'auto' (the newest valid checkpoint, if any) or a checkpoint path"},
    {"dir", VT::String, "''", "where checkpoints go; '' means <output_dir>/checkpoints"},
};

template <size_t N>
SectionSpec section(const char* name, const KeySpec (&keys)[N], Options Recipe::*options) {
  return SectionSpec{name, keys, N, options};
}

}  // namespace

std::vector<SectionSpec> core_sections() {
  return {section("run", kRunKeys, &Recipe::run),
          section("training", kTrainingKeys, &Recipe::training),
          section("optimizer", kOptimizerKeys, &Recipe::optimizer),
          section("lr_schedule", kScheduleKeys, &Recipe::lr_schedule),
          section("distributed", kDistributedKeys, &Recipe::distributed),
          section("checkpoint", kCheckpointKeys, &Recipe::checkpoint)};
}

}  // namespace trainer
