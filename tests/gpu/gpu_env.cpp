#include "gpu_env.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/devices.h"

namespace mhccl::gputest {
namespace {
Env* g_env = nullptr;

CommunicatorOptions test_options() {
  CommunicatorOptions o;
  o.wait_timeout_ms = 20000;  // a hang becomes a reported failure well inside the launcher's deadline
  return o;
}
}  // namespace

Env& env() { return *g_env; }

bool Env::same_on_all_ranks(uint64_t hash, int tp) {
  if (tp == 1) return true;
  testing::DeviceBuffer in(8);
  in.upload(std::vector<uint64_t>{hash});
  if (scratch.bytes() < 8 * static_cast<size_t>(tp)) scratch = testing::DeviceBuffer(8 * tp);
  if (testing::settle_nccl(world->nccl(), ncclAllGather(in.get(), scratch.get(), 8, ncclUint8, world->nccl(), stream)) != ncclSuccess) {
    throw std::runtime_error("ncclAllGather of hashes failed");
  }
  MHCCL_TEST_CUDA(cudaStreamSynchronize(stream));
  const std::vector<uint64_t> all = scratch.download<uint64_t>(tp);
  for (uint64_t h : all) if (h != all[0]) return false;
  return true;
}

void Env::barrier() { same_on_all_ranks(0, world ? world->tp() : 1); }

std::unique_ptr<Communicator> make_world_communicator(const CommunicatorOptions& options) {
  Env& e = env();
  // A fresh id from rank 0, passed through the world communicator (an all-gather of bytes).
  ncclUniqueId id = Communicator::make_unique_id();
  testing::DeviceBuffer buf(sizeof id * e.world->tp());
  testing::DeviceBuffer mine(sizeof id);
  MHCCL_TEST_CUDA(cudaMemcpy(mine.get(), &id, sizeof id, cudaMemcpyHostToDevice));
  if (testing::settle_nccl(e.world->nccl(), ncclAllGather(mine.get(), buf.get(), sizeof id, ncclUint8, e.world->nccl(), e.stream)) != ncclSuccess) {
    throw std::runtime_error("ncclAllGather of the unique id failed");
  }
  MHCCL_TEST_CUDA(cudaStreamSynchronize(e.stream));
  MHCCL_TEST_CUDA(cudaMemcpy(&id, buf.get(), sizeof id, cudaMemcpyDeviceToHost));  // rank 0's
  return std::make_unique<Communicator>(id, e.ranks.rank, e.world->tp(), e.device, options);
}

}  // namespace mhccl::gputest

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // The simulated and concurrent ranks' streams each need their own hardware work queue: with
  // CUDA's default of 8, streams share queues, and a rank's spinning kernel could hold back a
  // peer's kernel queued behind it in the same queue (false serialization; a GPU a rank never
  // has it). Before any CUDA call; a value the caller set stays.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  ::testing::InitGoogleTest(&argc, argv);
  mhccl::gputest::Env e;
  mhccl::gputest::g_env = &e;
  const mhccl::detail::DeviceCount devices = mhccl::detail::cuda_device_count();
  const int count = devices.count;
  e.has_gpu = count > 0;
  if (!e.has_gpu) {
    std::printf("mhccl GPU tests: SKIPPED: no CUDA device (%s)\n", devices.why_none.c_str());
  } else {
    e.ranks = mhccl::rank_environment();
    e.device = e.ranks.local_rank % count;
    MHCCL_TEST_CUDA(cudaSetDevice(e.device));
    MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
    e.solo = std::make_unique<mhccl::Communicator>(mhccl::Communicator::make_unique_id(), 0, 1,
                                                   e.device, mhccl::gputest::test_options());
    if (e.ranks.world_size > 1) {
      e.world = std::make_unique<mhccl::Communicator>(mhccl::share_unique_id(e.ranks), e.ranks.rank,
                                                      e.ranks.world_size, e.device,
                                                      mhccl::gputest::test_options());
      std::printf("rank %d of %d on cuda:%d, peers load/store reachable: %s\n", e.ranks.rank,
                  e.ranks.world_size, e.device, e.world->peers_reachable() ? "yes" : "no");
    }
  }
  const int rc = RUN_ALL_TESTS();
  e.world.reset();
  e.solo.reset();
  return rc;
}
