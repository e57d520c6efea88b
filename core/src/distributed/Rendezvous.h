// Joining the job: the c10d TCPStore every rank meets at, and the check that
// all ranks run the same recipe.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "distributed/Launcher.h"
#include "plugin/PluginRegistry.h"
#include "trainer/Comm.h"

namespace trainer {

/// Rank 0 hosts the store unless a launcher does (world.agent_store); the
/// others connect. InputError when the port cannot be listened on;
/// TrainingError when the host does not answer within `timeout`.
c10::intrusive_ptr<c10d::Store> join_store(const WorldInfo& world, std::chrono::milliseconds timeout);

/// Every rank publishes a hash of its resolved recipe and compares with
/// everyone's: a mismatch is an InputError on every rank.
void check_same_recipe(c10d::Store& store, const WorldInfo& world, const std::string& resolved_recipe);

/// The whole join for world size > 1: store, same-job check on
/// `fingerprint` (the resolved recipe), the comm plugin `backend`, connected.
/// World size 1 gets the single-process group, unless `use_backend_alone`
/// asks for the backend even then (to test it at one rank).
std::unique_ptr<Comm> connect_world(PluginRegistry& registry, const std::string& backend, const WorldInfo& world,
                                    std::chrono::milliseconds timeout, torch::Device device,
                                    const std::string& fingerprint, bool use_backend_alone = false);

}  // namespace trainer
