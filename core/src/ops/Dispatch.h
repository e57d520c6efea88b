// When an op runs one of the project's CUDA kernels, and how it calls one.
#pragma once

#include <torch/types.h>
#include <torch/version.h>

#ifdef TRAINER_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "Kernels.h"
#endif

#include "trainer/Errors.h"

// LibTorch's scaled GEMM (at::_scaled_mm with one scale per tensor) and its
// FP8 dtypes as the project calls them: LibTorch 2.9 and later, with the
// project's kernels.
#if defined(TRAINER_CUDA_KERNELS) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9))
#define TRAINER_FP8_LINEAR 1
#endif

namespace trainer::ops {

/// True when `t` is on a CUDA device of a build with the kernels, in a dtype they cover.
inline bool use_kernels(const torch::Tensor& t) {
#ifdef TRAINER_CUDA_KERNELS
  const auto dtype = t.scalar_type();
  return t.is_cuda() && (dtype == torch::kFloat32 || dtype == torch::kFloat64 || dtype == torch::kBFloat16);
#else
  (void)t;
  return false;
#endif
}

#ifdef TRAINER_CUDA_KERNELS
inline kernels::Dtype kernel_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat64:
      return kernels::Dtype::Float64;
    case torch::kBFloat16:
      return kernels::Dtype::BFloat16;
    default:
      return kernels::Dtype::Float32;
  }
}

/// Where one of the project's kernels runs: its tensors' device, made
/// current for the launch (a no-op when it already is), and that device's
/// current stream, the one the caller ordered its work on. Every launch takes
/// its stream from here, never from "the current device": on a rank whose
/// GPU is not device 0 that would be another GPU's stream. Throws naming the
/// kernel when a defined tensor is not on the first one's device.
class KernelLaunch {
 public:
  KernelLaunch(const char* kernel, std::initializer_list<torch::Tensor> tensors)
      : guard_(device_of(kernel, tensors)), stream_(c10::cuda::getCurrentCUDAStream(guard_.current_device().index())) {}
  cudaStream_t stream() const { return stream_.stream(); }

 private:
  static torch::Device device_of(const char* kernel, std::initializer_list<torch::Tensor> tensors) {
    const torch::Device device = tensors.begin()->device();
    for (const torch::Tensor& t : tensors) {
      if (t.defined() && t.device() != device) {
        throw TrainingError(std::string("CUDA kernel ") + kernel + ": a tensor on " + t.device().str() +
                            " beside one on " + device.str() + "; a kernel's tensors share one device");
      }
    }
    if (!device.is_cuda()) throw std::logic_error(std::string("CUDA kernel ") + kernel + " given CPU tensors");
    return device;
  }

  c10::cuda::CUDAGuard guard_;
  c10::cuda::CUDAStream stream_;
};

/// Throws naming the kernel when its launch failed.
inline void check_launch(const char* kernel) {
  if (const char* error = kernels::last_error()) {
    throw TrainingError(std::string("CUDA kernel ") + kernel + " failed: " + error);
  }
}
#endif

/// Whether a weight-gradient GEMM may add straight into the fp32 .grad a
/// strategy bound (gradient-accumulation fusion). Off in reproducible mode:
/// every gradient then reaches autograd's hooks, which sum it exactly.
/// Process-wide; set before training starts.
bool gradient_fusion_enabled();
void set_gradient_fusion(bool enabled);

/// Whether bf16 GEMMs on CUDA (the linear layers' three, the head's) run
/// through the project's cuBLASLt call (kernels::bf16_gemm: the algorithm
/// cuBLASLt's heuristic ranks first, a 32 MiB workspace per stream) instead
/// of LibTorch's; training.gemm_library. Off in reproducible mode (LibTorch's
/// GEMMs are its format's). Process-wide, off until set; set before training starts.
bool lt_gemms_enabled();
void set_lt_gemms(bool enabled);

/// Whether those GEMMs time up to eight of cuBLASLt's algorithms at each
/// shape's first call and keep the fastest that writes the first-ranked
/// one's bits there (training.gemm_library = "cublaslt-timed"). Process-wide,
/// off until set; set before training starts.
bool lt_gemm_timing();
void set_lt_gemm_timing(bool timed);

/// d = A B + beta d through kernels::bf16_gemm, where it applies: lt_gemms
/// on, a CUDA build, `a` and `b` bf16, `d` bf16 (beta 0 only) or fp32 [rows,
/// cols], all contiguous on one CUDA device. `a` holds A [rows, inner], or
/// with `a_t` its transpose; `b` holds B [inner, cols], or with `b_t` its
/// transpose. (A bf16 d with beta 1 came out of cuBLASLt with errors beyond
/// one rounding of the sum on an H100: 0.19 at |d| ~ 30.)
/// False where it does not apply or cuBLASLt offers no algorithm (nothing
/// ran: the caller runs LibTorch's GEMM); throws where the launch failed.
bool lt_gemm(const torch::Tensor& d, const torch::Tensor& a, bool a_t, const torch::Tensor& b, bool b_t, float beta);

/// Whether lt_gemm can apply to operands like `a` (lt_gemms on, a CUDA
/// build, bf16 on CUDA): a test before allocating its output.
bool lt_gemm_may_apply(const torch::Tensor& a);

/// The weight's .grad where a kernel may add the weight's gradient into it
/// in fp32 (a buffer a strategy bound): fusion on, the weight a leaf, its
/// .grad fp32, contiguous, of its shape and on its device; else undefined.
/// The one test of the fused paths (linear's GEMMs, the norm's kernel, the
/// embedding's rows, the head's chunks).
torch::Tensor bound_fp32_gradient(const torch::Tensor& weight);

/// Whether the linear layers (ops::linear, ops::linear_of) compute in FP8
/// (training.precision = "fp8"): E4M3 forward, E5M2 output gradient, each
/// tensor with one scale from its largest magnitude, through cuBLASLt's
/// scaled GEMM; only bf16 CUDA tensors whose dimensions are multiples of 16
/// (the others, and every build without the scaled GEMM, stay bf16). All
/// three products in FP8 (forward, input and weight gradients); the weight
/// gradient is added in fp32 into the weights' fp32 gradients as in bf16.
/// Process-wide; set before training starts.
bool fp8_linear_enabled();
void set_fp8_linear(bool enabled);
/// Whether FP8 layers scale per row instead of per tensor
/// (training.fp8_scaling = "rowwise"): the forward's operands with one scale
/// per token of x and per output channel of W, the input gradient's with one
/// per token of dY and per input channel of W, the weight gradient in bf16
/// with fp32 accumulation (a scale per token would lie along its reduction,
/// which a scaled GEMM cannot take). One outlying token or channel then
/// costs only its own precision. Process-wide; set before training starts.
bool fp8_rowwise_scaling();
void set_fp8_rowwise_scaling(bool rowwise);
/// Whether an FP8 layer's forward, where its weights want gradients, also
/// casts them transposed (one pass writing both layouts) and keeps that
/// cast for the input gradient's GEMM, instead of casting them again in
/// backward: about 1 byte a weight element held from forward to backward
/// for one read of them less. On by default; the run turns it off where
/// the strategy gathers parameters per unit (zero3: the cast would hold 1
/// byte a parameter of the whole model beside the shards).
bool fp8_keeps_transposed_weights();
void set_fp8_keeps_transposed_weights(bool keep);
/// The FP8 weights' casts of one optimizer step, reused by its micro-steps.
/// While a scope is open on this thread (the training loop opens one around
/// a step's forward and backward passes, where nothing writes the weights),
/// an FP8 forward that keeps its weights' transposed cast (above) keeps it
/// until the scope closes, with their largest magnitude; a later forward
/// over the same weights in the scope (the next micro-step's) casts them
/// only as laid out, with that magnitude's scale: one read of the bf16
/// weights and a byte written an element, where a first forward reads them
/// twice (the amax, the cast) and writes two bytes. The same bytes either
/// way. Only weights used in place are kept (one weight, or several lying
/// back to back in one storage: never a concatenated copy, whose address a
/// later copy could take), and an entry is used only while the weights'
/// version counter is unchanged. Entries hold device memory (the
/// transposed cast, a byte a weight element, which the forward kept for
/// its backward anyway) until the scope closes. With Keep::both they hold
/// the cast as laid out too (another byte a weight element, from the first
/// forward to the scope's end), and later forwards cast nothing. Scopes do
/// not nest.
class Fp8WeightReuse {
 public:
  enum class Keep { transposed, both };
  explicit Fp8WeightReuse(Keep keep = Keep::transposed);
  ~Fp8WeightReuse();
  Fp8WeightReuse(const Fp8WeightReuse&) = delete;
  Fp8WeightReuse& operator=(const Fp8WeightReuse&) = delete;
  /// Forwards, over the process, that cast their weights from a kept entry.
  static int64_t reused();
};
/// Whether this build can compute linear layers in FP8 at all (CUDA kernels
/// and LibTorch's scaled GEMM).
bool fp8_linear_available();

#ifdef TRAINER_CUDA_KERNELS
/// The largest magnitude of a tensor, computed by the kernel that wrote it
/// (`amax`: one device float, as fp8_amax's), offered to the FP8 cast that
/// reads the tensor next so that the cast skips its own pass over it. One
/// offer per thread (the forward's producer and consumer run on the
/// caller's thread, the backward's on autograd's), replaced by the next.
void offer_fp8_amax(const torch::Tensor& t, const torch::Tensor& amax);
/// The amax offered for `t`, when `t` is the tensor offered (same data,
/// elements and layout) and nothing has written to it since (its version
/// counter unchanged); undefined otherwise. Either way the offer is
/// withdrawn: it holds the tensor alive until then.
torch::Tensor take_fp8_amax(const torch::Tensor& t);

/// The gradient of swiglu (CUDA kernels) with respect to its input
/// `gate_up` for the output gradient `d_out`, as swiglu's backward computes
/// it (offering its amax as that does). Given `value` (contiguous, half of
/// gate_up's elements, its dtype), the same pass writes swiglu's output
/// there, the forward's bits: a backward that needs the output again reads
/// gate_up once.
torch::Tensor swiglu_gradient(const torch::Tensor& gate_up, const torch::Tensor& d_out,
                              const torch::Tensor& value = torch::Tensor());

/// Where the linear layers run in FP8 with one scale per tensor and the
/// values are bf16, a device float for a kernel's amax of what it writes (offered to the FP8 cast
/// that reads it next); else undefined.
inline torch::Tensor fp8_amax_buffer(const torch::Tensor& like) {
  if (!fp8_linear_enabled() || fp8_rowwise_scaling() || like.scalar_type() != torch::kBFloat16) return torch::Tensor();
  return torch::empty({1}, like.options().dtype(torch::kFloat32));
}

/// Whether rms_norm runs the project's kernels for these operands: bf16 on
/// CUDA, a width the kernels take (RmsNorm.cu).
bool rms_norm_kernels_apply(const torch::Tensor& x, const torch::Tensor& weight);

/// The norm's output and each row's reciprocal RMS (fp32), for backward.
/// Where the linear layers run in FP8, the output's amax is offered.
struct RmsNormForward {
  torch::Tensor y, rstd;
};
RmsNormForward rms_norm_forward(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// The gradients of rms_norm_forward's output `dy` with respect to x and
/// the weight. `weight` is the parameter itself: where its .grad is an fp32
/// buffer a strategy bound (see fused_gradient_target), its gradient is
/// added there in fp32 and returned undefined; else returned in bf16.
struct RmsNormGrads {
  torch::Tensor dx, dweight;
};
RmsNormGrads rms_norm_gradients(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& rstd);

#ifdef TRAINER_FP8_LINEAR
/// rms_norm_forward's output, computed again from x and `rstd`, cast to
/// E4M3 with the scale 1 / inverse_scale, transposed ([width, rows]);
/// undefined where the kernel does not take the shape.
torch::Tensor rms_norm_fp8_transposed(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& rstd,
                                      const torch::Tensor& inverse_scale);
#endif
#endif

/// Where a GEMM (or a norm's kernel) may add the gradient of `weights`
/// straight into their .grad: bf16 `dy` on CUDA, fusion on, every weight a
/// leaf whose .grad is a contiguous fp32 buffer of its shape, the buffers
/// back to back; the buffers as one view then, else undefined.
torch::Tensor fused_gradient_target(const std::vector<torch::Tensor>& weights, const torch::Tensor& dy);

/// fp64 stays fp64; everything narrower computes in fp32.
inline torch::Dtype accumulate_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace trainer::ops
