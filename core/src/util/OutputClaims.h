// Which files and directories this process's run writes, so that no two of
// its outputs are one file and no logger writes over the run's own files.
// The run registers its own outputs before any component is created; each
// logger then claims its path through claim_run_path (trainer/util/StepFile.h),
// which refuses a path that is, contains or lies inside another claim.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace trainer {

/// One output of the run and what writes it ("the run's recipe.toml").
struct OutputClaim {
  std::filesystem::path path;
  std::string owner;
  bool directory = false;
};

/// Starts a run's claims: `output_dir` (a logger may write inside it, not
/// over it) and the run's own outputs. Replaces any earlier run's claims.
void begin_output_claims(const std::filesystem::path& output_dir, const std::vector<OutputClaim>& own);

/// Whether `inner` is `outer` or lies below it, both made absolute with
/// the symbolic links of their existing part resolved (two spellings of one
/// file compare equal).
bool path_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

/// Forgets every claim (a run's end; a later run in the process starts over).
void end_output_claims();

/// Claims `claim`: InputError-free check, returning "" when the path is free,
/// or the owner of the claim it collides with. Records it when free.
std::string add_output_claim(const OutputClaim& claim);

}  // namespace trainer
