// Causal attention: LibTorch's fused SDPA kernels on 2.x, the explicit
// softmax form on 1.13 (which has none); packed documents through the
// variable-length flash kernel on CUDA, a block-diagonal mask elsewhere.
#include "trainer/ops/Attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

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

DocumentLayout document_layout(const torch::Tensor& document_ids) {
  TORCH_CHECK(document_ids.dim() == 2, "document_layout: document_ids must be [batch, seq]");
  const torch::Tensor ids = document_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t rows = ids.size(0), seq = ids.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<int32_t> offsets;
  int64_t longest = 0;
  TORCH_CHECK(rows * seq <= std::numeric_limits<int32_t>::max(), "document_layout: ", rows * seq,
              " positions exceed int32 offsets");
  for (int64_t i = 0; i < rows * seq; ++i) {
    if (i % seq == 0 || id[i] != id[i - 1]) {
      if (!offsets.empty()) longest = std::max<int64_t>(longest, i - offsets.back());
      offsets.push_back(static_cast<int32_t>(i));
    }
  }
  if (!offsets.empty()) longest = std::max<int64_t>(longest, rows * seq - offsets.back());
  offsets.push_back(static_cast<int32_t>(rows * seq));
  return DocumentLayout{document_ids, torch::tensor(offsets, torch::TensorOptions().dtype(torch::kInt32)), longest};
}

namespace {
#if TORCH_VERSION_MAJOR >= 2
// The variable-length flash kernel: each document a sequence of its own,
// grouped k/v heads read in place. Its backward is LibTorch's (deterministic
// when ATen's deterministic algorithms are on, as reproducible mode sets).
bool varlen_applies(const torch::Tensor& q, const DocumentLayout& documents) {
  const auto dtype = q.scalar_type();
  return documents.offsets.defined() && q.is_cuda() && (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
         q.size(-1) % 8 == 0 && q.size(-1) <= 256;
}

torch::Tensor varlen_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const DocumentLayout& documents) {
  const int64_t b = q.size(0), t = q.size(2), d = q.size(3);
  TORCH_CHECK(
      documents.offsets.dim() == 1 && documents.offsets.size(0) >= 2 && documents.longest > 0 && documents.longest <= t,
      "document_causal_attention: offsets ", documents.offsets.sizes(), " and longest document ", documents.longest,
      " do not describe rows of ", t, " positions");
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log::info(
        fmt::format("attention over packed documents: variable-length flash kernel ({} heads, {} key/value "
                    "heads, head dim {})",
                    q.size(1), k.size(1), d));
  });
  // [batch, heads, seq, dim] -> [batch * seq, heads, dim]: a view when the
  // heads were split from [batch, seq, heads, dim], as the models do.
  const auto flat = [&](const torch::Tensor& x) { return x.transpose(1, 2).reshape({b * t, x.size(1), d}); };
  const torch::Tensor offsets = documents.offsets.to(q.device(), torch::kInt32);
  auto result = at::_flash_attention_forward(flat(q), flat(k), flat(v), offsets, offsets, documents.longest,
                                             documents.longest, /*dropout_p=*/0.0, /*is_causal=*/true,
                                             /*return_debug_mask=*/false);
  return std::get<0>(result).view({b, t, q.size(1), d}).transpose(1, 2);
}
#endif
}  // namespace

torch::Tensor document_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                        const DocumentLayout& documents) {
#if TORCH_VERSION_MAJOR >= 2
  if (documents.ids.defined() && varlen_applies(q, documents)) return varlen_attention(q, k, v, documents);
#endif
  return document_causal_attention(q, k, v, documents.ids);
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
