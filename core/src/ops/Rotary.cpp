// split_qkv_rotary: the autograd function around the CUDA kernels of
// Rotary.cu, and the composite CPU path (which autograd differentiates).
#include "trainer/ops/Rotary.h"

#include <cmath>
#include <utility>

#include <torch/autograd.h>

#include "Dispatch.h"

namespace trainer::ops {

RotaryTables RotaryTables::make(int64_t seq, int64_t head_dim, double theta, torch::Dtype dtype, torch::Device device,
                                const RopeScaling& scaling) {
  // Hugging Face computes the tables in fp32; an fp64 reference gets fp64.
  const auto type = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto options = torch::TensorOptions().dtype(type).device(device);
  torch::Tensor inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, options.dtype(torch::kInt64)).to(type) / head_dim);
  if (scaling.factor != 1.0) {  // Hugging Face's _compute_llama3_parameters, the same operations
    const double low_wavelen = scaling.original_max_positions / scaling.low_freq_factor;
    const double high_wavelen = scaling.original_max_positions / scaling.high_freq_factor;
    const torch::Tensor wavelen = 2 * M_PI / inv_freq;
    const torch::Tensor stretched = torch::where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq);
    const torch::Tensor smooth = (scaling.original_max_positions / wavelen - scaling.low_freq_factor) /
                                 (scaling.high_freq_factor - scaling.low_freq_factor);
    const torch::Tensor smoothed = (1 - smooth) * stretched / scaling.factor + smooth * stretched;
    const torch::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
    inv_freq = torch::where(medium, smoothed, stretched);
  }
  const torch::Tensor angles = torch::outer(torch::arange(seq, options), inv_freq);
  return RotaryTables{angles.cos().contiguous(), angles.sin().contiguous()};
}

RotaryTables RotaryTables::at_positions(const torch::Tensor& position_ids) const {
  TORCH_CHECK(!per_token, "RotaryTables::at_positions: the tables are per token already");
  TORCH_CHECK(position_ids.dim() == 2, "RotaryTables::at_positions: position_ids must be [batch, seq]");
  const torch::Tensor rows = position_ids.reshape({-1}).to(cos.device(), torch::kInt64);
  RotaryTables tables{cos.index_select(0, rows), sin.index_select(0, rows)};
  tables.per_token = true;
  return tables;
}

namespace {

struct Shape {
  int64_t batch, seq, head_dim;
};

Shape shape_of(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 3, "split_qkv_rotary: qkv must be [batch, seq, width]");
  const int64_t slots = heads + 2 * kv_heads;
  TORCH_CHECK(qkv.size(2) % slots == 0, "split_qkv_rotary: width ", qkv.size(2),
              " is not (heads + 2 kv_heads) x head_dim");
  const Shape s{qkv.size(0), qkv.size(1), qkv.size(2) / slots};
  TORCH_CHECK(s.head_dim % 2 == 0, "split_qkv_rotary: head_dim must be even");
  return s;
}

// The tables suit qkv: [>= seq, head_dim / 2] each, of the dtype the
// arithmetic runs in (fp64 for fp64 inputs, fp32 otherwise), on qkv's device.
// The rows the tables repeat with: positions (every sequence from 0) or
// every token of the batch (per-token tables).
int64_t table_period(const Shape& s, const RotaryTables& tables) { return tables.per_token ? s.batch * s.seq : s.seq; }

void check_tables(const torch::Tensor& qkv, const Shape& s, const RotaryTables& tables) {
  const torch::Dtype want = qkv.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const int64_t rows = table_period(s, tables);
  for (const auto& [name, table] :
       {std::pair<const char*, const torch::Tensor&>{"cos", tables.cos}, {"sin", tables.sin}}) {
    TORCH_CHECK(table.defined(), "split_qkv_rotary: the ", name, " table is undefined");
    TORCH_CHECK(table.dim() == 2 && table.size(0) >= rows && table.size(1) == s.head_dim / 2 &&
                    (!tables.per_token || table.size(0) == rows),
                "split_qkv_rotary: the ", name, " table is ", table.sizes(), "; expected [",
                tables.per_token ? "" : "at least ", rows, ", ", s.head_dim / 2, "]");
    TORCH_CHECK(table.scalar_type() == want, "split_qkv_rotary: the ", name, " table is ", table.scalar_type(),
                "; expected ", want, " for ", qkv.scalar_type(), " inputs");
    TORCH_CHECK(table.device() == qkv.device(), "split_qkv_rotary: the ", name, " table is on ", table.device(),
                ", qkv on ", qkv.device());
  }
}

// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the pairs (i, i + d/2),
// the same arithmetic as Hugging Face's x * cos + rotate_half(x) * sin.
torch::Tensor rotate(const torch::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor wide = x.to(accumulate_dtype(x));
  const auto rows = [&](const torch::Tensor& table) {
    return tables.per_token ? table.reshape({x.size(0), x.size(1), 1, half})
                            : table.narrow(0, 0, x.size(1)).reshape({1, x.size(1), 1, half});
  };
  const torch::Tensor cos = rows(tables.cos), sin = rows(tables.sin);
  const torch::Tensor x1 = wide.narrow(-1, 0, half), x2 = wide.narrow(-1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
}

#ifdef TRAINER_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct QkvRotaryFunction : torch::autograd::Function<QkvRotaryFunction> {
  // `period`: the table rows the kernels index, token % period (the
  // sequence length, or every token of the batch for per-token tables).
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv_in, int64_t heads, int64_t kv_heads,
                               const torch::Tensor& cos, const torch::Tensor& sin, int64_t period) {
    const Shape s = shape_of(qkv_in, heads, kv_heads);
    // Rows must be evenly spaced with a contiguous last dimension (a view of
    // a wider projection output is); anything else is copied first.
    const bool even = qkv_in.stride(2) == 1 && qkv_in.stride(0) == qkv_in.size(1) * qkv_in.stride(1);
    const torch::Tensor qkv = even ? qkv_in : qkv_in.contiguous();
    const auto options = qkv.options();
    torch::Tensor q = torch::empty({s.batch, s.seq, heads, s.head_dim}, options);
    torch::Tensor k = torch::empty({s.batch, s.seq, kv_heads, s.head_dim}, options);
    torch::Tensor v = torch::empty({s.batch, s.seq, kv_heads, s.head_dim}, options);
    const KernelLaunch launch("qkv_rotary_forward", {qkv, q, k, v, cos, sin});
    kernels::qkv_rotary_forward(kernel_dtype(qkv), qkv.data_ptr(), qkv.stride(1), q.data_ptr(), k.data_ptr(),
                                v.data_ptr(), cos.data_ptr(), sin.data_ptr(), s.batch * s.seq, period,
                                static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(s.head_dim),
                                launch.stream());
    check_launch("qkv_rotary_forward");
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    ctx->saved_data["width"] = qkv.size(2);
    ctx->saved_data["period"] = period;
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t heads = ctx->saved_data["heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    const torch::Tensor cos = ctx->saved_data["cos"].toTensor(), sin = ctx->saved_data["sin"].toTensor();
    const torch::Tensor& like = grads[0].defined() ? grads[0] : grads[1].defined() ? grads[1] : grads[2];
    const int64_t batch = like.size(0), seq = like.size(1), head_dim = like.size(3);
    auto dense = [&](const torch::Tensor& g, int64_t h) {
      return g.defined() ? g.contiguous() : torch::zeros({batch, seq, h, head_dim}, like.options());
    };
    const torch::Tensor dq = dense(grads[0], heads), dk = dense(grads[1], kv_heads), dv = dense(grads[2], kv_heads);
    torch::Tensor dqkv = torch::empty({batch, seq, ctx->saved_data["width"].toInt()}, like.options());
    const KernelLaunch launch("qkv_rotary_backward", {dqkv, dq, dk, dv, cos, sin});
    kernels::qkv_rotary_backward(kernel_dtype(dqkv), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dqkv.data_ptr(),
                                 cos.data_ptr(), sin.data_ptr(), batch * seq, ctx->saved_data["period"].toInt(),
                                 static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(head_dim),
                                 launch.stream());
    check_launch("qkv_rotary_backward");
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

QkvHeads split_qkv_rotary_reference(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                    const RotaryTables& tables) {
  const Shape s = shape_of(qkv, heads, kv_heads);
  check_tables(qkv, s, tables);
  const int64_t d = s.head_dim;
  auto part = [&](int64_t first, int64_t count) {
    return qkv.narrow(-1, first * d, count * d).reshape({s.batch, s.seq, count, d});
  };
  return QkvHeads{rotate(part(0, heads), tables), rotate(part(heads, kv_heads), tables),
                  part(heads + kv_heads, kv_heads).contiguous()};
}

QkvHeads split_qkv_rotary(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads, const RotaryTables& tables) {
#ifdef TRAINER_CUDA_KERNELS
  if (use_kernels(qkv)) {
    const Shape s = shape_of(qkv, heads, kv_heads);
    check_tables(qkv, s, tables);
    // The kernels index the tables as dense rows.
    const variable_list out = QkvRotaryFunction::apply(qkv, heads, kv_heads, tables.cos.contiguous(),
                                                       tables.sin.contiguous(), table_period(s, tables));
    return QkvHeads{out[0], out[1], out[2]};
  }
#endif
  return split_qkv_rotary_reference(qkv, heads, kv_heads, tables);
}

}  // namespace trainer::ops
