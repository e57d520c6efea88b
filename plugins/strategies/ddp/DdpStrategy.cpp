// Strategy `ddp`: full fp32 gradients in flat buffers that autograd
// accumulates into across micro-steps, all-reduced as sums in buckets, and
// full AdamW state on every rank. The reference every ZeRO stage must match
// bit for bit at world size 1.
//
// Buckets hold whole parameters, in reverse model order (backward produces
// the last layers' gradients first). With overlap = true, a bucket's
// all-reduce starts from an autograd hook on the last micro-step as soon as
// all its parameters' gradients are final; otherwise all buckets start at
// the boundary. The sums are the same either way.
#include <cmath>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "trainer/FlatParameters.h"
#include "trainer/Strategy.h"

namespace {

using namespace trainer;

struct Bucket {
  torch::Tensor grads;    // a contiguous view of one group's flat fp32 gradient buffer
  int parameters = 0;   // how many parameters' gradients it holds
  int ready = 0;        // of those, final in this step's last backward
  std::unique_ptr<CommWork> work;
};

class DdpStrategy final : public Strategy {
 public:
  explicit DdpStrategy(const Options& options)
      : bucket_bytes_(static_cast<int64_t>(options.real("bucket_mb") * 1024 * 1024)),
        overlap_(options.boolean("overlap")),
        reduce_bf16_(options.text("reduce_dtype") == "bf16") {
    if (overlap_ && reduce_bf16_) options.fail("overlap", "false with reduce_dtype = 'bf16'");
  }

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    comm_ = &comm;
    adamw_ = env.adamw;
    groups_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/1, torch::kFloat32, env.compute_dtype);
    for (ParameterGroup& group : groups_) {
      // Autograd adds each micro-step's gradient into this fp32 buffer in
      // place, also for bf16 parameters (their gradient is widened exactly
      // as it is added), so accumulation error stays fp32's and no bf16
      // gradient buffer exists.
      grads_.push_back(torch::zeros_like(group.values));
      bind_gradients(group, grads_.back());
      states_.push_back(adamw_init(group.values));
    }
    build_buckets();
  }


  void backward(const torch::Tensor& loss, const MicroStep& micro) override {
    armed_ = overlap_ && micro.is_last && comm_->world_size() > 1;
    loss.backward();
    armed_ = false;
  }

  double reduce_gradients_and_norm() override {
    torch::NoGradGuard no_grad;
    for (Bucket& bucket : buckets_) {
      if (reduce_bf16_) {
        torch::Tensor narrow = bucket.grads.to(torch::kBFloat16);
        comm_->all_reduce_sum(narrow);
        bucket.grads.copy_(narrow);
      } else if (!bucket.work) {
        bucket.work = comm_->all_reduce_sum_async(bucket.grads);
      }
    }
    for (Bucket& bucket : buckets_) {
      if (bucket.work) bucket.work->wait();
      bucket.work.reset();
      bucket.ready = 0;
    }
    double squares = 0.0;
    for (const torch::Tensor& grads : grads_) squares += squared_norm(grads);
    return std::sqrt(squares);
  }

  void apply_update(const UpdateArgs& args) override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < groups_.size(); ++g) {
      // The bf16 compute copy is written by the update's own pass.
      adamw_update(groups_[g].values, grads_[g], states_[g], adamw_, groups_[g].decay, args.lr, args.adam_step,
                   args.grad_scale, separate_compute(groups_[g]) ? groups_[g].compute : torch::Tensor());
    }
    discard_gradients();
  }

  void discard_gradients() override {
    for (torch::Tensor& grads : grads_) grads.zero_();
  }

  MemoryReport memory() const override {
    MemoryReport report;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParameterGroup& group = groups_[g];
      const int64_t bytes = group.values.numel() * 4;
      const bool separate = separate_compute(group);
      report.parameter_bytes += group.compute.numel() * group.compute.element_size();
      report.gradient_bytes += bytes;
      report.optimizer_bytes += 2 * bytes + (separate ? bytes : 0);  // moments, and master weights if separate
    }
    return report;
  }

  std::vector<FlatSlice> gradient_slices() const override {
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, grads_[g]});
    return slices;
  }

  std::vector<StateSlice> state_slices() override {
    std::vector<StateSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) {
      slices.push_back({g, 0, groups_[g].values, states_[g].exp_avg, states_[g].exp_avg_sq});
    }
    return slices;
  }

  void state_loaded() override {
    for (ParameterGroup& group : groups_) sync_compute(group);
  }

  std::vector<FlatSlice> parameter_slices() const override {
    std::vector<FlatSlice> slices;
    for (size_t g = 0; g < groups_.size(); ++g) slices.push_back({g, 0, groups_[g].values});
    return slices;
  }

 private:
  void build_buckets() {
    const int64_t bucket_numel = std::max<int64_t>(1, bucket_bytes_ / 4);
    for (size_t g = 0; g < groups_.size(); ++g) {
      const std::vector<ParameterSlot>& slots = groups_[g].slots;
      int64_t end = groups_[g].numel;  // buckets grow backwards from the buffer's end
      int64_t begin = end;
      int count = 0;
      for (size_t i = slots.size(); i-- > 0;) {
        if (count > 0 && end - slots[i].offset > bucket_numel) {
          add_bucket(g, begin, end, count);
          end = begin;
          count = 0;
        }
        begin = slots[i].offset;
        bucket_of_[slots[i].param.unsafeGetTensorImpl()] = buckets_.size();
        ++count;
      }
      if (count > 0) add_bucket(g, begin, end, count);
    }
    if (!overlap_) return;
    for (const ParameterGroup& group : groups_) {
      for (const ParameterSlot& slot : group.slots) {
        const size_t index = bucket_of_.at(slot.param.unsafeGetTensorImpl());
        std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(slot.param);
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
              on_gradient_ready(index);
              return outputs;
            }));
        accumulators_.push_back(std::move(accumulator));  // the hooks live as long as their nodes
      }
    }
  }

  void add_bucket(size_t group, int64_t begin, int64_t end, int count) {
    Bucket bucket;
    bucket.grads = grads_[group].narrow(0, begin, end - begin);
    bucket.parameters = count;
    buckets_.push_back(std::move(bucket));
  }

  // Runs on the autograd thread after a parameter's gradient was added.
  void on_gradient_ready(size_t index) {
    if (!armed_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Bucket& bucket = buckets_[index];
    if (++bucket.ready == bucket.parameters && !bucket.work) {
      bucket.work = comm_->all_reduce_sum_async(bucket.grads);
    }
  }

  int64_t bucket_bytes_;
  bool overlap_;
  bool reduce_bf16_;
  bool armed_ = false;
  Comm* comm_ = nullptr;
  AdamWConfig adamw_;
  std::vector<ParameterGroup> groups_;
  std::vector<torch::Tensor> grads_;  // fp32 accumulators, bound as the parameters' .grad
  std::vector<AdamWState> states_;
  std::vector<Bucket> buckets_;
  std::map<const void*, size_t> bucket_of_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::mutex mutex_;
};

constexpr KeySpec kKeys[] = {
    {"bucket_mb", ValueType::Float, "25.0", "gradient bytes per all-reduce bucket (whole parameters)", 1e-6, 1e6},
    {"overlap", ValueType::Bool, "false", "start each bucket's all-reduce during the last backward"},
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of the gradient all-reduce", -kNoLimit, kNoLimit, "fp32|bf16"},
};

Component* create(const Options& options, const Context&) { return new DdpStrategy(options); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Strategy, "ddp", "0.1.0",
                                           "data parallel: full gradients all-reduced in buckets",
                                           TRAINER_TORCH_VERSION, kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
