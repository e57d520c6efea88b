// recompute: an autograd node that keeps a block's input and, in backward,
// runs the block again with gradients enabled and backpropagates through it
// (a reentrant backward, as torch.utils.checkpoint's reentrant variant).
#include "trainer/ops/Recompute.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

namespace trainer::ops {

namespace {

class RecomputeBackward final : public torch::autograd::Node {
 public:
  RecomputeBackward(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& x)
      : block_(std::move(block)), x_(x, /*is_output=*/false) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const torch::Tensor input = x_.unpack().detach().requires_grad_(true);
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      output = block_(input);
    }
    torch::autograd::backward({output}, {grads[0]});
    return {input.grad()};
  }

  void release_variables() override { x_.reset_data(); }

 private:
  std::function<torch::Tensor(const torch::Tensor&)> block_;
  torch::autograd::SavedVariable x_;
};

}  // namespace

torch::Tensor recompute(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return block(x);
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;  // nothing inside the block is kept for backward
    output = block(x);
  }
  auto node = std::make_shared<RecomputeBackward>(block, x);
  node->add_next_edge(torch::autograd::impl::gradient_edge(x));
  torch::autograd::set_history(output, node);
  return output;
}

}  // namespace trainer::ops
