// The GPU tests' process environment: this rank's device, a TP=1 communicator, the world
// communicator when launched as several ranks (mhccl-launch -n 2), and collective helpers.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/device_buffer.h"
#include "mhccl/bootstrap.h"
#include "mhccl/communicator.h"

namespace mhccl::gputest {

struct Env {
  bool has_gpu = false;
  RankEnvironment ranks;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Communicator> solo;   // TP = 1 on this rank's GPU
  std::unique_ptr<Communicator> world;  // TP = world size, when > 1
  testing::DeviceBuffer scratch;        // for hash exchange

  Communicator* comm(int tp) const {
    if (tp == 1) return solo.get();
    return world && world->tp() == tp ? world.get() : nullptr;
  }
  int rank(int tp) const { return tp == 1 ? 0 : ranks.rank; }
  // True when `hash` is the same on every rank of the TP group.
  bool same_on_all_ranks(uint64_t hash, int tp);
  void barrier();
};

Env& env();

// A fresh communicator of the world group (collective), e.g. with a short wait budget.
std::unique_ptr<Communicator> make_world_communicator(const CommunicatorOptions& options);

}  // namespace mhccl::gputest

#define MHCCL_REQUIRE_TP(tp)                                                              \
  do {                                                                                   \
    if (!::mhccl::gputest::env().has_gpu) GTEST_SKIP() << "no CUDA device";             \
    if (::mhccl::gputest::env().comm(tp) == nullptr)                                     \
      GTEST_SKIP() << "TP=" << (tp) << " needs " << (tp) << " ranks: run under mhccl-launch -n " << (tp); \
  } while (0)
