// Where this process sits in the job (rank, world size, rendezvous address),
// and the local launcher that `distributed.nproc = N` starts.
#pragma once

#include <string>
#include <vector>

namespace trainer {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool agent_store = false;  ///< a launcher hosts the rendezvous store; rank 0 connects as a client
  std::string source;        ///< which variables it came from, for messages
};

/// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), else Slurm's
/// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE, with
/// MASTER_ADDR/MASTER_PORT), else a single process. InputError when they are
/// inconsistent or not numbers.
WorldInfo world_from_environment();

/// The CUDA device index of `world`'s local rank when this process sees
/// `visible` devices: device 0 when it sees exactly one (a launcher that
/// binds one GPU per task, as Slurm's --gpus-per-task=1 or a per-rank
/// CUDA_VISIBLE_DEVICES does: every task sees its own GPU as device 0);
/// otherwise its local rank, which must be below `visible`. InputError
/// naming both numbers when no device fits.
int cuda_device_index(const WorldInfo& world, int visible);

/// True when an external launcher or our own started this process as a worker.
bool started_as_worker();

/// Starts `nproc` copies of this executable with `argv`, each with its
/// rank's variables, hosting their rendezvous store. Waits for all. When
/// one fails (non-zero exit or a signal), stops the others and returns
/// non-zero after logging which rank ended how; when the others outlive a
/// finished rank by more than `timeout_s`, they are stopped too. SIGINT and
/// SIGTERM are forwarded. Returns the job's exit code.
int launch_local_workers(int argc, char** argv, int nproc, double timeout_s);

}  // namespace trainer
