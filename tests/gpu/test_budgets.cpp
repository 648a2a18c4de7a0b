// A budget on every host-side wait (PROTOCOL.md, I20; SPEC.md "Every host-side wait has a
// budget too"): construction, agreement and the fault word at construction.
//  - One GPU: a communicator of two ranks whose second never joins raises kPeerTimeout within the
//    budget; an op construction whose collective never completes (its setup stream held, as a
//    peer that never arrives holds it) raises kPeerTimeout naming the wait.
//  - Two ranks (mhccl-launch -n 2; skipped otherwise): a faulted rank and a healthy one both
//    raise at the next construction; ranks constructing ops in different orders both raise,
//    naming the op kinds, and the communicator stays usable.
#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator_impl.h"
#include "common/mhc_harness.h"
#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/all_reduce_mhc.h"
#include "mhccl/error.h"

namespace mhccl::gputest {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(Budgets, CommunicatorWhosePeerNeverJoinsRaisesWithinTheBudget) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  CommunicatorOptions o;
  o.wait_timeout_ms = 1000;
  const auto t0 = Clock::now();
  try {
    Communicator c(Communicator::make_unique_id(), 0, 2, env().device, o);  // rank 1 never comes
    ADD_FAILURE() << "a communicator of two ranks was built with one";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("NCCL communicator initialization"), std::string::npos) << e.what();
  }
  EXPECT_LT(since(t0), 6.0);
  EXPECT_GT(since(t0), 0.9);
}

TEST(Budgets, OpConstructionWhoseCollectiveNeverCompletesRaises) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (env().ranks.rank != 0) GTEST_SKIP() << "runs on one GPU: rank 0 runs it";
  for (const bool all_reduce : {false, true}) {
    CommunicatorOptions o;
    o.wait_timeout_ms = 300;
    Communicator c(Communicator::make_unique_id(), 0, 1, env().device, o);
    {  // every kernel of both ops loaded first: with CUDA's lazy loading, loading one while a
       // kernel runs waits for it (what the ops' preload at construction is for)
      AllReduceMHCConfig cfg;
      cfg.max_num_tokens = 16;
      AllReduceMHC warm(c, cfg);
      LamportAllGather warm_gather(c, 4096);
    }
    // The setup stream held for 3 s, as a collective that a peer never joins holds it.
    MHCCL_TEST_CUDA(testing::launch_gpu_delay(3'000'000'000ull, c.impl()->setup_stream));
    const auto t0 = Clock::now();
    try {
      if (all_reduce) {
        AllReduceMHCConfig cfg;
        cfg.max_num_tokens = 16;
        AllReduceMHC op(c, cfg);
      } else {
        LamportAllGather op(c, 4096);
      }
      ADD_FAILURE() << "construction passed a wait that never completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kPeerTimeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("configuration agreement of"), std::string::npos) << e.what();
    }
    EXPECT_LT(since(t0), 2.5);
    EXPECT_FALSE(c.usable());
    try {
      LamportAllGather again(c, 4096);
      ADD_FAILURE() << "an unusable communicator built an op";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnusable) << e.what();
    }
  }  // teardown waits for the delay kernel (it ends by itself), for no peer
}

// A faulted communicator raises at construction on every rank (PROTOCOL.md, I12b, I20): rank
// 1 never calls, rank 0's wait times out (its record set; both ranks' fault words set); then
// both construct an op: both raise, neither waits in the agreement.
TEST(Budgets, FaultedAndHealthyRanksBothRaiseAtConstruction) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!env().world) GTEST_SKIP() << "needs 2 ranks: run under mhccl-launch -n 2";
  CommunicatorOptions o;
  o.wait_timeout_ms = 1000;
  std::unique_ptr<Communicator> c = make_world_communicator(o);
  if (!c->peers_reachable()) GTEST_SKIP() << "peers not load/store reachable: no Lamport waits";
  {
    AllReduceMHC op(*c, AllReduceMHCConfig{});
    testing::CallBuffers b(8, 5120, 4, 6);
    if (c->rank() == 0) {
      const testing::Problem p = testing::make_problem(62000, 4, 5120, 4, c->tp(), false);
      testing::upload(p, 0, b);
      testing::launch(op, p, testing::Variant::kPlain, Protocol::kAuto, b, env().device, env().stream);
      MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    }
    env().barrier();  // rank 1 waits here until rank 0's wait expired (and raised the fault)
    const auto t0 = Clock::now();
    try {
      LamportAllGather ag(*c, 4096);
      ADD_FAILURE() << "rank " << c->rank() << ": a faulted communicator built an op";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kPeerTimeout || e.code() == ErrorCode::kUnusable) << e.what();
    }
    EXPECT_LT(since(t0), 5.0);
  }
  env().barrier();
}

TEST(Budgets, DifferentConstructionOrdersRaiseNamingTheOpKinds) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!env().world) GTEST_SKIP() << "needs 2 ranks: run under mhccl-launch -n 2";
  std::unique_ptr<Communicator> c = make_world_communicator(CommunicatorOptions{});
  AllReduceMHCConfig cfg;
  cfg.max_num_tokens = 16;
  const auto t0 = Clock::now();
  try {
    if (c->rank() == 0) {
      AllReduceMHC op(*c, cfg);
    } else {
      LamportAllGather ag(*c, 4096);
    }
    ADD_FAILURE() << "rank " << c->rank() << ": ranks building different ops agreed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("AllReduceMHC"), std::string::npos) << msg;
    EXPECT_NE(msg.find("LamportAllGather"), std::string::npos) << msg;
  }
  EXPECT_LT(since(t0), 10.0);
  EXPECT_TRUE(c->usable());
  LamportAllGather ag(*c, 4096);  // the same order now: built
  AllReduceMHC op(*c, cfg);
  env().barrier();
}

}  // namespace
}  // namespace mhccl::gputest
