// Logger `tensorboard`: TensorBoard event files (events.out.tfevents.*) in a
// directory of the run, one scalar per metric and step, so that
// `tensorboard --logdir runs/` overlays the runs of an A/B experiment.
//
// A file is a sequence of records: uint64 length, uint32 masked CRC-32C of
// the length, the bytes, uint32 masked CRC-32C of the bytes (TFRecord). Each
// record is a serialized tensorflow.Event protobuf; the few fields written
// here are encoded by hand (wire format: varint keys, fixed64 doubles,
// fixed32 floats, length-delimited strings and messages):
//   Event { double wall_time = 1; int64 step = 2; string file_version = 3;
//           Summary summary = 5; SessionLog session_log = 6; }
//   Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
//   SessionLog { Status status = 1; }  (START = 1: a resumed run; TensorBoard
//   then drops what a crashed run wrote past the checkpoint)
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <boost/crc.hpp>

#include "trainer/Logger.h"
#include "trainer/util/StepFile.h"

namespace {

using namespace trainer;

// Wire format pieces.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
template <typename T>
void fixed(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian, as the wire format
  out.append(bytes, sizeof(T));
}
void key(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void bytes_field(std::string& out, int field, const std::string& value) {
  key(out, field, 2);
  varint(out, value.size());
  out += value;
}

uint32_t masked_crc32c(const char* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;  // CRC-32C (Castagnoli)
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// TensorBoard's tags, in torchtitan's naming where it has one.
struct Scalar {
  const char* field;  // the metric_fields name
  const char* tag;
  double scale;
};
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr Scalar kScalars[] = {
    {"loss", "loss_metrics/global_avg_loss", 1.0},
    {"grad_norm", "grad_norm", 1.0},
    {"lr", "lr", 1.0},
    {"tokens_per_second", "throughput(tps)", 1.0},
    {"mfu", "mfu(%)", 100.0},
    {"mfu_datasheet", "mfu_datasheet(%)", 100.0},
    {"memory_allocated_bytes", "memory/max_allocated(GiB)", 1.0 / kGiB},
    {"memory_reserved_bytes", "memory/max_reserved(GiB)", 1.0 / kGiB},
    {"rss_bytes", "memory/rss(GiB)", 1.0 / kGiB},
    {"target_tokens", "target_tokens", 1.0},
    {"pad_fraction", "data/pad_fraction", 1.0},
    {"documents", "data/documents", 1.0},
    {"step_seconds", "time/step_seconds", 1.0},
    {"data_seconds", "time/data_seconds", 1.0},
};

class TensorBoardLogger final : public Logger {
 public:
  TensorBoardLogger(const Options& options, const Context& context)
      : dir_(claim_run_path(options, "dir", context, true)) {}

  void start(const RunInfo& info) override {
    std::filesystem::create_directories(dir_);
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    // A resumed run writes a file of its own (TensorBoard reads a directory's files in name order).
    file_.open_binary(dir_ / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<long long>(now()), host,
                                         getpid(), info.first_step));
    std::string event;
    key(event, 1, 1);
    fixed(event, now());
    bytes_field(event, 3, "brain.Event:2");
    write(event);
    // SessionLog START at the first step this run logs: TensorBoard drops the events of the directory's earlier
    // files from that step on (a crashed run's steps past its checkpoint; an earlier run's, for a fresh run into
    // the same directory, whose other files it replaces), as SummaryWriter's purge_step does.
    std::string started;
    key(started, 1, 1);
    fixed(started, now());
    key(started, 2, 0);
    varint(started, static_cast<uint64_t>(info.first_step + 1));
    std::string session_log;
    key(session_log, 1, 0);
    varint(session_log, 1);                // START
    bytes_field(started, 7, session_log);  // Event.session_log (field 7; 6 is log_message)
    write(started);
  }

  void log(const StepRecord& r) override {
    std::string summary;
    const auto fields = metric_fields(r);
    for (const Scalar& s : kScalars) {
      for (const MetricField& f : fields) {
        if (std::string_view(f.name) != s.field || !std::isfinite(f.value)) continue;
        std::string value;
        bytes_field(value, 1, s.tag);
        key(value, 2, 5);
        fixed(value, static_cast<float>(f.value * s.scale));
        bytes_field(summary, 1, value);
      }
    }
    std::string event;
    key(event, 1, 1);
    fixed(event, now());
    key(event, 2, 0);
    varint(event, static_cast<uint64_t>(r.step));
    bytes_field(event, 5, summary);
    write(event);
  }

  void finish() override { file_.finish(); }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // One TFRecord, flushed: a crash leaves only whole records.
  void write(const std::string& data) {
    const uint64_t length = data.size();
    char header[8];
    std::memcpy(header, &length, 8);
    const uint32_t length_crc = masked_crc32c(header, 8), data_crc = masked_crc32c(data.data(), data.size());
    std::string record(header, 8);
    fixed(record, length_crc);
    record += data;
    fixed(record, data_crc);
    file_.write(record);
  }

  std::filesystem::path dir_;
  StepFile file_;
};

constexpr KeySpec kKeys[] = {
    {"dir", ValueType::String, "'tensorboard'", "directory of the event files, relative to the run's output directory"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, TensorBoardLogger, "tensorboard", "0.1.0", "TensorBoard event files (scalars per step)",
                      kKeys)
