// Strategy `ddp`: full fp32 gradients in flat buffers that autograd
// accumulates into across micro-steps, all-reduced as sums in buckets, and
// full optimizer state on every rank. The reference every ZeRO stage must match
// bit for bit at world size 1.
//
// Buckets hold whole parameters, in reverse model order (backward produces
// the last layers' gradients first). With overlap = true (the default), a
// bucket's all-reduce starts from an autograd hook on the last micro-step as
// soon as all its parameters' gradients are final; otherwise all buckets
// start at the boundary. The sums are the same either way.
//
// With StrategyEnv::exact_gradients (reproducible mode) the core sums the
// gradients: nothing is bound or reduced here, and the buffers only receive
// the core's sum (gradient_slices) for the update.
//
// With overlap_update = true the update runs unit by unit behind the next
// forward (trainer/sharding/OverlappedUpdate.h): each unit's forward waits
// for its own parameters' update, so the bits are the ordered run's.
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/Strategy.h"
#include "trainer/sharding/AdamW.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/GradientBuckets.h"
#include "trainer/sharding/OptimizerShards.h"
#include "trainer/sharding/OverlappedUpdate.h"

namespace {

using namespace trainer;

struct Bucket {
  torch::Tensor grads;   // a contiguous view of one group's flat fp32 gradient buffer
  torch::Tensor narrow;  // its bf16 copy in flight, with reduce_dtype = 'bf16'
  std::unique_ptr<CommWork> work;
};

class DdpStrategy final : public Strategy {
 public:
  explicit DdpStrategy(const Options& options)
      : bucket_bytes_(static_cast<int64_t>(options.real("bucket_mb") * 1024 * 1024)),
        overlap_(options.boolean("overlap")),
        reduce_bf16_(options.text("reduce_dtype") == "bf16"),
        overlap_update_(options.boolean("overlap_update")),
        options_(options) {}

  ~DdpStrategy() override {
    if (model_ != nullptr) model_->set_unit_hooks(nullptr);
  }

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    device_ = env.device;
    exact_ = env.exact_gradients;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/1, torch::kFloat32, env.compute_dtype);
    // Every rank updates whole groups; the update writes the bf16 compute
    // copy in its own pass.
    shards_ = OptimizerShards::viewing(*env.optimizer, groups_, /*rank=*/0, /*ranks=*/1, /*write_compute=*/true);
    for (size_t g = 0; g < groups_.size(); ++g) {
      // Autograd adds each micro-step's gradient into the optimizer's fp32
      // accumulator in place, also for bf16 parameters (their gradient is
      // widened exactly as it is added), so accumulation error stays fp32's
      // and no bf16 gradient buffer exists.
      grads_.push_back(shards_.groups()[g].gradient);
      if (!exact_) bind_gradients(groups_[g], grads_.back());
    }
    if (overlap_update_) {
      if (exact_) {
        options_.fail("overlap_update", "false with training.reproducible (its atoms replay without waiting)");
      }
      if (shards_.has_whole_matrix()) {
        options_.fail("overlap_update",
                      "false with an optimizer that transforms whole matrices (muon): a transform spans units");
      }
      const std::vector<ParameterUnit> units = model.units();
      if (units.empty()) {
        options_.fail("overlap_update", "false with a model that declares no units (Model::units)");
      }
      try {
        overlapped_ = OverlappedUpdate(units, groups_, env.device);
      } catch (const std::invalid_argument& e) {
        throw InputError(fmt::format("ddp: overlap_update: the model's units: {}", e.what()));
      }
      model.set_unit_hooks(&overlapped_);
      model_ = &model;
    }
    if (exact_) return;
    layout_ = GradientBuckets(groups_, std::max<int64_t>(1, bucket_bytes_ / 4));
    for (const GradientBucket& bucket : layout_.buckets()) {
      buckets_.push_back(Bucket{grads_[bucket.group].narrow(0, bucket.begin, bucket.numel()), {}, nullptr});
    }
    // A bucket's all-reduce starts as soon as its gradients are final (the hook runs on the autograd thread).
    if (overlap_) layout_.hook(groups_, nullptr, [this](size_t b) { start(buckets_[b]); });
  }

  void backward(const torch::Tensor& loss, const MicroStep& micro) override {
    overlapped_.join();  // the forward waited for every unit; a model that skipped one gets it here
    if (exact_) {
      loss.backward();
      return;
    }
    const bool overlapped = overlap_ && micro.is_last && comm_->world_size() > 1;
    layout_.arm(overlapped);
    loss.backward();
    layout_.arm(false);
    // Buckets whose parameters took no part in this backward (on this rank:
    // the graph may depend on the data) start now, after the ones the hooks
    // started, in the same agreed order: every rank issues the same
    // all-reduces in the same order before the loop's next collective.
    if (overlapped) {
      torch::NoGradGuard no_grad;
      start_the_rest();
      // Once: from now on buckets go in the order rank 0's gradients came.
      if (!order_agreed_) layout_.agree_on_order(*comm_, device_);
      order_agreed_ = true;
    }
  }

  double reduce_gradients_and_norm() override {
    overlapped_.join();
    if (exact_) return 0.0;
    torch::NoGradGuard no_grad;
    start_the_rest();
    for (Bucket& bucket : buckets_) {
      bucket.work->wait();
      bucket.work.reset();
      if (bucket.narrow.defined()) bucket.grads.copy_(bucket.narrow);
      bucket.narrow = torch::Tensor();
    }
    return total_norm(grads_);  // one host sync for every group
  }

  void apply_update(const UpdateArgs& args) override {
    if (overlap_update_) {
      overlapped_.launch(shards_, grads_, args);  // each unit's gradient zeroed after its update
      return;
    }
    shards_.update(args, nullptr, comm_);  // the whole-matrix transforms divided among the ranks
    discard_gradients();
  }

  void discard_gradients() override {
    overlapped_.join();
    for (torch::Tensor& grads : grads_) grads.zero_();
  }

  void wait_for_update() override { overlapped_.join(); }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParameterGroup& group = groups_[g];
      const int64_t bytes = group.values.numel() * 4;
      const bool separate = separate_compute(group);
      report.parameter_bytes += group.compute.numel() * group.compute.element_size();
      report.gradient_bytes += bytes;
      report.optimizer_bytes += separate ? bytes : 0;  // master weights if separate
    }
    report.optimizer_bytes += shards_.state_bytes();
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override {
    overlapped_.join();
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, grads_[g]});
    return slices;
  }

  std::vector<StateSlice> state_slices() override {
    overlapped_.join();
    return shards_.state_slices();
  }
  // In exact mode backward() is autograd's alone, on parameters set up once.
  bool replayable_atoms() const override { return exact_; }
  // In the fast mode backward() adds into the buffers bound once; only a
  // last micro-step whose hooks start the buckets' all-reduces does more,
  // and, with overlap_update, a step's first, whose forward waits for the
  // update unit by unit (a replay would not).
  bool replayable_micro_step(const MicroStep& micro) const override {
    return !exact_ && !(overlap_ && micro.is_last && comm_->world_size() > 1) && !(overlap_update_ && micro.index == 0);
  }

  void state_loaded() override {
    overlapped_.join();
    for (ParameterGroup& group : groups_) sync_compute(group);
  }

  std::vector<FlatSlice> parameter_slices() const override {
    overlapped_.join();
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, groups_[g].values});
    return slices;
  }

 private:
  void start(Bucket& bucket) {
    torch::NoGradGuard no_grad;
    if (reduce_bf16_) {
      bucket.narrow = bucket.grads.to(torch::kBFloat16);
      bucket.work = comm_->all_reduce_sum_async(bucket.narrow);
    } else {
      bucket.work = comm_->all_reduce_sum_async(bucket.grads);
    }
  }

  int64_t bucket_bytes_;
  bool overlap_;
  bool reduce_bf16_;
  bool overlap_update_;
  Options options_;  // for refusing overlap_update by name at setup
  // The buckets not started yet, in the layout's agreed order.
  void start_the_rest() {
    for (size_t b : layout_.order()) {
      if (!buckets_[b].work) start(buckets_[b]);
    }
  }

  Comm* comm_ = nullptr;
  torch::Device device_ = torch::kCPU;
  bool exact_ = false;  // StrategyEnv::exact_gradients: no buckets, nothing bound
  bool order_agreed_ = false;
  std::vector<ParameterGroup> groups_;
  OptimizerShards shards_;            // whole groups: values view groups_, state, accumulators
  std::vector<torch::Tensor> grads_;  // shards_'s fp32 accumulators, bound as the parameters' .grad
  GradientBuckets layout_;
  std::vector<Bucket> buckets_;  // layout_'s, in its order
  // With overlap_update: the update's units in flight (joined by every
  // method that reads or writes the state) and the model whose hooks wait for them.
  mutable OverlappedUpdate overlapped_;
  Model* model_ = nullptr;
};

constexpr KeySpec kKeys[] = {
    {"bucket_mb", ValueType::Float, "25.0", "gradient bytes per all-reduce bucket (whole parameters)", 1e-6, 1e6},
    {"overlap", ValueType::Bool, "true", "start each bucket's all-reduce during the last backward"},
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient all-reduce", -kNoLimit, kNoLimit, "fp32|bf16"},
    {"overlap_update", ValueType::Bool, "false",
     "update unit by unit behind the next forward (CUDA: on a stream of its own; the same bits)"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Strategy, DdpStrategy, "ddp", "0.1.0", "data parallel: full gradients all-reduced in buckets",
                      kKeys)
