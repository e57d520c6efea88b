// linear_cross_entropy_sum: chunked logits, gradients formed in the forward
// pass, an autograd function whose backward only scales them.
//
// Memory: the full [rows, vocab] logits never exist; per chunk of C rows
// there are C x vocab fp32 logits (at most 1 GiB) and, in bf16, their
// softmax gradient beside them. What lives from forward to backward: the
// hidden gradient [target rows, dim] and the weight gradient [vocab, dim]
// in fp32.
// Traffic per logit on CUDA: the GEMM writes fp32 (accumulated in fp32
// anyway), one kernel (CrossEntropy.cu) reads it twice and writes the
// gradient, the two GEMMs read that. The LibTorch path (CPU, fp64) widens,
// log-softmaxes, gathers, exponentiates and scatters: about twice as many
// bytes. The composite form (fp32 logits, cross-entropy, its backward, a
// cast) moves about three times as many and keeps [rows, vocab] fp32 alive.
#include "trainer/ops/LinearCrossEntropy.h"

#include <algorithm>

#include <torch/autograd.h>
#include <torch/version.h>

#include "Dispatch.h"
#include "trainer/Model.h"

namespace trainer::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChunkBytes = int64_t(1) << 30;  // fp32 logits of one chunk

// Whether add_transposed_product's GEMM itself accumulates into `into`
// (operands of dtype `compute` on CUDA, `into` wider): it can then also
// write it, so `into` need not be zeroed before the first product.
bool gemm_writes_wider(torch::ScalarType compute, torch::ScalarType into, bool cuda) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  return cuda && compute != into;
#else
  (void)compute, (void)into, (void)cuda;
  return false;
#endif
}

// into += a^T b, accumulated in into's dtype (fp32) from operands in the
// compute dtype; into = a^T b when `overwrite` (only where
// gemm_writes_wider: the GEMM then never reads `into`, which may hold anything).
void add_transposed_product(torch::Tensor& into, const torch::Tensor& a, const torch::Tensor& b, bool overwrite) {
  if (gemm_writes_wider(a.scalar_type(), into.scalar_type(), into.is_cuda())) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
    // bf16 operands, fp32 accumulation inside the GEMM; beta 0 neither reads nor propagates what was there.
    if (lt_gemm(into, a, /*a_t=*/true, b, /*b_t=*/false, overwrite ? 0.0f : 1.0f)) return;
    at::addmm_out(into, into, a.t(), b, into.scalar_type(), /*beta=*/overwrite ? 0 : 1, /*alpha=*/1);
#endif
    return;
  }
  TORCH_CHECK(!overwrite, "add_transposed_product: overwrite where the GEMM does not write the accumulator");
  if (a.scalar_type() == into.scalar_type()) {
    into.addmm_(a.t(), b);
    return;
  }
  into.add_(a.t().mm(b));
}

// The CUDA kernel covers fp32 softmax arithmetic (fp32 and bf16 compute);
// fp64 and the CPU take LibTorch's ops.
bool fused_softmax(const torch::Tensor& hidden) {
#ifdef TRAINER_CUDA_KERNELS
  return hidden.is_cuda() && (hidden.scalar_type() == torch::kFloat32 || hidden.scalar_type() == torch::kBFloat16);
#else
  (void)hidden;
  return false;
#endif
}

// hidden W^T as fp32: in bf16 the GEMM accumulates in fp32 and writes fp32
// directly where LibTorch can (no bf16 logits, no widening copy).
torch::Tensor logits_in_fp32(const torch::Tensor& hidden, const torch::Tensor& weight) {
  if (hidden.scalar_type() == torch::kFloat32) return hidden.mm(weight.t());
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  torch::Tensor out = torch::empty({hidden.size(0), weight.size(0)}, hidden.options().dtype(torch::kFloat32));
  // beta = 0: the uninitialised `out` is not read.
  if (lt_gemm(out, hidden, /*a_t=*/false, weight, /*b_t=*/true, 0.0f)) return out;
  at::addmm_out(out, out, hidden, weight.t(), torch::kFloat32, /*beta=*/0, /*alpha=*/1);
  return out;
#else
  return hidden.mm(weight.t()).to(torch::kFloat32);
#endif
}

// loss[r] and, when `grad` is defined, softmax - one-hot of fp32 `logits`
// rows (CrossEntropy.cu).
void softmax_rows(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& loss,
                  const torch::Tensor& grad) {
#ifdef TRAINER_CUDA_KERNELS
  const torch::Tensor t = targets.contiguous();
  const KernelLaunch launch("cross_entropy_rows", {logits, t, loss, grad});
  kernels::cross_entropy_rows(grad.defined() ? kernel_dtype(grad) : kernels::Dtype::Float32, logits.data_ptr<float>(),
                              t.data_ptr<int64_t>(), loss.data_ptr<float>(), grad.defined() ? grad.data_ptr() : nullptr,
                              logits.size(0), logits.size(1), launch.stream());
  check_launch("cross_entropy_rows");
#else
  (void)logits, (void)targets, (void)loss, (void)grad;
  throw std::logic_error("softmax_rows: a build without CUDA kernels");
#endif
}

// The rows of `labels` that are targets, in order; `count` of them when
// the caller knows it (else -1).
torch::Tensor target_indices(const torch::Tensor& labels, int64_t count) {
  const torch::Tensor targets = labels.ne(kIgnoreIndex);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  if (count >= 0 && labels.is_cuda()) return at::nonzero_static(targets, count, /*fill_value=*/-1).squeeze(1);
#else
  (void)count;
#endif
  return targets.nonzero().squeeze(1);
}

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& labels, bool need_grad, int64_t chunk_rows, int64_t target_rows) {
    const auto acc = accumulate_dtype(hidden);
    const bool narrow = hidden.scalar_type() != acc;  // logits in bf16, softmax in fp32
    const int64_t rows = hidden.size(0), vocab = weight.size(0);
    // Only target rows are computed. Selecting them costs one host sync
    // (nonzero's count), which completion-only losses repay many times
    // over, unless the caller knows the count: every row (nothing to
    // select), or on CUDA any count (nonzero_static, LibTorch >= 2.6: no
    // sync, so a CUDA graph can hold the selection).
    const bool all = target_rows == rows;
    const torch::Tensor index = all ? torch::Tensor() : target_indices(labels, target_rows);
    const int64_t targets = all ? rows : index.size(0);
    const torch::Tensor h = all ? hidden : hidden.index_select(0, index);
    const torch::Tensor t = all ? labels : labels.index_select(0, index);
    torch::Tensor loss = torch::zeros({}, hidden.options().dtype(acc));
    torch::Tensor grad_h, grad_w;
    const bool overwrite_first = targets > 0 && gemm_writes_wider(hidden.scalar_type(), acc, hidden.is_cuda());
    if (need_grad) {
      grad_h = torch::empty({targets, hidden.size(1)}, hidden.options());
      // Written by the first chunk's GEMM where it can be (no zeroing pass
      // over [vocab, dim] fp32), else zeroed and added into.
      grad_w = overwrite_first ? torch::empty(weight.sizes(), weight.options().dtype(acc))
                               : torch::zeros(weight.sizes(), weight.options().dtype(acc));
    }
    const int64_t chunk = chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, kChunkBytes / (vocab * 4));
    const bool fused = fused_softmax(hidden);
    for (int64_t start = 0; start < targets; start += chunk) {
      const int64_t n = std::min(chunk, targets - start);
      const torch::Tensor hc = h.narrow(0, start, n);
      const torch::Tensor tc = t.narrow(0, start, n);
      // d loss_sum / d logits = softmax - one-hot, in the compute dtype; the
      // target entries (p - 1) are formed in fp32 before rounding.
      torch::Tensor g;
      if (fused) {
        const torch::Tensor logits = logits_in_fp32(hc, weight);
        if (need_grad) g = narrow ? torch::empty_like(logits, hidden.scalar_type()) : logits;
        const torch::Tensor row_loss = torch::empty({n}, logits.options());
        softmax_rows(logits, tc, row_loss, g);
        loss.add_(row_loss.sum());
      } else {
        // Widened before the softmax (LibTorch's kernels widen only fp16 inside).
        torch::Tensor logp = at::_log_softmax(hc.mm(weight.t()).to(acc), 1, /*half_to_float=*/false);
        const torch::Tensor target_logp = logp.gather(1, tc.unsqueeze(1));
        loss.sub_(target_logp.sum());
        if (!need_grad) continue;
        g = narrow ? torch::empty_like(logp, hidden.scalar_type()) : logp;
        at::exp_out(g, logp);
        logp = torch::Tensor();
        g.scatter_(1, tc.unsqueeze(1), (target_logp.exp() - 1).to(g.scalar_type()));
      }
      if (!need_grad) continue;
      torch::Tensor grad_rows = grad_h.narrow(0, start, n);
      if (!lt_gemm(grad_rows, g, /*a_t=*/false, weight, /*b_t=*/false, 0.0f)) at::mm_out(grad_rows, g, weight);
      add_transposed_product(grad_w, g, hc, overwrite_first && start == 0);
    }
    if (need_grad) {
      ctx->saved_data["grad_h"] = grad_h;
      ctx->saved_data["grad_w"] = grad_w;
      ctx->saved_data["all"] = all;
      ctx->saved_data["index"] = index;
      ctx->saved_data["rows"] = rows;
      ctx->saved_data["weight"] = weight;  // the parameter itself, for its .grad
    }
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(ctx->saved_data.count("grad_w"),
                "linear_cross_entropy_sum: backward ran twice (the first consumes the gradients it saved)");
    const torch::Tensor scale = grads[0];
    const torch::Tensor grad_h = ctx->saved_data["grad_h"].toTensor();
    const torch::Tensor grad_w = ctx->saved_data["grad_w"].toTensor();
    const torch::Tensor index = ctx->saved_data["index"].toTensor();
    // Released here, not with the graph: the weight gradient is as large as the weight.
    ctx->saved_data.erase("grad_h");
    ctx->saved_data.erase("grad_w");
    // Scaled in fp32: a bf16 copy of the scale 1/N_t would bias every gradient.
    torch::Tensor dh = (grad_h.to(scale.scalar_type()) * scale).to(grad_h.scalar_type());
    if (!ctx->saved_data["all"].toBool()) {
      // index_put_ rather than index_copy_: the same rows, and it has a
      // deterministic CUDA variant (reproducible mode's switch refuses index_copy_).
      dh = torch::zeros({ctx->saved_data["rows"].toInt(), grad_h.size(1)}, grad_h.options()).index_put_({index}, dh);
    }
    const torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    ctx->saved_data.erase("weight");
    const torch::Tensor bound =
        weight.is_cuda() && grad_w.scalar_type() == torch::kFloat32 && weight.scalar_type() != torch::kFloat32
            ? bound_fp32_gradient(weight)
            : torch::Tensor();
    if (bound.defined()) {
      // bf16 weight, fp32 .grad bound by the strategy: added in fp32 in one
      // pass, where a bf16 copy would round the head's gradient and be read
      // again to be widened (autograd then adds nothing: the gradient is undefined).
      torch::NoGradGuard no_grad;
      bound.addcmul_(grad_w, scale);
      return {dh, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    // In place, or straight into the weight's dtype (the product rounded to
    // fp32, then to it, as a product and a copy would, without the second
    // pass over an fp32 tensor as large as the weight): the step's peak
    // memory falls here, with every activation alive.
    torch::Tensor dw = grad_w;
    if (weight.scalar_type() == grad_w.scalar_type()) {
      dw.mul_(scale);
    } else {
      dw = at::empty_like(grad_w, weight.scalar_type());
      at::mul_out(dw, grad_w, scale);
    }
    return {dh, dw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor linear_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& labels, int64_t chunk_rows, int64_t target_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && labels.dim() == 1 && labels.size(0) == hidden.size(0) &&
                  weight.size(1) == hidden.size(1),
              "linear_cross_entropy_sum: expected hidden [rows, dim], weight [vocab, dim], labels [rows]");
  const bool need_grad = torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  return LinearCrossEntropyFunction::apply(hidden, weight, labels, need_grad, chunk_rows, target_rows);
}

}  // namespace trainer::ops
