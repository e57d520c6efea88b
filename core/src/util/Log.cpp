// spdlog behind the logging facade; this file must never see LibTorch headers.
#include "trainer/Log.h"

#include <atomic>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace trainer::log {

namespace {
std::atomic<int> g_rank{0};

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto made = spdlog::stderr_color_mt("trainer");
    made->set_pattern("[%H:%M:%S] %^%l%$ %v");
    made->set_level(spdlog::level::info);
    return made;
  }();
  return *instance;
}
}  // namespace

void debug(const std::string& message) { logger().debug(message); }
void info(const std::string& message) {
  if (g_rank.load() == 0) logger().info(message);
}
void warn(const std::string& message) { logger().warn(message); }
void error(const std::string& message) { logger().error(message); }

void set_rank(int rank, int world_size) {
  g_rank.store(rank);
  if (world_size > 1) logger().set_pattern("[%H:%M:%S] %^%l%$ [rank " + std::to_string(rank) + "] %v");
}

void set_verbose(bool verbose) { logger().set_level(verbose ? spdlog::level::debug : spdlog::level::info); }

}  // namespace trainer::log
