// Logging facade over spdlog. It keeps spdlog (and the fmt it was built with)
// out of every translation unit that sees LibTorch headers, whose own fmt
// would otherwise shadow it.
#pragma once

#include <string>

namespace trainer::log {

/// Messages at or above warning are printed by every rank; info and debug only
/// by the rank set with set_rank(0). Thread-safe.
void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);

/// Sets the calling process's rank: it prefixes messages on every rank but 0
/// and silences info on those ranks.
void set_rank(int rank, int world_size);

/// Raises verbosity to debug (true) or restores info (false).
void set_verbose(bool verbose);

}  // namespace trainer::log
