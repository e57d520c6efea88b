// Strategy `@NAME@`: data parallelism with the optimizer state sharded,
// built on the SDK's ShardedStrategy. Every rank holds the whole model and
// an fp32 gradient buffer per parameter group that autograd accumulates
// into over the micro-steps. At the step's end each buffer is all-reduced
// as a sum and each rank keeps its shard's part of it; ShardedStrategy
// updates the shard (AdamW), all-gathers the parameters and provides the
// slices that checkpoints are written from. A stage of your own changes
// only this file's gradient path.
//
// The accumulation contract (`trainer check-plugin @NAME@` checks it): the
// loss handed to backward() is already divided by the step's target tokens
// over all micro-batches and ranks, so the strategy only sums: across
// micro-steps (never overwriting) and across ranks (never averaging). In
// reproducible mode (StrategyEnv::exact_gradients) the core sums the
// gradients instead: keep_full_gradients() then keeps none, so the loop
// below reduces nothing, and ShardedStrategy's backward only backpropagates.
#include "trainer/Strategy.h"
#include "trainer/sharding/ShardedStrategy.h"

namespace {

using namespace trainer;

class @CLASS@ final : public ShardedStrategy {
 public:
  explicit @CLASS@(const Options& options) : ShardedStrategy(options, "@NAME@") {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    join(comm, env);
    // Flat fp32 master values per group (decay / no decay) on the device; the
    // model's parameters become views of them (or of a bf16 copy), and their
    // gradients views of an fp32 buffer that autograd adds every micro-step into.
    keep_full_parameters(model, env);
    keep_full_gradients();
  }

  // The gradient buffers take no part in autograd: no NoGradGuard needed here.
  double reduce_gradients_and_norm() override {
    for (size_t g = 0; g < full_gradients().size(); ++g) {
      torch::Tensor& grads = full_gradients()[g];
      torch::Tensor summed = reduce_dtype() == torch::kFloat32 ? grads : grads.to(reduce_dtype());
      shard_comm().all_reduce_sum(summed);  // a sum over ranks, never a mean
      OptimizerShard& mine = optimizer().groups()[g];
      mine.gradient.copy_(summed.narrow(0, mine.shard.offset, mine.shard.numel));
      shard_groups().sum_over_replicas(mine.gradient);
    }
    return ShardedStrategy::reduce_gradients_and_norm();  // the norm over every rank's shard
  }
};

// Each key: name, type, default (TOML), one line of help, and for numbers
// the allowed range or for strings the choices.
constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient all-reduce", -kNoLimit, kNoLimit,
     "fp32|bf16"},
    kShardGroupSizeKey,
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Strategy, @CLASS@, "@NAME@", "0.1.0",
                      "all-reduce of whole fp32 gradients, AdamW state sharded across ranks", kKeys)
