// linear over stacked weights: one GEMM forward, one for the input gradient
// and one for all weight gradients, as an autograd function.
#include "trainer/ops/Linear.h"

#include <torch/autograd.h>

namespace trainer::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The tensors stacked along dim 0: a view when they lie back to back in one
// storage (no copy, and zero3's re-gathered storage is seen through it),
// otherwise a concatenated copy.
torch::Tensor stacked(const std::vector<torch::Tensor>& parts) {
  bool adjacent = true;
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const torch::Tensor& p = parts[i];
    adjacent = adjacent && p.is_contiguous() && p.scalar_type() == parts[0].scalar_type() &&
               p.sizes().slice(1) == parts[0].sizes().slice(1) && p.storage().is_alias_of(parts[0].storage()) &&
               p.storage_offset() == parts[0].storage_offset() + parts[0].numel() / parts[0].size(0) * rows;
    rows += p.size(0);
  }
  if (!adjacent) return torch::cat(parts, 0);
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[0] = rows;
  return parts[0].as_strided(sizes, parts[0].strides());
}

struct StackedLinearFunction : torch::autograd::Function<StackedLinearFunction> {
  // The lists arrive as TensorList so that autograd sees each tensor in them as an input.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases) {
    const torch::Tensor w = stacked(weights.vec());
    const torch::Tensor b = biases.empty() ? torch::Tensor() : stacked(biases.vec());
    std::vector<int64_t> rows;
    for (const torch::Tensor& weight : weights) rows.push_back(weight.size(0));
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["biases"] = static_cast<int64_t>(biases.size());
    return torch::linear(x, w, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor w = ctx->saved_data["w"].toTensor();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const bool with_bias = ctx->saved_data["biases"].toInt() > 0;
    const torch::Tensor dy = grads[0].reshape({-1, w.size(0)});
    const torch::Tensor x2 = x.reshape({-1, w.size(1)});
    const torch::Tensor dx = ctx->needs_input_grad(0) ? dy.mm(w).view(x.sizes()) : torch::Tensor();
    const torch::Tensor dw = dy.t().mm(x2);
    const torch::Tensor db = with_bias ? dy.sum(0) : torch::Tensor();
    variable_list weight_grads, bias_grads;
    int64_t offset = 0;
    for (const int64_t r : rows) {
      weight_grads.push_back(dw.narrow(0, offset, r));
      if (with_bias) bias_grads.push_back(db.narrow(0, offset, r));
      offset += r;
    }
    // One gradient per input tensor, in order: x, then each weight, then each bias.
    variable_list out{dx};
    out.insert(out.end(), weight_grads.begin(), weight_grads.end());
    out.insert(out.end(), bias_grads.begin(), bias_grads.end());
    return out;
  }
};

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                     const std::vector<torch::Tensor>& biases) {
  TORCH_CHECK(!weights.empty(), "linear: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "linear: give no bias or one per weight");
  if (weights.size() == 1) return torch::linear(x, weights[0], biases.empty() ? torch::Tensor() : biases[0]);
  return StackedLinearFunction::apply(x, at::TensorList(weights), at::TensorList(biases));
}

}  // namespace trainer::ops
