// Launchers of the project's own CUDA kernels (Rotary.cu, SwiGlu.cu, RmsNorm.cu, CrossEntropy.cu, AdamW.cu,
// FixedPoint.cu, StochasticRound.cu, Fp8.cu, Fp8Gemm.cu). Plain
// pointers and a stream: the kernels see no LibTorch header, so nvcc never
// compiles LibTorch's headers. Built only where CUDA parts are on.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace trainer::ops::kernels {

enum class Dtype { Float32, Float64, BFloat16 };

/// Forward of split_qkv_rotary: reads rows of `qkv` ([tokens, (heads + 2 kv_heads) * head_dim],
/// row stride `qkv_stride` elements), writes q, k (rotated) and v (copied), each contiguous
/// [tokens, heads or kv_heads, head_dim]. `cos`, `sin`: [seq, head_dim / 2] in float
/// (double for Float64); token r sits at position r % seq.
void qkv_rotary_forward(Dtype dtype, const void* qkv, int64_t qkv_stride, void* q, void* k, void* v, const void* cos,
                        const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                        cudaStream_t stream);

/// Its backward: the inverse rotation of dq and dk and a copy of dv into the contiguous gradient of qkv.
void qkv_rotary_backward(Dtype dtype, const void* dq, const void* dk, const void* dv, void* dqkv, const void* cos,
                         const void* sin, int64_t tokens, int64_t seq, int heads, int kv_heads, int head_dim,
                         cudaStream_t stream);

/// silu(gate) * up over rows [gate | up] of width 2 * width; out: [rows, width].
/// When `amax` (one device float) is not null, it receives the largest
/// magnitude of the output as stored (NaN when any value is NaN): what
/// fp8_amax would find, for the FP8 cast that reads the output next.
void swiglu_forward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t width, float* amax,
                    cudaStream_t stream);

/// Gradient of swiglu_forward into d_gate_up ([rows, 2 * width]) from d_out and the saved input;
/// `amax` as swiglu_forward's, over d_gate_up. With `out` ([rows, width]), the same pass also
/// writes swiglu_forward's output there, bit for bit.
void swiglu_backward(Dtype dtype, const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows, int64_t width,
                     float* amax, cudaStream_t stream, void* out = nullptr);

/// SwiGLU's output of bf16 `gate_up` ([rows, 2 * width]) as swiglu_forward
/// writes it, cast to E4M3 with the scale 1 / *inverse_scale (a device
/// float) and written transposed into out_t ([width, rows]), as
/// fp8_quantize_transposed would write it from swiglu_forward's output: the
/// same bytes, without the bf16 output. False, launching nothing, unless
/// rows and width are multiples of 8, gate_up is 16-byte and out_t 8-byte aligned.
bool swiglu_fp8_transposed(const void* gate_up, int64_t rows, int64_t width, const float* inverse_scale, void* out_t,
                           cudaStream_t stream);

/// Whether the transposing casts (fp8_quantize_transposed's vector path,
/// swiglu_fp8_transposed, rms_norm_fp8_transposed) take a [rows, cols]
/// input at `input` written transposed to `out_t`.
bool transposed_cast_fits(int64_t rows, int64_t cols, const void* input, const void* out_t);

/// swiglu_backward (bf16: d_gate_up and `amax` as it writes them) and
/// swiglu_fp8_transposed (out_t, with the forward's scale 1 / *inverse_scale)
/// in one pass, reading gate_up and d_out once: the same bytes as the two.
/// False, launching nothing, on swiglu_fp8_transposed's conditions or where
/// d_out or d_gate_up is not 16-byte aligned.
bool swiglu_backward_fp8_transposed(const void* gate_up, const void* d_out, void* d_gate_up, int64_t rows,
                                    int64_t width, const float* inverse_scale, void* out_t, float* amax,
                                    cudaStream_t stream);

/// Whether the RMSNorm kernels take rows of `width`: a multiple of 8, at most 4096.
bool rms_norm_fits(int64_t width);

/// RMSNorm of bf16 rows `x` ([rows, width]) with the bf16 weight `gamma`:
/// y = x r gamma rounded once to bf16, r = 1 / sqrt(mean(x^2) + eps) in
/// fp32, written to rstd[row] when `rstd` is not null. `amax` as
/// swiglu_forward's, over y. False, launching nothing, unless rms_norm_fits
/// and x, gamma and y are 16-byte aligned.
bool rms_norm_forward(const void* x, const void* gamma, int64_t rows, int64_t width, float eps, void* y, float* rstd,
                      float* amax, cudaStream_t stream);

/// The fp32 scratch rms_norm_backward needs, in floats.
int64_t rms_norm_backward_scratch(int64_t rows, int64_t width);

/// The gradients of rms_norm_forward for the output gradient `dy` (bf16
/// [rows, width]) from its input, weight and `rstd`: dx (bf16) and the
/// weight's, a sum over rows in an order fixed by the shape (the same bits
/// every run), added in fp32 into `into` when not null, else written in
/// bf16 to `d_gamma`. `scratch`: rms_norm_backward_scratch floats, 16-byte
/// aligned. False, launching nothing, on rms_norm_forward's conditions.
bool rms_norm_backward(const void* dy, const void* x, const void* gamma, const float* rstd, int64_t rows, int64_t width,
                       void* dx, float* scratch, float* into, void* d_gamma, cudaStream_t stream);

/// rms_norm_forward's output of `x`, `gamma` and `rstd` (its own), cast to
/// E4M3 with the scale 1 / *inverse_scale and written transposed into out_t
/// ([width, rows]): the bytes fp8_quantize_transposed would write from that
/// output, without it. False, launching nothing, on swiglu_fp8_transposed's conditions.
bool rms_norm_fp8_transposed(const void* x, const void* gamma, const float* rstd, int64_t rows, int64_t width,
                             const float* inverse_scale, void* out_t, cudaStream_t stream);

/// Per row of fp32 `logits` ([rows, vocab], contiguous) with target `targets[row]`:
/// loss[row] = logsumexp - logit of the target (NaN for a target outside [0, vocab)), and,
/// unless `grad` is null, grad = softmax - one-hot ([rows, vocab] in `grad_dtype`, Float32 or
/// BFloat16; a Float32 `grad` may be `logits` itself).
void cross_entropy_rows(Dtype grad_dtype, const float* logits, const int64_t* targets, float* loss, void* grad,
                        int64_t rows, int64_t vocab, cudaStream_t stream);

/// The scalars of one AdamW step, in the fp32 they are applied in.
struct AdamWScalars {
  float grad_scale;    ///< the clipping coefficient (1: none)
  float decay_factor;  ///< 1 - lr * weight_decay (1: no decay)
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  ///< sqrt(1 - beta2^step)
  float eps;
  float step_size;  ///< lr / (1 - beta1^step)
};

/// One AdamW step over `n` elements of flat fp32 buffers, in place; unless
/// `compute_bf16` is null, the updated parameters rounded to bf16 there too.
void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, void* compute_bf16, int64_t n,
                const AdamWScalars& scalars, cudaStream_t stream);

/// adamw_step where the moments are bf16 (an optimizer's bf16 state), in
/// one pass: each element's moments widened (exactly), updated as
/// adamw_step updates fp32 ones, and written back rounded as
/// stochastic_round_bf16 rounds element first_index + i of stream
/// `stream_m` (exp_avg) and `stream_v` (exp_avg_sq). The bits of widening
/// copies, adamw_step and two stochastic_round_bf16 passes; 22 bytes an
/// element (with the compute copy) where those move 54.
void adamw_step_bf16_state(float* params, const float* grads, void* exp_avg_bf16, void* exp_avg_sq_bf16,
                           void* compute_bf16, int64_t n, const AdamWScalars& scalars, uint64_t stream_m,
                           uint64_t stream_v, int64_t first_index, cudaStream_t stream);

/// Reproducible mode's fixed-point step over `n` gradient elements, with
/// s = *scale read on the device (so a CUDA graph's replay takes the value
/// of its time): where s != 0, sums[i] += clamp(round_half_even(gradient[i]
/// * s), -limit, limit); always *largest = max(*largest, max |gradient[i]|)
/// (NaN wins). s must be 0 or a power of two, *largest non-negative.
void fixed_point_add(Dtype dtype, const void* gradient, int64_t* sums, int64_t n, const double* scale, double limit,
                     double* largest, cudaStream_t stream);
/// fixed_point_add where each sum is two 32-bit limbs, sum = high[i] 2^32 +
/// low[i] with low[i]'s 32 bits read as unsigned (ExactGradients' limbs):
/// the same sums, bit for bit.
void fixed_point_add_limbs(Dtype dtype, const void* gradient, int32_t* low, int32_t* high, int64_t n,
                           const double* scale, double limit, double* largest, cudaStream_t stream);

/// ExactGradients::reduce's conversion of one group's limb sums (as
/// fixed_point_add_limbs keeps them) to fp32, in place over the low limbs,
/// one launch for all of the group's parameters: parameter k holds elements
/// [starts[k], starts[k + 1]) (starts[0] = 0, `segments` of them, the last
/// running to `n`), and element i becomes fp32(fp64(sum_i) * scales[k]),
/// both roundings to nearest (the CPU path's bits), or +0 where scales[k]
/// is 0 (a parameter with no scale yet). starts and scales on the device.
void fixed_point_limbs_to_float(int32_t* low, const int32_t* high, int64_t n, const int64_t* starts, int segments,
                                const double* scales, cudaStream_t stream);

/// bf16 `dst` = fp32 `src` stochastically rounded (sharding/LowPrecisionState.h's
/// stochastic_round, the same bits): element i's 16 random bits are the hash of
/// (`stream_bits`, first_index + i). Both contiguous, `n` elements.
void stochastic_round_bf16(const float* src, void* dst, int64_t n, uint64_t stream_bits, int64_t first_index,
                           cudaStream_t stream);

/// FP8 quantization of `n` contiguous bf16 values: `out` (n bytes) = E4M3
/// (or E5M2) of x * s, saturating, where s is the power of two that brings
/// max |x| to at most the format's largest finite value (1 for all zeros,
/// NaN when max |x| is not finite); *inverse_scale = 1 / s, on the device.
/// `amax`: one float of device memory; max |x| is computed into it, unless
/// `amax_known` says it holds that already (fp8_amax's result, or that of
/// the kernel that produced x).
void fp8_quantize(const void* x, int64_t n, bool e5m2, void* out, float* amax, bool amax_known, float* inverse_scale,
                  cudaStream_t stream);

/// Rowwise FP8 quantization of a contiguous bf16 [rows, cols] `x`: row r of
/// `out` (laid out as x) = E4M3 (or E5M2) of x[r] * s_r, saturating, where
/// s_r is the power of two fp8_quantize would choose for that row alone;
/// inverse_scales[r] = 1 / s_r (rows floats of device memory). False,
/// launching nothing, when rows exceed the grid (2^31 - 1).
bool fp8_quantize_rows(const void* x, int64_t rows, int64_t cols, bool e5m2, void* out, float* inverse_scales,
                       cudaStream_t stream);

/// The largest magnitude of `n` contiguous bf16 values into *amax (device
/// memory, overwritten; NaN when any value is NaN), for fp8_quantize_transposed.
void fp8_amax(const void* x, int64_t n, float* amax, cudaStream_t stream);

/// E4M3 (or E5M2) of a contiguous bf16 [rows, cols] `x` times s, saturating,
/// written transposed into `out_t` ([cols, rows], contiguous) and, when
/// `out_rows` is not null, also as laid out into `out_rows`. s: from `amax`
/// when not null (fp8_amax's result; the power of two fp8_quantize would
/// choose, its inverse written to *inverse_scale), else 1 / *inverse_scale
/// (a scale computed before for the same values). False, launching nothing,
/// when rows exceed the grid (more than 65535 * 32).
bool fp8_quantize_transposed(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* amax,
                             float* inverse_scale, void* out_t, void* out_rows, cudaStream_t stream);

/// What fp8_gemm_accumulate did: added the product (done), launched nothing
/// because cuBLASLt offers no kernel for these operands (unsupported: the
/// caller computes the product another way), or failed at launch (failed:
/// `d` may be partly written, the step cannot go on).
enum class GemmResult { done, unsupported, failed };

/// d (fp32, row-major [rows, cols], contiguous) += (A B^T) * a_inverse_scale
/// * b_inverse_scale for the row-major FP8 operands a [rows, inner] and b
/// [cols, inner] (E4M3, or E5M2 where the flag says; not both E5M2), the
/// scales device floats; exact accumulation, through cuBLASLt with beta 1.
/// Leading dimensions must be multiples of 16 bytes.
GemmResult fp8_gemm_accumulate(const void* a, bool a_e5m2, const float* a_inverse_scale, const void* b, bool b_e5m2,
                               const float* b_inverse_scale, float* d, int64_t rows, int64_t cols, int64_t inner,
                               cudaStream_t stream);

/// A bf16 GEMM through cuBLASLt (bf16_gemm): row-major d [rows, cols] =
/// A B + beta d, fp32 accumulation. A is [rows, inner], stored so or, with
/// a_transposed, as its transpose [inner, rows]; B is [inner, cols], stored
/// so or, with b_transposed, as [cols, inner]; every operand contiguous.
/// d is bf16 or fp32 (d_fp32); beta 0 never reads it.
struct Bf16Gemm {
  const void* a = nullptr;
  bool a_transposed = false;
  const void* b = nullptr;
  bool b_transposed = false;
  void* d = nullptr;
  bool d_fp32 = false;
  int64_t rows = 0, cols = 0, inner = 0;
  float beta = 0.0f;
  /// At the shape's first call, time up to eight of the heuristic's
  /// algorithms on these operands and keep the fastest whose output has the
  /// bits of the first-ranked one's; needs `scratch` (bf16_gemm_scratch_bytes).
  bool timed = false;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

/// The scratch bytes (device memory, any alignment) a timed `g` needs on
/// `stream` before its call: nonzero only at a timed shape's first eager
/// call (the timing runs there, never while the stream captures a graph):
/// 256 at beta 0 (the candidates then write d, which the call overwrites),
/// one output more where beta reads d.
size_t bf16_gemm_scratch_bytes(const Bf16Gemm& g, cudaStream_t stream);

/// Runs `g` with the algorithm cuBLASLt's heuristic ranks first for its
/// shape, layout and alignment, or with `timed` the fastest of its first
/// eight that writes the first's bits (chosen once per device and kept; a
/// timed call on a capturing stream runs the first and chooses at the next
/// eager call; one without scratch keeps the first), on
/// `stream` with that stream's workspace. unsupported: nothing launched (no
/// algorithm, no handle, or a stream capturing a CUDA graph before its
/// first eager call allocated the workspace); the caller computes it another way.
GemmResult bf16_gemm(const Bf16Gemm& g, cudaStream_t stream);

/// The CUDA error of the last launch as text, or nullptr when there was none.
const char* last_error();

}  // namespace trainer::ops::kernels
