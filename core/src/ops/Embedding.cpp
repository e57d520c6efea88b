// The token embedding: torch::embedding's forward, its weight gradient
// added into the strategy's fp32 buffer on CUDA (see Embedding.h).
#include "trainer/ops/Embedding.h"

#include <torch/autograd.h>

#include "Dispatch.h"

namespace trainer::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct EmbeddingFunction : torch::autograd::Function<EmbeddingFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, const torch::Tensor& ids) {
    ctx->save_for_backward({ids});
    ctx->saved_data["weight"] = weight;  // the parameter itself, for its .grad
    torch::NoGradGuard no_grad;
    return torch::embedding(weight, ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor ids = ctx->get_saved_variables()[0];
    const torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    torch::Tensor bound = bound_fp32_gradient(weight);
    if (bound.defined()) {
      torch::NoGradGuard no_grad;
      const torch::Tensor rows = grads[0].reshape({-1, weight.size(1)}).to(torch::kFloat32);
      bound.index_put_({ids.reshape({-1})}, rows, /*accumulate=*/true);
      return {torch::Tensor(), torch::Tensor()};
    }
    return {at::embedding_backward(grads[0], ids, weight.size(0), /*padding_idx=*/-1,
                                   /*scale_grad_by_freq=*/false, /*sparse=*/false),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids) {
  if (!weight.is_cuda() || !torch::GradMode::is_enabled() || !weight.requires_grad()) {
    return torch::embedding(weight, ids);
  }
  return EmbeddingFunction::apply(weight, ids);
}

}  // namespace trainer::ops
