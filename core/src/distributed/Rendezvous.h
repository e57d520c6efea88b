// Joining the job: the c10d TCPStore every rank meets at, and the check that
// all ranks run the same recipe.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "distributed/Launcher.h"
#include "plugin/PluginRegistry.h"
#include "trainer/Comm.h"

namespace trainer {

/// The device this rank computes on, made current before any CUDA work (the
/// caching allocator, LibTorch's kernels and NCCL default to it; the
/// project's kernels take their tensors' device anyway): the CPU, or the
/// CUDA device cuda_device_index() picks. InputError when CUDA is asked for
/// and none, or not the one this rank needs, is visible.
torch::Device bind_rank_device(bool cuda, const WorldInfo& world);

/// Rank 0 hosts the store unless a launcher does (world.agent_store); the
/// others connect. InputError when the port cannot be listened on;
/// TrainingError when the host does not answer within `timeout`.
c10::intrusive_ptr<c10d::Store> join_store(const WorldInfo& world, std::chrono::milliseconds timeout);

/// Every rank publishes a hash of its resolved recipe and compares with
/// everyone's: a mismatch is an InputError on every rank; a rank that does
/// not publish within `timeout` a TrainingError naming it.
void check_same_recipe(c10d::Store& store, const WorldInfo& world, const std::string& resolved_recipe,
                       std::chrono::milliseconds timeout);

/// The whole join for world size > 1: store, same-job check on
/// `fingerprint` (the resolved recipe), the comm plugin `backend`, connected.
/// World size 1 gets the single-process group, unless `use_backend_alone`
/// asks for the backend even then (to test it at one rank). `store`, when
/// given, receives the job's store (null at world size 1).
std::unique_ptr<Comm> connect_world(PluginRegistry& registry, const std::string& backend, const WorldInfo& world,
                                    std::chrono::milliseconds timeout, torch::Device device,
                                    const std::string& fingerprint, bool use_backend_alone = false,
                                    c10::intrusive_ptr<c10d::Store>* store = nullptr);

/// The store keys of rank 0's final write: a counter it bumps every
/// kHeartbeat while writing, and the outcome ("done" or "failed").
inline constexpr const char* kWriterHeartbeatKey = "trainer/final-write/heartbeat";
inline constexpr const char* kWriterOutcomeKey = "trainer/final-write/outcome";
inline constexpr std::chrono::milliseconds kHeartbeat{500};

/// Rank 0 writing the run's final outputs alone while every other rank
/// waits on the host, however long the write takes, for as long as rank 0
/// is alive: a collective barrier would time out after
/// distributed.timeout_s, and a rank that left early would let the launcher
/// stop rank 0 mid-write. Rank 0 bumps a heartbeat key in the job's store
/// from a thread while the gate is open; the launcher that hosts the store
/// reads it too, and never stops a rank while it beats. With no store
/// (world size 1) it does nothing.
class WriterGate {
 public:
  WriterGate(c10::intrusive_ptr<c10d::Store> store, int rank, std::chrono::milliseconds timeout);
  /// Rank 0 after a write that threw: the others stop waiting and fail.
  ~WriterGate();
  WriterGate(const WriterGate&) = delete;
  WriterGate& operator=(const WriterGate&) = delete;

  /// Rank 0: the write is complete. Others: blocks until rank 0 says so;
  /// TrainingError when rank 0 failed, or its heartbeat stopped for
  /// `timeout` (it died or hangs).
  void close();

 private:
  void finish(const char* outcome);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> closing_{false};
  bool closed_ = false;
  std::thread heartbeat_;
};

}  // namespace trainer
