// linear over stacked weights: one GEMM forward, one for the input gradient
// and one for all weight gradients, as an autograd function; linear_of, the
// same with its input recomputed in backward, as an autograd node.
#include "trainer/ops/Linear.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

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

// The gradients of y = x W^T + b for stacked W: dx (when wanted) and one
// weight and bias gradient per stacked tensor, as views of one GEMM's result.
struct LinearGrads {
  torch::Tensor dx;
  torch::autograd::variable_list weights, biases;
};

LinearGrads linear_backward(const torch::Tensor& dy_in, const torch::Tensor& x, const torch::Tensor& w,
                            const std::vector<int64_t>& rows, bool with_bias, bool need_dx) {
  LinearGrads out;
  const torch::Tensor dy = dy_in.reshape({-1, w.size(0)});
  const torch::Tensor x2 = x.reshape({-1, w.size(1)});
  if (need_dx) out.dx = dy.mm(w).view(x.sizes());
  const torch::Tensor dw = dy.t().mm(x2);
  const torch::Tensor db = with_bias ? dy.sum(0) : torch::Tensor();
  int64_t offset = 0;
  for (const int64_t r : rows) {
    out.weights.push_back(dw.narrow(0, offset, r));
    if (with_bias) out.biases.push_back(db.narrow(0, offset, r));
    offset += r;
  }
  return out;
}

std::vector<int64_t> rows_of(at::TensorList weights) {
  std::vector<int64_t> rows;
  for (const torch::Tensor& weight : weights) rows.push_back(weight.size(0));
  return rows;
}

struct StackedLinearFunction : torch::autograd::Function<StackedLinearFunction> {
  // The lists arrive as TensorList so that autograd sees each tensor in them as an input.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases) {
    const torch::Tensor w = stacked(weights.vec());
    const torch::Tensor b = biases.empty() ? torch::Tensor() : stacked(biases.vec());
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    ctx->saved_data["rows"] = rows_of(weights);
    ctx->saved_data["biases"] = static_cast<int64_t>(biases.size());
    return torch::linear(x, w, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor w = ctx->saved_data["w"].toTensor();
    LinearGrads g = linear_backward(grads[0], x, w, ctx->saved_data["rows"].toIntVector(),
                                    ctx->saved_data["biases"].toInt() > 0, ctx->needs_input_grad(0));
    // One gradient per input tensor, in order: x, then each weight, then each bias.
    variable_list out{g.dx};
    out.insert(out.end(), g.weights.begin(), g.weights.end());
    out.insert(out.end(), g.biases.begin(), g.biases.end());
    return out;
  }
};

// Inputs, in edge order: s, each of f's parameters, each weight, each bias.
class LinearOfBackward final : public torch::autograd::Node {
 public:
  LinearOfBackward(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params,
                   torch::Tensor w, std::vector<int64_t> rows, bool with_bias)
      : f_(std::move(f)), s_(s, /*is_output=*/false), w_(std::move(w)), rows_(std::move(rows)), with_bias_(with_bias) {
    for (const torch::Tensor& p : f_params) params_.emplace_back(p, /*is_output=*/false);
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const torch::Tensor s_saved = s_.unpack();
    const torch::Tensor s = s_saved.detach().requires_grad_(s_saved.requires_grad());
    std::vector<torch::Tensor> params;
    for (torch::autograd::SavedVariable& p : params_) params.push_back(p.unpack().detach().requires_grad_(true));
    torch::Tensor h;
    {
      torch::AutoGradMode enable(true);
      h = f_(s, params);
    }
    LinearGrads g = linear_backward(grads[0], h.detach(), w_, rows_, with_bias_, /*need_dx=*/true);
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
    for (size_t i = 0; i < params.size(); ++i) out.push_back(next < through_f.size() ? through_f[next++] : torch::Tensor());
    out.insert(out.end(), g.weights.begin(), g.weights.end());
    out.insert(out.end(), g.biases.begin(), g.biases.end());
    return out;
  }

  void release_variables() override {
    s_.reset_data();
    for (torch::autograd::SavedVariable& p : params_) p.reset_data();
    w_ = torch::Tensor();
  }

 private:
  InputFunction f_;
  torch::autograd::SavedVariable s_;
  std::vector<torch::autograd::SavedVariable> params_;
  torch::Tensor w_;  // the stacked weights, a view (zero3 refills their storage for backward)
  std::vector<int64_t> rows_;
  bool with_bias_;
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

namespace trainer::ops {

torch::Tensor linear_of(InputFunction f, const torch::Tensor& s, const std::vector<torch::Tensor>& f_params,
                        const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& biases) {
  TORCH_CHECK(!weights.empty(), "linear_of: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "linear_of: give no bias or one per weight");
  std::vector<torch::Tensor> inputs{s};
  inputs.insert(inputs.end(), f_params.begin(), f_params.end());
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  inputs.insert(inputs.end(), biases.begin(), biases.end());
  bool any = false;
  for (const torch::Tensor& t : inputs) any = any || t.requires_grad();
  if (!torch::GradMode::is_enabled() || !any) return linear(f(s, f_params), weights, biases);
  const torch::Tensor w = stacked(weights);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;  // f's output is not kept
    y = torch::linear(f(s, f_params), w, biases.empty() ? torch::Tensor() : stacked(biases));
  }
  auto node = std::make_shared<LinearOfBackward>(std::move(f), s, f_params, w, rows_of(weights), !biases.empty());
  for (const torch::Tensor& t : inputs) node->add_next_edge(torch::autograd::impl::gradient_edge(t));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace trainer::ops
