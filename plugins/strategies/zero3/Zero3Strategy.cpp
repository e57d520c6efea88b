// Strategy `zero3` (ZeRO stage 3): parameters sharded too. One file: the
// unit protocol (gather, hooks, reduce, release) only reads as a whole.
//
//   state        | per rank
//   parameters   | 1/world of each flat group (fp32); a unit's full
//                | parameters exist only while it runs forward or backward
//   gradients    | 1/world: an fp32 shard accumulator
//   AdamW m, v   | 1/world
//
// The model declares units (embedding, blocks, head). Before a unit's
// forward its parameters are all-gathered into a per-unit buffer, which is
// released after the unit's forward. A hook on the unit's output gathers it
// again before the unit's backward and binds a per-unit gradient buffer;
// once every parameter of the unit has its gradient, that buffer is
// reduce-scattered and added into the shard accumulator, and both buffers
// are released. With `prefetch` = k (default 1) the all-gathers of the next
// k units are in flight while a unit computes (the following units in
// forward, the preceding ones in backward), and a unit's reduce-scatter
// runs while the units before it compute backward; it is added into the
// shard when the next one starts, or when backward ends. So at most 2 + k
// units are gathered at a time (2 with prefetch 0). The order of every sum
// is the same either way: prefetch changes when results arrive, not them.
//
// Shards are the same slices of the same flat layout as zero1/zero2
// (flatten_parameters), so at world size 1 the arithmetic is ddp's. A unit
// covers one contiguous range of each group; the slice of that range each
// rank holds can differ in length, so collectives pad it to the longest.
//
// With shard_group_size = s < world (hybrid sharding) "world" above reads
// s: units are gathered and their gradients reduce-scattered within each
// group of s ranks; in the step's last backward each unit's piece of the
// shard, once final, is summed over the groups (fp32, ShardGroups) while
// the units before it compute.
//
// With StrategyEnv::exact_gradients (reproducible mode) the core sums the
// gradients: units are gathered and released as above, but no gradient
// buffer is bound and nothing is reduce-scattered.
#include <atomic>
#include <cmath>
#include <mutex>
#include <stdexcept>

#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "trainer/Errors.h"
#include "trainer/sharding/ShardedStrategy.h"

namespace {

using namespace trainer;

// Frees a buffer's memory but keeps the tensor (and every view of it, such
// as tensors autograd saved) pointing at the same storage object.
void release(torch::Tensor& buffer) {
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, buffer.device()));
  storage->set_nbytes(0);
}

// On the buffer's own device: the allocator takes the current one.
void reallocate(torch::Tensor& buffer) {
  const c10::DeviceGuard on_its_device(buffer.device());
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(buffer.numel()) * buffer.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

struct Piece {  // a rank's part of a unit's range, in group offsets
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// One unit's part of one group: the range [begin, end) and its pieces.
struct UnitRange {
  size_t group = 0;
  int64_t begin = 0, end = 0;
  std::vector<Piece> pieces;     // per rank
  int64_t longest = 0;           // collectives pad every piece to this
  torch::Tensor values;          // gathered parameters (storage released when not gathered)
  torch::Tensor grads;           // gradient buffer while the unit runs backward
  torch::Tensor send, received;  // an all-gather in flight: this rank's piece and every rank's
  std::unique_ptr<CommWork> gathering;
};

// A unit's reduce-scatter in flight: each range's result, added into the
// shard accumulator once it has arrived.
struct PendingReduction {
  std::vector<std::pair<size_t, torch::Tensor>> received;  // (range index, this rank's summed piece)
  std::vector<torch::Tensor> sent;                         // kept alive until the work completes
  std::vector<std::unique_ptr<CommWork>> works;
  size_t unit = 0;
};

struct Unit {
  std::string name;
  std::vector<UnitRange> ranges;
  std::vector<torch::Tensor> params;
  std::vector<std::pair<size_t, int64_t>> param_at;  // per param: (range, offset in the range)
  size_t ready = 0;                                  // parameters whose gradient arrived in this backward
  bool gathered = false;   // values hold the parameters, or will once the gathers in flight arrive
  bool in_flight = false;  // gathers in flight (prefetched)
  bool entered = false;    // entered in the current forward
  bool in_backward = false;
};

class Zero3Strategy final : public ShardedStrategy, public UnitHooks {
 public:
  Zero3Strategy(const Options& options, const Context& context)
      : ShardedStrategy(options, "zero3", context), prefetch_(options.integer("prefetch")) {}

  void setup(Model& model, Comm& comm, const StrategyEnv& env) override {
    join(comm, env);
    compute_dtype_ = env.compute_dtype;
    model_ = &model;
    const std::vector<NamedParameter> params = model.parameters();
    const std::vector<ParameterUnit> declared = model.units();
    if (declared.empty()) {
      throw InputError("strategy 'zero3' needs a model that declares its units (Model::units); this one declares none");
    }
    std::vector<ParameterGroup> layout =
        flatten_parameters(params, env.device, shard_padding(shard_comm().world_size()));
    for (ParameterGroup& group : layout) {
      // The shard's fp32 master values live only here: the full buffer goes.
      const Shard shard = shard_of(group.padded_numel, shard_comm().rank(), shard_comm().world_size());
      optimizer().add_group(shard, unpadded(group, shard), group,
                            group.values.narrow(0, shard.offset, shard.numel).clone());
    }
    build_units(declared, layout);
    // The full flat buffers go out of scope here; parameters now view the
    // per-unit buffers, whose memory is released until a unit is gathered.
    for (Unit& unit : units_) release_unit(unit);
    install_gradient_hooks(params);
    model.set_unit_hooks(this);
  }

  ~Zero3Strategy() override {
    if (model_) model_->set_unit_hooks(nullptr);
  }

  // Units are gathered and released around each use, with host state per atom: never replayed.
  bool replayable_atoms() const override { return false; }

  LossSum forward(Model& model, const Batch& batch) override {
    for (Unit& unit : units_) unit.entered = false;
    next_unit_ = 0;
    in_forward_ = true;
    LossSum out = model.forward(batch);
    in_forward_ = false;
    for (const Unit& unit : units_) {
      if (!unit.entered) throw TrainingError(fmt::format("zero3: the model never entered its unit '{}'", unit.name));
    }
    return out;
  }

  void backward(const torch::Tensor& loss, const MicroStep& micro) override {
    last_micro_ = micro.is_last;
    in_backward_pass_ = true;
    loss.backward();
    in_backward_pass_ = false;
    // Units whose parameters did not all receive a gradient are reduced now.
    for (Unit& unit : units_) {
      if (unit.in_backward) finish_backward(unit);
    }
    complete_reduction();
    // A unit prefetched for a backward that did not come (none used its output).
    for (Unit& unit : units_) release_unit(unit);
  }

  // UnitHooks
  void before_unit(size_t index) override {
    Unit& unit = units_.at(index);
    // Each unit's all-gather is a collective: a rank that skipped or
    // reordered a unit would pair it with another rank's next one. Refused
    // here, before this rank's gather, so the job ends naming it.
    if (in_forward_ && !in_backward_pass_) {
      if (index != next_unit_) {
        in_forward_ = false;
        throw TrainingError(fmt::format(
            "zero3: this rank entered unit '{}' where unit '{}' comes next: every rank must run the model's units "
            "in their declared order whatever the data (Model.h); a model that skips units needs ddp, zero1 or "
            "zero2",
            unit.name, next_unit_ < units_.size() ? units_[next_unit_].name : "(none)"));
      }
      next_unit_ = index + 1;
    }
    unit.entered = true;
    gather(unit);
    // The next units' parameters travel while this one computes (not in a
    // recomputation inside backward, whose next units are done).
    if (torch::GradMode::is_enabled() && !in_backward_pass_) {
      for (size_t next = index + 1; next < units_.size() && next <= index + static_cast<size_t>(prefetch_); ++next) {
        start_gather(units_[next]);
      }
    }
  }

  torch::Tensor after_unit(size_t index, const torch::Tensor& output) override {
    release_unit(units_.at(index));
    if (output.requires_grad()) {
      // Runs when the unit's output gradient is complete, before any of the
      // unit's backward operations.
      torch::Tensor hooked = output;
      hooked.register_hook([this, index](const torch::Tensor& grad) {
        begin_backward(units_.at(index));
        return grad;
      });
    }
    return output;
  }

  MemoryReport memory() const override {
    MemoryReport report = ShardedStrategy::memory();
    report.peak_gathered_parameter_bytes = peak_gathered_bytes_;
    report.peak_transient_bytes = peak_transient_bytes_;
    return report;
  }
  // state_loaded: units are gathered from the shards on demand, so nothing
  // derives from them (ShardedStrategy's, without full parameters).

 private:
  void build_units(const std::vector<ParameterUnit>& declared, const std::vector<ParameterGroup>& layout) {
    std::vector<std::vector<UnitSpan>> spans;
    try {
      spans = unit_spans(declared, layout);
    } catch (const std::invalid_argument& e) {
      throw InputError(fmt::format("zero3: {}", e.what()));
    }
    torch::NoGradGuard no_grad;
    for (size_t u = 0; u < declared.size(); ++u) {
      Unit unit;
      unit.name = declared[u].name;
      for (const UnitSpan& span : spans[u]) {
        // One gather per group a unit spans: its elements must be one range there.
        for (const UnitRange& other : unit.ranges) {
          if (other.group == span.group) {
            throw InputError(fmt::format("zero3: unit '{}' is not contiguous in the parameter layout at '{}'",
                                         unit.name, span.slots.front()->name));
          }
        }
        UnitRange r;
        r.group = span.group;
        r.begin = span.begin;
        r.end = span.end;
        r.values =
            torch::empty({r.end - r.begin}, optimizer().groups()[r.group].values.options().dtype(compute_dtype_));
        for (int rank = 0; rank < shard_comm().world_size(); ++rank) {
          const Shard s = shard_of(layout[r.group].padded_numel, rank, shard_comm().world_size());
          Piece p{std::max(r.begin, s.offset), std::min(r.end, s.offset + s.numel)};
          if (p.end <= p.begin) p = Piece{};  // this rank holds none of the range
          r.longest = std::max(r.longest, p.size());
          r.pieces.push_back(p);
        }
        // Parameters become views of the unit's buffers.
        for (const ParameterSlot* slot : span.slots) {
          const torch::Tensor in_unit = r.values.narrow(0, slot->offset - r.begin, slot->numel);
          in_unit.copy_(slot->param.reshape(-1));
          slot->param.set_data(in_unit.view(slot->param.sizes()));
          unit.params.push_back(slot->param);
          unit.param_at.emplace_back(unit.ranges.size(), slot->offset - r.begin);
          unit_of_[slot->param.unsafeGetTensorImpl()] = units_.size();
        }
        unit.ranges.push_back(std::move(r));
      }
      units_.push_back(std::move(unit));
    }
  }

  void install_gradient_hooks(const std::vector<NamedParameter>& params) {
    for (const NamedParameter& p : params) {
      const size_t index = unit_of_.at(p.tensor.unsafeGetTensorImpl());
      std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            Unit& unit = units_.at(index);
            if (unit.in_backward && ++unit.ready == unit.params.size()) finish_backward(unit);
            return outputs;
          }));
      accumulators_.push_back(std::move(accumulator));
    }
  }

  // Allocates the unit's buffers and starts its all-gathers; the parameters
  // are usable after finish_gather.
  void start_gather(Unit& unit) {
    if (unit.gathered) return;
    torch::NoGradGuard no_grad;
    const int rank = shard_comm().rank();
    for (UnitRange& r : unit.ranges) {
      reallocate(r.values);
      const OptimizerShard& s = optimizer().groups()[r.group];
      const Piece& mine = r.pieces[rank];
      gathered_bytes_ += r.values.numel() * r.values.element_size();
      count_transient(bytes_of(r.values));
      if (shard_comm().world_size() == 1) {  // the shard is the whole range: one copy (and cast), no collective
        r.values.copy_(s.values.narrow(0, r.begin - s.shard.offset, r.values.numel()));
        continue;
      }
      // Gathered in the compute dtype: bf16 halves the traffic.
      r.send = torch::zeros({r.longest}, r.values.options());
      if (mine.size() > 0) {
        r.send.narrow(0, 0, mine.size()).copy_(s.values.narrow(0, mine.begin - s.shard.offset, mine.size()));
      }
      r.received = torch::empty({r.longest * shard_comm().world_size()}, r.values.options());
      count_transient(bytes_of(r.send) + bytes_of(r.received));
      r.gathering = shard_comm().all_gather_async(r.send, r.received);
      unit.in_flight = true;
    }
    unit.gathered = true;
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  }

  // Waits for the unit's all-gathers and lays the pieces out in its buffers.
  void finish_gather(Unit& unit) {
    if (!unit.in_flight) return;
    torch::NoGradGuard no_grad;
    for (UnitRange& r : unit.ranges) {
      r.gathering->wait();
      for (size_t p = 0; p < r.pieces.size(); ++p) {
        const Piece& piece = r.pieces[p];
        if (piece.size() == 0) continue;
        r.values.narrow(0, piece.begin - r.begin, piece.size())
            .copy_(r.received.narrow(0, p * r.longest, piece.size()));
      }
      r.gathering.reset();
      count_transient(-bytes_of(r.send) - bytes_of(r.received));
      r.send = r.received = torch::Tensor();
    }
    unit.in_flight = false;
  }

  void gather(Unit& unit) {
    start_gather(unit);
    finish_gather(unit);
  }

  void release_unit(Unit& unit) {
    finish_gather(unit);  // never free a buffer a collective still writes into
    if (!unit.gathered && !unit.ranges.empty() && unit.ranges.front().values.storage().nbytes() == 0) return;
    for (UnitRange& r : unit.ranges) {
      if (unit.gathered) {
        gathered_bytes_ -= r.values.numel() * r.values.element_size();
        count_transient(-bytes_of(r.values));
      }
      release(r.values);
    }
    unit.gathered = false;
  }

  void begin_backward(Unit& unit) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (unit.in_backward) return;
    gather(unit);
    // The preceding units run backward next: their parameters travel now.
    const size_t index = static_cast<size_t>(&unit - units_.data());
    for (size_t k = 1; k <= static_cast<size_t>(prefetch_) && k <= index; ++k) start_gather(units_[index - k]);
    // fp32 whatever the compute dtype: autograd widens bf16 gradients exactly as it adds them.
    // None with exact gradients: the core sums them.
    for (UnitRange& r : unit.ranges) {
      if (exact_gradients()) break;
      r.grads = torch::zeros(r.values.sizes(), r.values.options().dtype(torch::kFloat32));
      count_transient(bytes_of(r.grads));
    }
    for (size_t i = 0; i < unit.params.size() && !exact_gradients(); ++i) {
      const auto& [range, offset] = unit.param_at[i];
      torch::Tensor& param = unit.params[i];
      param.mutable_grad() = unit.ranges[range].grads.narrow(0, offset, param.numel()).view(param.sizes());
    }
    unit.ready = 0;
    unit.in_backward = true;
  }

  // Starts the reduce-scatter of the unit's gradient (added into the shard
  // accumulators, never overwritten, by complete_reduction) and releases
  // its buffers. The previous unit's reduction completes first: one in flight.
  void finish_backward(Unit& unit) {
    torch::NoGradGuard no_grad;
    if (exact_gradients()) {  // nothing to reduce: the unit's parameters go
      unit.in_backward = false;
      release_unit(unit);
      return;
    }
    complete_reduction();
    const int world = shard_comm().world_size();
    PendingReduction pending;
    pending.unit = static_cast<size_t>(&unit - units_.data());
    int64_t grad_bytes = 0;  // the gradient buffers, freed below once no parameter views them
    for (const UnitRange& r : unit.ranges) grad_bytes += bytes_of(r.grads);
    for (size_t k = 0; k < unit.ranges.size(); ++k) {
      UnitRange& r = unit.ranges[k];
      OptimizerShard& s = optimizer().groups()[r.group];
      if (world == 1 && reduce_dtype() == torch::kFloat32) {  // a reduce-scatter over one rank adds the whole range
        torch::Tensor range = s.gradient.narrow(0, r.begin - s.shard.offset, r.grads.numel());
        range.add_(r.grads);
        if (last_micro_) shard_groups().start_sum_over_replicas(range);
        r.grads = torch::Tensor();
        continue;
      }
      torch::Tensor send = torch::zeros({r.longest * world}, r.grads.options().dtype(reduce_dtype()));
      for (int p = 0; p < world; ++p) {
        const Piece& piece = r.pieces[p];
        if (piece.size() == 0) continue;
        send.narrow(0, p * r.longest, piece.size()).copy_(r.grads.narrow(0, piece.begin - r.begin, piece.size()));
      }
      torch::Tensor received = torch::empty({r.longest}, send.options());
      count_transient(bytes_of(send) + bytes_of(received));
      pending.works.push_back(shard_comm().reduce_scatter_sum_async(send, received));
      pending.received.emplace_back(k, received);
      pending.sent.push_back(send);
      r.grads = torch::Tensor();
    }
    for (torch::Tensor& param : unit.params) param.mutable_grad() = torch::Tensor();
    count_transient(-grad_bytes);
    unit.in_backward = false;
    release_unit(unit);
    if (!pending.works.empty()) reduction_ = std::make_unique<PendingReduction>(std::move(pending));
  }

  // Waits for the reduce-scatter in flight and adds this rank's piece of it
  // into the shard accumulators.
  void complete_reduction() {
    if (!reduction_) return;
    torch::NoGradGuard no_grad;
    const std::unique_ptr<PendingReduction> pending = std::move(reduction_);
    const Unit& unit = units_.at(pending->unit);
    for (size_t i = 0; i < pending->works.size(); ++i) {
      pending->works[i]->wait();
      const auto& [k, received] = pending->received[i];
      const UnitRange& r = unit.ranges[k];
      OptimizerShard& s = optimizer().groups()[r.group];
      const Piece& mine = r.pieces[shard_comm().rank()];
      if (mine.size() > 0) {
        torch::Tensor range = s.gradient.narrow(0, mine.begin - s.shard.offset, mine.size());
        range.add_(received.narrow(0, 0, mine.size()));
        // Hybrid: in the step's last backward this piece is final; its sum
        // over the replica groups runs behind the rest of backward.
        if (last_micro_) shard_groups().start_sum_over_replicas(range);
      }
    }
    int64_t held = 0;  // freed with `pending` on return
    for (const torch::Tensor& sent : pending->sent) held += bytes_of(sent);
    for (const auto& entry : pending->received) held += bytes_of(entry.second);
    count_transient(-held);
  }

  int64_t prefetch_;
  bool last_micro_ = false;
  std::unique_ptr<PendingReduction> reduction_;
  bool in_backward_pass_ = false;
  bool in_forward_ = false;  // inside forward(): units must come in order
  size_t next_unit_ = 0;     // the unit forward must enter next
  torch::Dtype compute_dtype_ = torch::kFloat32;
  Model* model_ = nullptr;
  std::vector<Unit> units_;
  std::map<const void*, size_t> unit_of_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::mutex mutex_;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;

  // Every buffer that lives only within a step: gathered parameters, the
  // all-gathers' and reduce-scatters' staging, the units' gradient buffers
  // (memory.json's peak_transient_bytes, held to the measured peak).
  static int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }
  void count_transient(int64_t bytes) {
    const int64_t now = transient_bytes_ += bytes;
    int64_t peak = peak_transient_bytes_.load();
    while (now > peak && !peak_transient_bytes_.compare_exchange_weak(peak, now)) {
    }
  }
  std::atomic<int64_t> transient_bytes_{0};
  std::atomic<int64_t> peak_transient_bytes_{0};
};

constexpr KeySpec kKeys[] = {
    {"reduce_dtype", ValueType::String, "'fp32'", "dtype of each unit's gradient reduce-scatter", -kNoLimit, kNoLimit,
     "fp32|bf16"},
    {"prefetch", ValueType::Int, "1",
     "units whose all-gather is in flight while a unit computes (the next in forward, the previous in backward); "
     "0: gather each unit when it starts",
     0, 64},
    kShardGroupSizeKey,
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Strategy, Zero3Strategy, "zero3", "0.1.0",
                      "ZeRO stage 3: parameters, gradients and AdamW state sharded", kKeys)
