// The fields of a step record as the file loggers write them (trainer/Logger.h).
#include <limits>

#include "trainer/Logger.h"

namespace trainer {

std::vector<MetricField> metric_fields(const StepRecord& r) {
  using K = MetricField::Kind;
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  auto bytes = [&](int64_t value) { return value < 0 ? unknown : static_cast<double>(value); };
  return {
      {"step", static_cast<double>(r.step), K::Integer},
      {"loss", r.loss, K::Real},
      {"grad_norm", r.grad_norm, K::Real},
      {"lr", r.lr, K::Real},
      {"target_tokens", static_cast<double>(r.target_tokens), K::Integer},
      {"samples", static_cast<double>(r.samples), K::Integer},
      {"input_tokens", static_cast<double>(r.input_tokens), K::Integer},
      {"documents", static_cast<double>(r.documents), K::Integer},
      {"pad_fraction", r.pad_fraction, K::Real},
      {"step_seconds", r.step_seconds, K::Real},
      {"skipped", r.skipped ? 1.0 : 0.0, K::Bool},
      {"tokens_per_second", r.tokens_per_second, K::Real},
      {"mfu", r.mfu, K::Real},
      {"mfu_datasheet", r.mfu_datasheet, K::Real},
      {"data_seconds", r.data_seconds, K::Real},
      {"memory_allocated_bytes", bytes(r.memory_allocated_bytes), K::Integer},
      {"memory_reserved_bytes", bytes(r.memory_reserved_bytes), K::Integer},
      {"rss_bytes", bytes(r.rss_bytes), K::Integer},
  };
}
}  // namespace trainer
