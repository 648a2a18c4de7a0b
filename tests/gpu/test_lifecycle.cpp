// Construction and destruction leak nothing: device memory and host memory stay flat over many
// cycles of ops (symmetric windows registered and deregistered) and of communicators.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>

#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/all_reduce_mhc.h"

namespace mhccl::gputest {
namespace {

size_t device_free_bytes() {
  size_t free = 0, total = 0;
  MHCCL_TEST_CUDA(cudaMemGetInfo(&free, &total));
  return free;
}

size_t host_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

AllReduceMHCConfig small_config() {
  AllReduceMHCConfig c;
  c.hidden_size = 1024;
  c.hc_mult = 4;
  c.max_num_tokens = 64;
  c.quantize_layer_input = true;
  c.residual_only = true;
  c.two_shot_min_rows = c.two_shot_min_finalize_rows = 33;  // both protocols' buffers
  return c;
}

constexpr size_t kSlack = 32u << 20;

TEST(Lifecycle, ThousandOpCyclesDoNotLeak) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  Communicator& c = env().world ? *env().world : *env().solo;
  auto cycle = [&] {
    AllReduceMHC op(c, small_config());
    LamportAllGather ag(c, 1 << 16);
  };
  for (int i = 0; i < 20; ++i) cycle();  // pools and caches reach their steady state
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const size_t dev0 = device_free_bytes(), host0 = host_rss_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) cycle();
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t dev1 = device_free_bytes(), host1 = host_rss_bytes();
  std::printf("1000 op cycles at TP=%d in %.1f s: device free %zu -> %zu, host RSS %zu -> %zu\n", c.tp(), s,
              dev0, dev1, host0, host1);
  EXPECT_GE(dev1 + kSlack, dev0) << "device memory grew";
  EXPECT_LE(host1, host0 + kSlack) << "host memory grew";
}

// Communicators: 1,000 cycles at TP=1 (bounded to 120 s: at least 200 must fit; NCCL's init
// takes about 0.5 s), and 20 at the world size, each with an op that registers and deregisters
// its windows. MHCCL_LIFECYCLE_SECONDS raises the bound (about 600 for all 1,000 cycles).
TEST(Lifecycle, CommunicatorCyclesDoNotLeak) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  auto solo_cycle = [&] {
    Communicator c(Communicator::make_unique_id(), 0, 1, env().device);
    AllReduceMHC op(c, small_config());
  };
  for (int i = 0; i < 5; ++i) solo_cycle();
  const size_t dev0 = device_free_bytes(), host0 = host_rss_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  long bound_s = 120;
  if (const char* b = std::getenv("MHCCL_LIFECYCLE_SECONDS")) bound_s = std::max(1L, std::atol(b));
  while (done < 1000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(bound_s)) {
    solo_cycle();
    ++done;
  }
  const size_t dev1 = device_free_bytes(), host1 = host_rss_bytes();
  std::printf("%d TP=1 communicator cycles: device free %zu -> %zu, host RSS %zu -> %zu\n", done, dev0,
              dev1, host0, host1);
  // At least 200 in the default 120 s (a shorter bound asks proportionally fewer).
  EXPECT_GE(done, std::min<long>(200, 200 * bound_s / 120));
  EXPECT_GE(dev1 + kSlack, dev0) << "device memory grew";
  EXPECT_LE(host1, host0 + kSlack) << "host memory grew";
  if (!env().world) return;
  env().barrier();
  const size_t wdev0 = device_free_bytes();
  for (int i = 0; i < 20; ++i) {
    std::unique_ptr<Communicator> c = make_world_communicator(CommunicatorOptions{});
    AllReduceMHC op(*c, small_config());
    LamportAllGather ag(*c, 1 << 16);
  }
  env().barrier();
  const size_t wdev1 = device_free_bytes();
  std::printf("20 TP=%d communicator cycles: device free %zu -> %zu\n", env().world->tp(), wdev0, wdev1);
  EXPECT_GE(wdev1 + kSlack, wdev0) << "device memory grew";
}

}  // namespace
}  // namespace mhccl::gputest
