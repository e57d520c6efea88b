// Causal attention: LibTorch's fused SDPA kernels on 2.x, the explicit
// softmax form on 1.13 (which has none).
#include "trainer/ops/Attention.h"

#include <cmath>
#include <limits>
#include <mutex>

#include <fmt/format.h>
#include <torch/version.h>

#include "trainer/Log.h"

namespace trainer::ops {

#if TORCH_VERSION_MAJOR < 2
namespace {
// The explicit softmax form: scores of q against k (as many heads as q),
// -inf where `blocked`, softmax, times v.
torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& blocked) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  scores.masked_fill_(blocked, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}
}  // namespace
#endif

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  const bool grouped = q.size(1) != k.size(1);
  static std::once_flag logged;
  if (q.is_cuda()) {
    std::call_once(logged, [&] {
      static const char* const names[] = {"math", "flash", "memory-efficient", "cuDNN"};
      const int64_t choice = at::_fused_sdp_choice(q, k, v, {}, 0.0, true, c10::nullopt, grouped);
      log::info(fmt::format("attention: {} kernel (SDPA, {} heads, {} key/value heads, head dim {})",
                            choice >= 0 && choice < 4 ? names[choice] : "another", q.size(1), k.size(1), q.size(3)));
    });
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*scale=*/c10::nullopt, /*enable_gqa=*/grouped);
#else
  if (q.size(1) != k.size(1)) {
    const int64_t groups = q.size(1) / k.size(1);
    return causal_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1));
  }
  const int64_t seq = q.size(-2);
  return softmax_attention(
      q, k, v, torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1));
#endif
}

torch::Tensor document_causal_mask(const torch::Tensor& document_ids) {
  TORCH_CHECK(document_ids.dim() == 2, "document_causal_mask: document_ids must be [batch, seq]");
  const int64_t seq = document_ids.size(1);
  const torch::Tensor same = document_ids.unsqueeze(2).eq(document_ids.unsqueeze(1));
  const torch::Tensor causal =
      torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(document_ids.device())).tril();
  return same.logical_and(causal).unsqueeze(1);
}

torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const torch::Tensor& document_ids) {
  if (!document_ids.defined()) return causal_attention(q, k, v);
  TORCH_CHECK(document_ids.size(0) == q.size(0) && document_ids.size(1) == q.size(2),
              "document_causal_attention: document_ids ", document_ids.sizes(), " do not match q ", q.sizes());
  // Grouped k/v heads repeated: of SDPA's CUDA kernels that take a mask,
  // the memory-efficient one does not take grouped heads (only flash and
  // math do, and math materialises the scores in fp32).
  if (q.size(1) != k.size(1)) {
    const int64_t groups = q.size(1) / k.size(1);
    return document_causal_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), document_ids);
  }
  const torch::Tensor mask = document_causal_mask(document_ids);
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false);
#else
  return softmax_attention(q, k, v, mask.logical_not());
#endif
}

}  // namespace trainer::ops
