// Model `@NAME@`: a bigram language model. Each token's embedding
// ([vocab_size, hidden_size]) times the output matrix ([vocab_size,
// hidden_size]) gives the next token's logits.
//
// What a model must do (trainer/Model.h): create its parameters on the CPU
// from the run seed, keep using the same tensor objects (strategies move
// their data into flat buffers), and return the loss *sum* over target
// tokens with their count, never a mean: the core divides once, by the
// step's target tokens over every micro-batch and rank.
#include <iterator>

#include <torch/torch.h>

#include "trainer/Model.h"
#include "trainer/util/TorchCompat.h"

namespace {

using namespace trainer;

class @CLASS@ final : public Model {
 public:
  @CLASS@(const Options& options, const Context& context)
      : vocab_size_(options.integer("vocab_size")), hidden_size_(options.integer("hidden_size")) {
    at::Generator generator = compat::cpu_generator(context.seed);
    torch::NoGradGuard no_grad;
    const double std = options.real("initializer_range");
    embed_ = add("embed.weight", torch::empty({vocab_size_, hidden_size_}).normal_(0.0, std, generator));
    out_ = add("out.weight", torch::empty({vocab_size_, hidden_size_}).normal_(0.0, std, generator));
  }

  std::vector<NamedParameter> parameters() override { return parameters_; }
  int64_t vocab_size() const override { return vocab_size_; }

  // Units let zero3 gather one unit's parameters at a time: each unit's
  // forward is bracketed by enter_unit / leave_unit, in this order.
  std::vector<ParameterUnit> units() override { return {{"embed", {0}}, {"out", {1}}}; }

  LossSum forward(const Batch& batch) override {
    enter_unit(0);
    torch::Tensor hidden = leave_unit(0, torch::embedding(embed_, batch.input_ids));
    enter_unit(1);
    // fp32 logits whatever the compute dtype: the loss sum is accumulated in fp32.
    const torch::Tensor logits = torch::matmul(hidden, out_.t()).to(torch::kFloat32);
    const torch::Tensor loss_sum =
        torch::nn::functional::cross_entropy(logits.reshape({-1, vocab_size_}), batch.labels.reshape({-1}),
                                             torch::nn::functional::CrossEntropyFuncOptions()
                                                 .reduction(torch::kSum)
                                                 .ignore_index(kIgnoreIndex));
    return {leave_unit(1, loss_sum), batch.target_tokens};
  }

  torch::Tensor logits(const torch::Tensor& input_ids) override {
    return torch::matmul(torch::embedding(embed_, input_ids), out_.t());
  }

  // The output matrix's forward and backward: 6 FLOPs per weight per token.
  TrainingFlops training_flops() const override {
    return {6.0 * static_cast<double>(vocab_size_ * hidden_size_), 0.0};  // logits at every position
  }

 private:
  torch::Tensor add(const std::string& name, torch::Tensor tensor) {
    tensor.set_requires_grad(true);
    parameters_.push_back(NamedParameter{name, tensor, /*decay=*/true});
    return tensor;
  }

  int64_t vocab_size_, hidden_size_;
  torch::Tensor embed_, out_;
  std::vector<NamedParameter> parameters_;
};

constexpr KeySpec kKeys[] = {
    {"vocab_size", ValueType::Int, "64", "tokens the model reads and predicts", 2, 1 << 30},
    {"hidden_size", ValueType::Int, "32", "width of a token's embedding", 1, 1 << 20},
    {"initializer_range", ValueType::Float, "0.02", "standard deviation of the initial weights", 0, 10},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Model, @CLASS@, "@NAME@", "0.1.0", "a bigram language model", kKeys)
