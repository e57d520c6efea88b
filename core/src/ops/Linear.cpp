// linear over stacked weights: one GEMM forward, one for the input gradient
// and one for all weight gradients, as an autograd function; linear_of, the
// same with its input recomputed in backward, as an autograd node.
#include "trainer/ops/Linear.h"

#include <atomic>
#include <functional>

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/version.h>

#include "Dispatch.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/SwiGlu.h"

namespace trainer::ops {

namespace {
std::atomic<bool> g_gradient_fusion{true};
std::atomic<bool> g_lt_gemms{false};
std::atomic<bool> g_lt_gemm_timing{false};
std::atomic<bool> g_fp8_linear{false};
std::atomic<bool> g_fp8_keep_weights_t{true};
std::atomic<bool> g_fp8_rowwise{false};
}  // namespace

bool fp8_rowwise_scaling() { return g_fp8_rowwise.load(); }
void set_fp8_rowwise_scaling(bool rowwise) { g_fp8_rowwise.store(rowwise); }

bool fp8_keeps_transposed_weights() { return g_fp8_keep_weights_t.load(); }
void set_fp8_keeps_transposed_weights(bool keep) { g_fp8_keep_weights_t.store(keep); }

bool gradient_fusion_enabled() { return g_gradient_fusion.load(); }
void set_gradient_fusion(bool enabled) { g_gradient_fusion.store(enabled); }

bool lt_gemms_enabled() { return g_lt_gemms.load(); }
void set_lt_gemms(bool enabled) { g_lt_gemms.store(enabled); }
bool lt_gemm_timing() { return g_lt_gemm_timing.load(); }
void set_lt_gemm_timing(bool timed) { g_lt_gemm_timing.store(timed); }

bool lt_gemm_may_apply(const torch::Tensor& a) {
#ifdef TRAINER_CUDA_KERNELS
  return lt_gemms_enabled() && a.defined() && a.is_cuda() && a.scalar_type() == torch::kBFloat16;
#else
  (void)a;
  return false;
#endif
}

bool lt_gemm(const torch::Tensor& d, const torch::Tensor& a, bool a_t, const torch::Tensor& b, bool b_t, float beta) {
#ifdef TRAINER_CUDA_KERNELS
  if (!lt_gemm_may_apply(a) || b.scalar_type() != torch::kBFloat16 || a.dim() != 2 || b.dim() != 2 || d.dim() != 2 ||
      (d.scalar_type() != torch::kBFloat16 && d.scalar_type() != torch::kFloat32) ||
      (d.scalar_type() == torch::kBFloat16 && beta != 0.0f) || b.device() != a.device() || d.device() != a.device() ||
      !a.is_contiguous() || !b.is_contiguous() || !d.is_contiguous()) {
    return false;
  }
  kernels::Bf16Gemm g;
  g.rows = a_t ? a.size(1) : a.size(0);
  g.inner = a_t ? a.size(0) : a.size(1);
  g.cols = b_t ? b.size(0) : b.size(1);
  if ((b_t ? b.size(1) : b.size(0)) != g.inner || d.size(0) != g.rows || d.size(1) != g.cols) return false;
  g.a = a.data_ptr();
  g.a_transposed = a_t;
  g.b = b.data_ptr();
  g.b_transposed = b_t;
  g.d = d.data_ptr();
  g.d_fp32 = d.scalar_type() == torch::kFloat32;
  g.beta = beta;
  g.timed = lt_gemm_timing();
  const KernelLaunch launch("bf16_gemm", {a, b, d});
  torch::Tensor scratch;  // held until the call returns (the timing synchronizes its stream)
  if (const size_t bytes = kernels::bf16_gemm_scratch_bytes(g, launch.stream()); bytes > 0) {
    try {
      scratch = torch::empty({static_cast<int64_t>(bytes)}, a.options().dtype(torch::kUInt8));
      g.scratch = scratch.data_ptr();
      g.scratch_bytes = bytes;
    } catch (const c10::OutOfMemoryError&) {
      // No room for one more output (the device's memory is what it is):
      // bf16_gemm keeps the heuristic's first algorithm for this shape.
    }
  }
  const kernels::GemmResult result = kernels::bf16_gemm(g, launch.stream());
  if (result == kernels::GemmResult::failed) {
    throw TrainingError("bf16_gemm: cuBLASLt failed to launch a [" + std::to_string(g.rows) + ", " +
                        std::to_string(g.inner) + "] x [" + std::to_string(g.inner) + ", " + std::to_string(g.cols) +
                        "] product");
  }
  return result == kernels::GemmResult::done;
#else
  (void)d, (void)a, (void)a_t, (void)b, (void)b_t, (void)beta;
  return false;
#endif
}

torch::Tensor bound_fp32_gradient(const torch::Tensor& weight) {
  const torch::Tensor& g = weight.grad();
  if (!gradient_fusion_enabled() || !weight.is_leaf() || !g.defined() || g.scalar_type() != torch::kFloat32 ||
      g.sizes() != weight.sizes() || g.device() != weight.device() || !g.is_contiguous()) {
    return torch::Tensor();
  }
  return g;
}

bool fp8_linear_enabled() { return g_fp8_linear.load(); }
void set_fp8_linear(bool enabled) { g_fp8_linear.store(enabled); }
bool fp8_linear_available() {
#ifdef TRAINER_FP8_LINEAR
  return true;
#else
  return false;
#endif
}

#ifdef TRAINER_CUDA_KERNELS
namespace {
struct Fp8AmaxOffer {
  torch::Tensor tensor, amax;
  int64_t version = 0;
};
thread_local Fp8AmaxOffer g_fp8_amax_offer;
}  // namespace

void offer_fp8_amax(const torch::Tensor& t, const torch::Tensor& amax) {
  g_fp8_amax_offer = Fp8AmaxOffer{t, amax, static_cast<int64_t>(t._version())};
}

torch::Tensor take_fp8_amax(const torch::Tensor& t) {
  Fp8AmaxOffer offer = std::move(g_fp8_amax_offer);
  g_fp8_amax_offer = Fp8AmaxOffer{};
  const torch::Tensor& o = offer.tensor;
  const bool same = o.defined() && t.defined() && o.device() == t.device() && o.data_ptr() == t.data_ptr() &&
                    o.numel() == t.numel() && o.is_contiguous() && t.is_contiguous() &&
                    o.scalar_type() == t.scalar_type() && static_cast<int64_t>(t._version()) == offer.version;
  return same ? offer.amax : torch::Tensor();
}
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The tensors stacked along dim 0 as a view when they lie back to back in
// one storage; undefined when they do not.
torch::Tensor adjacent_view(const std::vector<torch::Tensor>& parts) {
  bool adjacent = true;
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const torch::Tensor& p = parts[i];
    adjacent = adjacent && p.is_contiguous() && p.scalar_type() == parts[0].scalar_type() &&
               p.sizes().slice(1) == parts[0].sizes().slice(1) && p.storage().is_alias_of(parts[0].storage()) &&
               p.storage_offset() == parts[0].storage_offset() + parts[0].numel() / parts[0].size(0) * rows;
    rows += p.size(0);
  }
  if (!adjacent) return torch::Tensor();
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[0] = rows;
  return parts[0].as_strided(sizes, parts[0].strides());
}

// The tensors stacked along dim 0: a view when they lie back to back in one
// storage (no copy, and zero3's re-gathered storage is seen through it),
// otherwise a concatenated copy.
// `in_place` (when given): whether the result is that view.
torch::Tensor stacked(const std::vector<torch::Tensor>& parts, bool* in_place = nullptr) {
  torch::Tensor view = adjacent_view(parts);
  if (in_place != nullptr) *in_place = view.defined();
  return view.defined() ? view : torch::cat(parts, 0);
}

}  // namespace

// Where the weight-gradient GEMM can add into the weights' gradients itself
// (as Megatron's gradient-accumulation fusion does): bf16 operands on CUDA,
// every weight's .grad bound to an fp32 buffer of its shape (the strategies
// bind them) and those buffers back to back. The GEMM then accumulates
// dY^T X in fp32 straight into them (C = A B + C, fp32 C), where otherwise it
// writes a bf16 [out, in] result that autograd reads again and widens into
// the fp32 buffer: 12 bytes per weight element and a kernel less, and no
// bf16 rounding of each micro-step's weight gradient. Undefined when not.
torch::Tensor fused_gradient_target(const std::vector<torch::Tensor>& weights, const torch::Tensor& dy) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  if (!dy.is_cuda() || dy.scalar_type() != torch::kBFloat16) return torch::Tensor();
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& w : weights) {
    torch::Tensor g = bound_fp32_gradient(w);
    if (!g.defined()) return torch::Tensor();
    grads.push_back(std::move(g));
  }
  return adjacent_view(grads);
#else
  (void)weights, (void)dy;
  return torch::Tensor();
#endif
}

namespace {

// FP8 (fp8_linear_enabled): a tensor in E4M3 or E5M2 and the inverse of
// its scale (x = data * inverse_scale up to the cast's rounding), a device
// scalar: nothing waits for the host.
struct Fp8Tensor {
  torch::Tensor data, inverse_scale;
};

#ifdef TRAINER_FP8_LINEAR
// The amax for a cast of `x`: the one a kernel offered for it (`known`),
// else a device float for the cast's own pass to fill.
struct CastAmax {
  torch::Tensor amax;
  bool known = false;
};
CastAmax cast_amax(const torch::Tensor& x) {
  const torch::Tensor offered = take_fp8_amax(x);
  if (offered.defined()) return CastAmax{offered, true};
  return CastAmax{torch::empty({1}, x.options().dtype(torch::kFloat32)), false};
}

// With `amax` (a device float, the largest magnitude of t found before), no pass for it.
Fp8Tensor quantize(const torch::Tensor& t, bool e5m2, const torch::Tensor& amax = torch::Tensor()) {
  const torch::Tensor x = t.contiguous();
  const CastAmax a = amax.defined() ? CastAmax{amax, true} : cast_amax(x);
  KernelLaunch launch("fp8_quantize", {x, a.amax});
  Fp8Tensor q;
  q.data = torch::empty(x.sizes(), x.options().dtype(e5m2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn));
  // The scale an allocation of its own: cuBLASLt takes scale pointers aligned as allocations are.
  q.inverse_scale = torch::empty({}, x.options().dtype(torch::kFloat32));
  kernels::fp8_quantize(x.data_ptr(), x.numel(), e5m2, q.data.data_ptr(), a.amax.data_ptr<float>(), a.known,
                        q.inverse_scale.data_ptr<float>(), launch.stream());
  check_launch("fp8_quantize");
  return q;
}

// A bf16 [rows, cols] `t` cast with one scale per row (fp8_rowwise_scaling):
// the inverse scales as the scaled GEMM takes a row-major operand's, [rows, 1].
Fp8Tensor quantize_rows(const torch::Tensor& t, bool e5m2) {
  const torch::Tensor x = t.contiguous();
  Fp8Tensor q;
  q.data = torch::empty(x.sizes(), x.options().dtype(e5m2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn));
  q.inverse_scale = torch::empty({x.size(0), 1}, x.options().dtype(torch::kFloat32));
  KernelLaunch launch("fp8_quantize_rows", {x, q.data, q.inverse_scale});
  TORCH_CHECK(kernels::fp8_quantize_rows(x.data_ptr(), x.size(0), x.size(1), e5m2, q.data.data_ptr(),
                                         q.inverse_scale.data_ptr<float>(), launch.stream()),
              "fp8_quantize_rows: ", x.size(0), " rows exceed the kernel's grid");
  check_launch("fp8_quantize_rows");
  return q;
}
#endif

// Whether a [rows, inner] x [inner, cols] product runs in FP8: the scaled
// GEMM takes bf16 inputs' dimensions in multiples of 16.
bool fp8_fits(const torch::Tensor& a, int64_t rows, int64_t inner, int64_t cols) {
#ifdef TRAINER_FP8_LINEAR
  return fp8_linear_enabled() && a.is_cuda() && a.scalar_type() == torch::kBFloat16 && rows % 16 == 0 &&
         inner % 16 == 0 && cols % 16 == 0 && rows > 0;
#else
  (void)a, (void)rows, (void)inner, (void)cols;
  return false;
#endif
}

// y = x W^T + b in the compute dtype: without a bias through the
// project's cuBLASLt call where it applies (lt_gemm), else LibTorch's linear.
torch::Tensor plain_product(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined() && lt_gemm_may_apply(x) && x.is_contiguous() && w.dim() == 2 && x.dim() >= 1 &&
      x.size(-1) == w.size(1)) {
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    torch::Tensor y = torch::empty(sizes, x.options());
    if (lt_gemm(y.view({-1, w.size(0)}), x.view({-1, w.size(1)}), false, w, /*b_t=*/true, 0.0f)) return y;
  }
  return torch::linear(x, w, b);
}

// dY W ([rows, out] x [out, in]) through lt_gemm where it applies, else LibTorch's mm.
torch::Tensor input_gradient(const torch::Tensor& dy, const torch::Tensor& w) {
  if (lt_gemm_may_apply(dy) && dy.is_contiguous() && w.dim() == 2 && dy.size(1) == w.size(0)) {
    torch::Tensor dx = torch::empty({dy.size(0), w.size(1)}, dy.options());
    if (lt_gemm(dx, dy, false, w, false, 0.0f)) return dx;
  }
  return dy.mm(w);
}

// y = x W^T + b: in FP8 where fp8_fits (E4M3 both, the GEMM's fast
// accumulation as the forward's is in the field's FP8 recipes), else LibTorch's linear.
// In FP8, `scales` (when given) receives x's and W's scales, for the backward.
// With `keep_w_t` (and scales), W is cast in both layouts by one pass and
// the transposed cast kept in scales->w_t, for the input gradient (see
// fp8_keeps_transposed_weights).
struct Fp8Scales {
  torch::Tensor x, w;    // the inverse scales; undefined where the product did not run in FP8 per tensor
  torch::Tensor w_t;     // W's transposed E4M3 cast with scale w, where kept
  bool rowwise = false;  // the product ran in FP8 with one scale per row (x, w undefined)
};
#ifdef TRAINER_FP8_LINEAR
Fp8Tensor quantize_both(const torch::Tensor& t, bool e5m2, torch::Tensor* transposed, bool rows,
                        torch::Tensor* amax_out = nullptr);
#endif

// Fp8WeightReuse's entries: a forward's transposed cast of weights used in
// place, with their largest magnitude, kept while a scope is open.
struct KeptWeightCast {
  torch::Tensor weights;  // the stacked weights (a view of their storage, which it keeps from reuse)
  int64_t version = 0;    // their version counter when cast
  torch::Tensor amax, w_t;
  Fp8Tensor w;  // the cast as laid out, where the scope keeps it too (Fp8WeightReuse::Keep::both)
};
struct WeightReuse {
  bool open = false;
  bool both = false;  // keep the cast as laid out as well
  std::vector<KeptWeightCast> kept;
};
thread_local WeightReuse g_weight_reuse;
std::atomic<int64_t> g_weight_casts_reused{0};

#ifdef TRAINER_FP8_LINEAR
bool same_tensor(const torch::Tensor& a, const torch::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.device() == b.device() && a.scalar_type() == b.scalar_type() &&
         a.sizes() == b.sizes() && a.strides() == b.strides();
}

// The entry kept for `w`, or null: no scope open, none made, or w written since (its version counter).
const KeptWeightCast* kept_weight_cast(const torch::Tensor& w) {
  if (!g_weight_reuse.open) return nullptr;
  for (const KeptWeightCast& k : g_weight_reuse.kept) {
    if (same_tensor(k.weights, w)) return k.version == static_cast<int64_t>(w._version()) ? &k : nullptr;
  }
  return nullptr;
}

void keep_weight_cast(const torch::Tensor& w, const torch::Tensor& amax, const torch::Tensor& w_t,
                      const Fp8Tensor& wq) {
  if (!g_weight_reuse.open || !amax.defined() || !w_t.defined()) return;
  KeptWeightCast entry{w, static_cast<int64_t>(w._version()), amax, w_t, g_weight_reuse.both ? wq : Fp8Tensor{}};
  for (KeptWeightCast& k : g_weight_reuse.kept) {
    if (same_tensor(k.weights, w)) {  // written since its entry was made
      k = std::move(entry);
      return;
    }
  }
  g_weight_reuse.kept.push_back(std::move(entry));
}
#endif

// `reusable`: w is the weights themselves or a view of their storage (not a
// copy), so that its cast may be kept for the step (Fp8WeightReuse).
torch::Tensor product(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                      Fp8Scales* scales = nullptr, bool keep_w_t = false, bool reusable = false) {
  const int64_t inner = w.size(1), cols = w.size(0), rows = inner > 0 ? x.numel() / inner : 0;
  if (!fp8_fits(x, rows, inner, cols) || w.scalar_type() != torch::kBFloat16) return plain_product(x, w, b);
#ifdef TRAINER_FP8_LINEAR
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = cols;
  const auto bias = b.defined() ? std::optional<torch::Tensor>(b) : std::nullopt;
  if (fp8_rowwise_scaling()) {
    // A scale per token of x and per output channel of W (W's rows: the
    // scaled GEMM takes them as a [1, cols] row for its column-major operand).
    const Fp8Tensor xq = quantize_rows(x.reshape({rows, inner}), false);
    const Fp8Tensor wq = quantize_rows(w, false);
    const torch::Tensor y = at::_scaled_mm(xq.data, wq.data.t(), xq.inverse_scale, wq.inverse_scale.view({1, cols}),
                                           bias, std::nullopt, torch::kBFloat16, /*use_fast_accum=*/true);
    if (scales != nullptr) *scales = Fp8Scales{torch::Tensor(), torch::Tensor(), torch::Tensor(), true};
    return y.view(sizes);
  }
  torch::Tensor w_t;
  const Fp8Tensor xq = quantize(x.reshape({rows, inner}), false);
  Fp8Tensor wq;
  const bool keep = keep_w_t && scales != nullptr;
  const KeptWeightCast* kept = keep && reusable ? kept_weight_cast(w) : nullptr;
  if (kept != nullptr) {
    // Cast this step already: the cast as laid out where kept too, else
    // only the layout this GEMM reads, with the scale found then.
    wq = kept->w.data.defined() ? kept->w : quantize(w, false, kept->amax);
    w_t = kept->w_t;
    g_weight_casts_reused.fetch_add(1);
  } else if (keep) {
    torch::Tensor amax;
    wq = quantize_both(w, false, &w_t, /*rows=*/true, &amax);
    if (reusable) keep_weight_cast(w, amax, w_t, wq);
  } else {
    wq = quantize(w, false);
  }
  // The scaled GEMM takes its second operand column-major: W^T of a row-major W is.
  const torch::Tensor y = at::_scaled_mm(xq.data, wq.data.t(), xq.inverse_scale, wq.inverse_scale, bias, std::nullopt,
                                         torch::kBFloat16, /*use_fast_accum=*/true);
  if (scales != nullptr) *scales = Fp8Scales{xq.inverse_scale, wq.inverse_scale, w_t};
  return y.view(sizes);
#else
  (void)scales, (void)keep_w_t, (void)reusable;
  return torch::Tensor();
#endif
}

// Whether a forward keeps W's transposed FP8 cast: FP8 on, some weight wants its gradient.
bool keeps_w_t(const std::vector<torch::Tensor>& weights) {
  if (!fp8_linear_enabled() || fp8_rowwise_scaling() || !fp8_keeps_transposed_weights()) return false;
  for (const torch::Tensor& w : weights) {
    if (w.requires_grad()) return true;
  }
  return false;
}

#ifdef TRAINER_FP8_LINEAR
// A contiguous bf16 [rows, cols] `t` cast transposed ([cols, rows]) for the
// scaled GEMM's column-major operand, with the scale `inverse_scale` holds
// (computed before for the same values).
torch::Tensor quantize_transposed(const torch::Tensor& t, bool e5m2, const torch::Tensor& inverse_scale) {
  const torch::Tensor x = t.contiguous();
  const torch::Tensor out =
      torch::empty({x.size(1), x.size(0)}, x.options().dtype(e5m2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn));
  KernelLaunch launch("fp8_quantize_transposed", {x, inverse_scale, out});
  TORCH_CHECK(
      kernels::fp8_quantize_transposed(x.data_ptr(), x.size(0), x.size(1), e5m2, nullptr,
                                       inverse_scale.data_ptr<float>(), out.data_ptr(), nullptr, launch.stream()),
      "fp8_quantize_transposed: ", x.size(0), " rows exceed the kernel's grid");
  check_launch("fp8_quantize_transposed");
  return out;
}

// A contiguous bf16 [rows, cols] `t` cast with a scale of its own,
// transposed (*transposed) and, with `rows`, also as laid out (the result's
// data; undefined without): one pass for the largest magnitude (none where
// the kernel that wrote t offered it), one that reads t once and writes both.
Fp8Tensor quantize_both(const torch::Tensor& t, bool e5m2, torch::Tensor* transposed, bool rows,
                        torch::Tensor* amax_out) {
  const torch::Tensor x = t.contiguous();
  const auto fp8 = x.options().dtype(e5m2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn);
  Fp8Tensor q;
  if (rows) q.data = torch::empty(x.sizes(), fp8);
  *transposed = torch::empty({x.size(1), x.size(0)}, fp8);
  const CastAmax a = cast_amax(x);
  q.inverse_scale = torch::empty({}, x.options().dtype(torch::kFloat32));
  KernelLaunch launch("fp8_quantize_both", {x, q.data, *transposed, a.amax});
  if (!a.known) kernels::fp8_amax(x.data_ptr(), x.numel(), a.amax.data_ptr<float>(), launch.stream());
  TORCH_CHECK(kernels::fp8_quantize_transposed(x.data_ptr(), x.size(0), x.size(1), e5m2, a.amax.data_ptr<float>(),
                                               q.inverse_scale.data_ptr<float>(), transposed->data_ptr(),
                                               rows ? q.data.data_ptr() : nullptr, launch.stream()),
              "fp8_quantize_transposed: ", x.size(0), " rows exceed the kernel's grid");
  check_launch("fp8_quantize_both");
  if (amax_out != nullptr) *amax_out = a.amax;
  return q;
}
#endif

// The gradients of y = x W^T + b where the forward ran in FP8 (its scales
// `scales`), all three products scaled GEMMs: dY in E5M2 for its range
// (cast once, read once, laid out both ways, or only transposed when dx is
// not wanted), x and W in E4M3 with the forward's scales (the values have
// not changed since), exact accumulation.
// dx = dY W when `need_dx`; the weight gradient dY^T x added in fp32 into
// `into` when defined (see fused_gradient_target), else returned in bf16.
// `x_t_given`, when defined, is x's transposed cast already made (and x is
// not read).
// `x_t_from_dx`, when given (with need_dx, and no x_t_given): makes x's
// transposed cast from dx once dx exists, for a caller whose pass over dx
// also reads what x is computed from.
// Undefined tensors where the build has no scaled GEMM (never called then).
struct Fp8Grads {
  torch::Tensor dx, dw;
};
using TransposedFromDx = std::function<torch::Tensor(const torch::Tensor& dx)>;
Fp8Grads fp8_backward(const torch::Tensor& dy, const torch::Tensor& x, const torch::Tensor& w, const Fp8Scales& scales,
                      bool need_dx, const torch::Tensor& into, const torch::Tensor& x_t_given,
                      const TransposedFromDx& x_t_from_dx) {
  Fp8Grads g;
#ifdef TRAINER_FP8_LINEAR
  torch::Tensor dy_t;
  const Fp8Tensor dyq = quantize_both(dy, true, &dy_t, /*rows=*/need_dx);
  if (need_dx) {
    // W as the column-major [out, in] operand: W^T laid out row-major.
    const torch::Tensor w_t = scales.w_t.defined() ? scales.w_t : quantize_transposed(w, false, scales.w);
    g.dx = at::_scaled_mm(dyq.data, w_t.t(), dyq.inverse_scale, scales.w, std::nullopt, std::nullopt, torch::kBFloat16,
                          /*use_fast_accum=*/false);
  }
  // dW = dY^T x: dY^T row-major, x as the column-major [tokens, in] operand (x^T laid out row-major).
  const torch::Tensor x_t = x_t_given.defined()      ? x_t_given
                            : need_dx && x_t_from_dx ? x_t_from_dx(g.dx)
                                                     : quantize_transposed(x, false, scales.x);
  if (into.defined()) {
    // The GEMM adds into the accumulator itself (beta 1); an fp32 product
    // added by a second pass only where cuBLASLt offers no kernel for it.
    // (fused_gradient_target's views are contiguous, as the GEMM writes them.)
    const KernelLaunch launch("fp8_gemm_accumulate", {dy_t, x_t, into, dyq.inverse_scale, scales.x});
    const kernels::GemmResult added = kernels::fp8_gemm_accumulate(
        dy_t.data_ptr(), true, dyq.inverse_scale.data_ptr<float>(), x_t.data_ptr(), false, scales.x.data_ptr<float>(),
        into.data_ptr<float>(), dy_t.size(0), x_t.size(0), dy_t.size(1), launch.stream());
    if (added == kernels::GemmResult::failed) {
      throw TrainingError("fp8_gemm_accumulate: cuBLASLt failed to add a weight gradient of " +
                          std::to_string(into.size(0)) + " x " + std::to_string(into.size(1)) + " into its buffer");
    }
    if (added == kernels::GemmResult::unsupported) {
      torch::NoGradGuard no_grad;
      into.add_(at::_scaled_mm(dy_t, x_t.t(), dyq.inverse_scale, scales.x, std::nullopt, std::nullopt, torch::kFloat32,
                               /*use_fast_accum=*/false));
    }
  } else {
    g.dw = at::_scaled_mm(dy_t, x_t.t(), dyq.inverse_scale, scales.x, std::nullopt, std::nullopt, torch::kBFloat16,
                          /*use_fast_accum=*/false);
  }
#else
  (void)dy, (void)x, (void)w, (void)scales, (void)need_dx, (void)into, (void)x_t_given, (void)x_t_from_dx;
#endif
  return g;
}

// Whether the backward of a product whose forward gave `scales` runs in FP8
// for the output gradient `dy` ([rows, out]).
bool fp8_backward_applies(const torch::Tensor& dy, const torch::Tensor& w, const Fp8Scales& scales) {
  return !scales.rowwise && scales.w.defined() && scales.x.defined() && fp8_fits(dy, dy.size(0), w.size(0), w.size(1));
}

// dx = dY W for a product whose forward ran in FP8 per row, where the
// scaled GEMM takes it (else undefined): dY in E5M2 with a scale per token,
// W in E4M3 with one per input channel (W^T's rows), exact accumulation.
torch::Tensor rowwise_input_gradient(const torch::Tensor& dy, const torch::Tensor& w, const Fp8Scales& scales) {
  if (!scales.rowwise || !fp8_fits(dy, dy.size(0), w.size(0), w.size(1))) return torch::Tensor();
#ifdef TRAINER_FP8_LINEAR
  const Fp8Tensor dyq = quantize_rows(dy, true);
  const Fp8Tensor wq = quantize_rows(w.t(), false);  // [in, out]: the column-major [out, in] operand
  return at::_scaled_mm(dyq.data, wq.data.t(), dyq.inverse_scale, wq.inverse_scale.view({1, w.size(1)}), std::nullopt,
                        std::nullopt, torch::kBFloat16, /*use_fast_accum=*/false);
#else
  (void)dy, (void)w;
  return torch::Tensor();
#endif
}

// The gradients of y = x W^T + b for stacked W: dx (when wanted) and one
// weight and bias gradient per stacked tensor, as views of one GEMM's result.
struct LinearGrads {
  torch::Tensor dx;
  torch::autograd::variable_list weights, biases;
};

// A node's outputs end with the product's gradients: each weight's, then each bias's.
void append_product_gradients(torch::autograd::variable_list& out, const LinearGrads& g) {
  out.insert(out.end(), g.weights.begin(), g.weights.end());
  out.insert(out.end(), g.biases.begin(), g.biases.end());
}

// `weights`: the stacked tensors themselves (their .grad may take the
// weight gradient in place, see fused_gradient_target; their gradients are
// then returned undefined, and autograd adds nothing).
// `scales`: the forward's FP8 scales; undefined where it ran in bf16.
// `x_t`: x's transposed FP8 cast, made by the caller where the backward
// runs in FP8 per tensor (fp8_backward_applies); x is then not read and may
// be undefined. `x_t_from_dx`: the same, made from dx (see fp8_backward).
// `x_from_dx`: otherwise (bf16, or FP8 per row, whose weight gradient is
// bf16), where x is undefined, x itself made from dx (between the input-
// and the weight-gradient GEMMs; see swiglu_backward_bf16).
LinearGrads linear_backward(const torch::Tensor& dy_in, const torch::Tensor& x, const torch::Tensor& w,
                            const std::vector<torch::Tensor>& weights, bool with_bias, bool need_dx,
                            const Fp8Scales& scales, const torch::Tensor& x_t = torch::Tensor(),
                            const TransposedFromDx& x_t_from_dx = nullptr,
                            const TransposedFromDx& x_from_dx = nullptr) {
  LinearGrads out;
  const torch::Tensor dy = dy_in.reshape({-1, w.size(0)});
  std::vector<int64_t> x_sizes = dy_in.sizes().vec();  // x's: y = x W^T has x's leading dimensions
  x_sizes.back() = w.size(1);
  torch::Tensor into = fused_gradient_target(weights, dy);
  torch::Tensor dw;
  if (fp8_backward_applies(dy, w, scales)) {
    const bool x_given = x_t.defined() || (need_dx && x_t_from_dx);
    Fp8Grads g = fp8_backward(dy, x_given ? torch::Tensor() : x.reshape({-1, w.size(1)}), w, scales, need_dx, into, x_t,
                              x_t_from_dx);
    if (need_dx) out.dx = g.dx.view(x_sizes);
    dw = g.dw;  // undefined when added into `into`
  } else {
    TORCH_CHECK(x.defined() || (need_dx && x_from_dx),
                "linear backward: the input was not kept for a product "
                "outside per-tensor FP8");
    if (need_dx) {
      // Per row in FP8 where the forward ran so; the weight gradient below stays bf16.
      const torch::Tensor rowwise = rowwise_input_gradient(dy, w, scales);
      out.dx = (rowwise.defined() ? rowwise : input_gradient(dy, w)).view(x_sizes);
    }
    const torch::Tensor x2 = (x.defined() ? x : x_from_dx(out.dx)).reshape({-1, w.size(1)});
    if (into.defined()) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
      torch::NoGradGuard no_grad;
      if (!lt_gemm(into, dy, /*a_t=*/true, x2, /*b_t=*/false, /*beta=*/1.0f)) {
        at::addmm_out(into, into, dy.t(), x2, torch::kFloat32);
      }
#endif
    } else {
      dw = dy.t().mm(x2);
    }
  }
  const torch::Tensor db = with_bias ? dy.sum(0) : torch::Tensor();
  int64_t offset = 0;
  for (const torch::Tensor& weight : weights) {
    const int64_t r = weight.size(0);
    out.weights.push_back(dw.defined() ? dw.narrow(0, offset, r) : torch::Tensor());
    if (with_bias) out.biases.push_back(db.narrow(0, offset, r));
    offset += r;
  }
  return out;
}

struct StackedLinearFunction : torch::autograd::Function<StackedLinearFunction> {
  // The lists arrive as TensorList so that autograd sees each tensor in them as an input.
  // `keep_w_t`: see product (false where nothing will run backward: under no_grad).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases, bool keep_w_t) {
    bool in_place = false;
    const torch::Tensor w = stacked(weights.vec(), &in_place);
    const torch::Tensor b = biases.empty() ? torch::Tensor() : stacked(biases.vec());
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    ctx->saved_data["weights"] = weights.vec();  // the parameters themselves, for their .grad
    ctx->saved_data["biases"] = static_cast<int64_t>(biases.size());
    Fp8Scales scales;
    const torch::Tensor y = product(x, w, b, &scales, keep_w_t, in_place);
    ctx->saved_data["x_scale"] = scales.x;
    ctx->saved_data["w_scale"] = scales.w;
    ctx->saved_data["w_t"] = scales.w_t;
    ctx->saved_data["rowwise"] = scales.rowwise;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor w = ctx->saved_data["w"].toTensor();
    LinearGrads g =
        linear_backward(grads[0], x, w, ctx->saved_data["weights"].toTensorVector(),
                        ctx->saved_data["biases"].toInt() > 0, ctx->needs_input_grad(0),
                        Fp8Scales{ctx->saved_data["x_scale"].toTensor(), ctx->saved_data["w_scale"].toTensor(),
                                  ctx->saved_data["w_t"].toTensor(), ctx->saved_data["rowwise"].toBool()});
    ctx->saved_data["w_t"] = torch::Tensor();  // a second backward (retain_graph) casts again
    // One gradient per input, in order: x, then each weight, then each bias, then none for keep_w_t.
    variable_list out{g.dx};
    append_product_gradients(out, g);
    out.emplace_back();
    return out;
  }
};

// What linear_of knows of its f beyond the function: nothing (general),
// that it is swiglu (swiglu_linear), or that it is rms_norm with `weight`
// (f's one parameter) and `eps` (norm_linear), whose forward ran the
// project's kernels where `rstd` (each row's reciprocal RMS) is defined.
struct KnownInput {
  enum class Kind { general, swiglu, rms_norm } kind = Kind::general;
  torch::Tensor weight, rstd;
  double eps = 0.0;
};

// Inputs, in edge order: s, each of f's parameters, each weight, each bias.
// `known`: see swiglu_fp8_backward and norm_backward.
class LinearOfBackward final : public torch::autograd::Node {
 public:
  LinearOfBackward(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params, torch::Tensor w,
                   std::vector<torch::Tensor> weights, bool with_bias, Fp8Scales scales, KnownInput known)
      : f_(std::move(f)),
        s_(s, /*is_output=*/false),
        w_(std::move(w)),
        scales_(std::move(scales)),
        weights_(std::move(weights)),
        with_bias_(with_bias),
        known_(std::move(known)) {
    for (const torch::Tensor& p : f_params) params_.emplace_back(p, /*is_output=*/false);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const torch::Tensor s_saved = s_.unpack();
    torch::autograd::variable_list fused;
    if (known_.kind == KnownInput::Kind::swiglu && swiglu_fp8_backward(s_saved, grads[0], &fused)) return fused;
    if (known_.kind == KnownInput::Kind::swiglu && swiglu_backward_bf16(s_saved, grads[0], &fused)) return fused;
    if (known_.kind == KnownInput::Kind::rms_norm && known_.rstd.defined()) return norm_backward(s_saved, grads[0]);
    const torch::Tensor s = s_saved.detach().requires_grad_(s_saved.requires_grad());
    std::vector<torch::Tensor> params;
    for (torch::autograd::SavedVariable& p : params_) params.push_back(p.unpack().detach().requires_grad_(true));
    torch::Tensor h;
    {
      torch::AutoGradMode enable(true);
      h = f_(s, params);
    }
    LinearGrads g = linear_backward(grads[0], h.detach(), w_, weights_, with_bias_, /*need_dx=*/true, scales_);
    std::vector<torch::Tensor> wanted;
    if (s.requires_grad()) wanted.push_back(s);
    wanted.insert(wanted.end(), params.begin(), params.end());
    torch::autograd::variable_list through_f;
    if (!wanted.empty() && h.requires_grad()) {
      through_f = torch::autograd::grad({h}, wanted, {g.dx}, /*retain_graph=*/false, /*create_graph=*/false,
                                        /*allow_unused=*/true);
    }
    torch::autograd::variable_list out;
    size_t next = 0;
    out.push_back(s.requires_grad() && next < through_f.size() ? through_f[next++] : torch::Tensor());
    for (size_t i = 0; i < params.size(); ++i)
      out.push_back(next < through_f.size() ? through_f[next++] : torch::Tensor());
    append_product_gradients(out, g);
    return out;
  }

  // The backward where f is swiglu and the product runs in FP8: the
  // weight gradient's transposed FP8 operand straight from s (SwiGLU's
  // input) with the forward's scale; f's output is never written. Where s
  // wants its gradient, one kernel reads s and the product's input
  // gradient once and writes both s's gradient and that operand (between
  // the input- and the weight-gradient GEMMs). The same kernels' bytes and
  // scales as the general path (OpsGpu.SwiGluLinearGivesTheBitsOfLinearOf).
  // False, having done nothing, where the general path is to run.
  bool swiglu_fp8_backward(const torch::Tensor& s_saved, const torch::Tensor& dy, torch::autograd::variable_list* out) {
#ifdef TRAINER_FP8_LINEAR
    const int64_t width = w_.size(1);
    if (!fp8_backward_applies(dy.reshape({-1, w_.size(0)}), w_, scales_) || s_saved.scalar_type() != torch::kBFloat16 ||
        s_saved.size(-1) != 2 * width) {
      return false;
    }
    const torch::Tensor gate_up = s_saved.detach().contiguous();
    const int64_t rows = gate_up.numel() / (2 * width);
    const torch::Tensor x_t = torch::empty({width, rows}, gate_up.options().dtype(at::kFloat8_e4m3fn));
    if (!kernels::transposed_cast_fits(rows, width, gate_up.data_ptr(), x_t.data_ptr())) return false;
    const bool need_ds = s_saved.requires_grad();
    LinearGrads g;
    torch::Tensor ds;
    if (need_ds) {
      const TransposedFromDx fused = [&](const torch::Tensor& dh) {
        ds = swiglu_gradient_with_cast(gate_up, dh.contiguous(), x_t);
        return x_t;
      };
      g = linear_backward(dy, torch::Tensor(), w_, weights_, with_bias_, /*need_dx=*/true, scales_, torch::Tensor(),
                          fused);
    } else {
      const KernelLaunch launch("swiglu_fp8_transposed", {gate_up, scales_.x, x_t});
      TORCH_CHECK(kernels::swiglu_fp8_transposed(gate_up.data_ptr(), rows, width, scales_.x.data_ptr<float>(),
                                                 x_t.data_ptr(), launch.stream()),
                  "swiglu_fp8_transposed refused operands transposed_cast_fits took");
      check_launch("swiglu_fp8_transposed");
      g = linear_backward(dy, torch::Tensor(), w_, weights_, with_bias_, /*need_dx=*/false, scales_, x_t);
    }
    out->push_back(ds);
    append_product_gradients(*out, g);
    return true;
#else
    (void)s_saved, (void)dy, (void)out;
    return false;
#endif
  }

  // The backward where f is swiglu and the product runs outside per-tensor
  // FP8 on the project's kernels (bf16, or FP8 per row, whose weight
  // gradient is bf16): the input-gradient GEMM first, then one kernel reads
  // s and that gradient once and writes s's gradient and f's output (the
  // forward's bits), which the weight-gradient GEMM reads; the general path
  // reads s twice (f again, then its backward) and runs autograd between.
  // The same kernels' bits (OpsGpu.SwiGluLinearGivesTheBitsOfLinearOf).
  // False, having done nothing, where the general path is to run.
  bool swiglu_backward_bf16(const torch::Tensor& s_saved, const torch::Tensor& dy,
                            torch::autograd::variable_list* out) {
#ifdef TRAINER_CUDA_KERNELS
    const int64_t width = w_.size(1);
    if (!s_saved.requires_grad() || !use_kernels(s_saved) || s_saved.size(-1) != 2 * width ||
        s_saved.scalar_type() != w_.scalar_type() || fp8_backward_applies(dy.reshape({-1, w_.size(0)}), w_, scales_)) {
      return false;
    }
    const torch::Tensor gate_up = s_saved.detach().contiguous();
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() = width;
    torch::Tensor h = torch::empty(sizes, gate_up.options());
    torch::Tensor ds;
    const TransposedFromDx fused = [&](const torch::Tensor& dh) {
      ds = swiglu_gradient(gate_up, dh, h);
      return h;
    };
    LinearGrads g = linear_backward(dy, torch::Tensor(), w_, weights_, with_bias_, /*need_dx=*/true, scales_,
                                    torch::Tensor(), nullptr, fused);
    out->push_back(ds);
    append_product_gradients(*out, g);
    return true;
#else
    (void)s_saved, (void)dy, (void)out;
    return false;
#endif
  }

#ifdef TRAINER_FP8_LINEAR
  // s's gradient as swiglu_gradient computes it (its amax offered alike),
  // and into x_t the forward's output cast transposed with the forward's
  // scale, as swiglu_fp8_transposed writes it: one kernel, one read of s
  // and dh.
  torch::Tensor swiglu_gradient_with_cast(const torch::Tensor& gate_up, const torch::Tensor& dh,
                                          const torch::Tensor& x_t) {
    const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * width);
    torch::Tensor d_gate_up = torch::empty_like(gate_up);
    const torch::Tensor amax = fp8_amax_buffer(gate_up);
    const KernelLaunch launch("swiglu_backward_fp8_transposed", {gate_up, dh, d_gate_up, scales_.x, x_t});
    if (!kernels::swiglu_backward_fp8_transposed(gate_up.data_ptr(), dh.data_ptr(), d_gate_up.data_ptr(), rows, width,
                                                 scales_.x.data_ptr<float>(), x_t.data_ptr(),
                                                 amax.defined() ? amax.data_ptr<float>() : nullptr, launch.stream())) {
      // Only an unaligned dh: the two kernels, as the unfused path runs them.
      TORCH_CHECK(kernels::swiglu_fp8_transposed(gate_up.data_ptr(), rows, width, scales_.x.data_ptr<float>(),
                                                 x_t.data_ptr(), launch.stream()),
                  "swiglu_fp8_transposed refused operands transposed_cast_fits took");
      check_launch("swiglu_fp8_transposed");
      return swiglu_gradient(gate_up, dh);
    }
    check_launch("swiglu_backward_fp8_transposed");
    if (amax.defined()) offer_fp8_amax(d_gate_up, amax);  // the gate/up projection's gradient cast reads it next
    return d_gate_up;
  }
#endif

  // The backward where f is rms_norm and its forward ran the project's
  // kernels: f's output is never kept, and is computed again only where the
  // product runs in bf16 (from the saved reciprocal RMS in FP8: the weight
  // gradient's transposed E4M3 operand straight from s). The norm's weight
  // gradient goes into its bound fp32 buffer, as the weights' do. The same
  // kernels and bits as the general path (OpsGpu.NormLinearGivesTheBitsOfLinearOf).
  torch::autograd::variable_list norm_backward(const torch::Tensor& s_saved, const torch::Tensor& dy) {
    torch::autograd::variable_list out;
#ifdef TRAINER_CUDA_KERNELS
    const torch::Tensor s = s_saved.detach();
    torch::Tensor h, x_t;
#ifdef TRAINER_FP8_LINEAR
    if (fp8_backward_applies(dy.reshape({-1, w_.size(0)}), w_, scales_)) {
      x_t = rms_norm_fp8_transposed(s, known_.weight, known_.rstd, scales_.x);
    }
#endif
    if (!x_t.defined()) h = rms_norm_forward(s, known_.weight, known_.eps).y;
    LinearGrads g = linear_backward(dy, h, w_, weights_, with_bias_, /*need_dx=*/true, scales_, x_t);
    h = torch::Tensor();
    const RmsNormGrads n = rms_norm_gradients(g.dx, s, known_.weight, known_.rstd);
    out.push_back(s_saved.requires_grad() ? n.dx.view(s.sizes()) : torch::Tensor());
    out.push_back(n.dweight);
    append_product_gradients(out, g);
#else
    (void)s_saved, (void)dy;
#endif
    return out;
  }

  void release_variables() override {
    s_.reset_data();
    for (torch::autograd::SavedVariable& p : params_) p.reset_data();
    w_ = torch::Tensor();
    scales_ = Fp8Scales{};
    weights_.clear();
    known_ = KnownInput{};
  }

 private:
  InputFunction f_;
  torch::autograd::SavedVariable s_;
  std::vector<torch::autograd::SavedVariable> params_;
  torch::Tensor w_;                     // the stacked weights, a view (zero3 refills their storage for backward)
  Fp8Scales scales_;                    // the forward's FP8 scales (f's output's and W's), or undefined
  std::vector<torch::Tensor> weights_;  // the parameters themselves, for their .grad
  bool with_bias_;
  KnownInput known_;
};

// linear_of, swiglu_linear and norm_linear (`known`).
torch::Tensor linear_of_input(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params,
                              const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases,
                              KnownInput known) {
  TORCH_CHECK(!weights.empty(), "linear_of: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "linear_of: give no bias or one per weight");
  std::vector<torch::Tensor> inputs{s};
  inputs.insert(inputs.end(), f_params.begin(), f_params.end());
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  bool any = false;
  for (const torch::Tensor& t : inputs) any = any || t.requires_grad();
  if (!torch::GradMode::is_enabled() || !any) return linear(f(s, f_params), weights, biases);
  bool in_place = false;
  const torch::Tensor w = stacked(weights, &in_place);
  torch::Tensor y;
  Fp8Scales scales;
  {
    torch::NoGradGuard no_grad;  // f's output is not kept
    torch::Tensor h;
#ifdef TRAINER_CUDA_KERNELS
    if (known.kind == KnownInput::Kind::rms_norm && rms_norm_kernels_apply(s, known.weight)) {
      RmsNormForward n = rms_norm_forward(s, known.weight, known.eps);
      h = std::move(n.y);
      known.rstd = std::move(n.rstd);
    }
#endif
    if (!h.defined()) h = f(s, f_params);
    y = product(h, w, biases.empty() ? torch::Tensor() : stacked(biases), &scales, keeps_w_t(weights), in_place);
  }
  auto node = std::make_shared<LinearOfBackward>(std::move(f), s, f_params, w, weights, !biases.empty(),
                                                 std::move(scales), std::move(known));
  for (const torch::Tensor& t : inputs) node->add_next_edge(torch::autograd::impl::gradient_edge(t));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases) {
  TORCH_CHECK(!weights.empty(), "linear: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "linear: give no bias or one per weight");
  // One weight goes to LibTorch's linear, unless its gradient may be added
  // in place by the GEMM (CUDA, bf16: fused_gradient_target).
  // So do FP8 layers, with or without gradients.
  const bool may_fuse =
      x.is_cuda() && x.scalar_type() == torch::kBFloat16 && (torch::GradMode::is_enabled() || fp8_linear_enabled());
  if (weights.size() == 1 && !may_fuse) {
    return plain_product(x, weights[0], biases.empty() ? torch::Tensor() : biases[0]);
  }
  return StackedLinearFunction::apply(x, at::TensorList(weights), at::TensorList(biases),
                                      torch::GradMode::is_enabled() && keeps_w_t(weights));
}

}  // namespace trainer::ops

namespace trainer::ops {

torch::Tensor linear_of(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params,
                        const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
  return linear_of_input(std::move(f), s, f_params, weights, biases, KnownInput{});
}

torch::Tensor swiglu_linear(const torch::Tensor& gate_up, const std::vector<torch::Tensor>& weights,
                            const std::vector<torch::Tensor>& biases) {
  static const InputFunction f = [](const torch::Tensor& s, const std::vector<torch::Tensor>&) { return swiglu(s); };
  return linear_of_input(f, gate_up, {}, weights, biases, KnownInput{KnownInput::Kind::swiglu, {}, {}, 0.0});
}

torch::Tensor norm_linear(const torch::Tensor& x, const torch::Tensor& norm_weight, double eps,
                          const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
  const InputFunction f = [eps](const torch::Tensor& s, const std::vector<torch::Tensor>& p) {
    return rms_norm(s, p[0], eps);
  };
  return linear_of_input(f, x, {norm_weight}, weights, biases,
                         KnownInput{KnownInput::Kind::rms_norm, norm_weight, {}, eps});
}

Fp8WeightReuse::Fp8WeightReuse(Keep keep) {
  TORCH_CHECK(!g_weight_reuse.open, "Fp8WeightReuse: a scope is already open on this thread");
  g_weight_reuse.open = true;
  g_weight_reuse.both = keep == Keep::both;
}

Fp8WeightReuse::~Fp8WeightReuse() {
  g_weight_reuse.open = false;
  g_weight_reuse.both = false;
  g_weight_reuse.kept.clear();
}

int64_t Fp8WeightReuse::reused() { return g_weight_casts_reused.load(); }

}  // namespace trainer::ops
