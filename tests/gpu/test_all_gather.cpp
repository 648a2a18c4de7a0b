// LamportAllGather on the GPU, TP=1 and TP=2, against the CPU reference on every rank.
#include <cstring>
#include <random>
#include <vector>

#include "common/tensor_desc.h"
#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/error.h"
#include "mhccl/reference.h"

namespace mhccl::gputest {
namespace {

using testing::Desc;
using testing::DeviceBuffer;

constexpr int64_t kCapacity = 2 << 20;  // 2 MiB per rank

// Every rank's input of call `seed` (each rank rebuilds all of them), `bytes` each.
std::vector<std::vector<uint8_t>> rank_inputs(uint64_t seed, int tp, int64_t bytes) {
  std::vector<std::vector<uint8_t>> in(tp);
  for (int r = 0; r < tp; ++r) {
    std::mt19937_64 rng(seed * 131 + r);
    in[r].resize(bytes);
    for (int64_t i = 0; i < bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(in[r].data() + i, &v, std::min<int64_t>(8, bytes - i));
    }
  }
  return in;
}

std::vector<uint8_t> expected(const std::vector<std::vector<uint8_t>>& in) {
  std::vector<const uint8_t*> ptrs;
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<uint8_t> out(in.size() * in[0].size());
  reference::all_gather(ptrs, static_cast<int64_t>(in[0].size()), out.data());
  return out;
}

class AllGather : public ::testing::TestWithParam<int> {
 protected:
  int tp() const { return GetParam(); }
  Communicator& comm() { return *env().comm(tp()); }
  int rank() { return env().rank(tp()); }

  // One call of `bytes` per rank as float32 [bytes / 16, 4]; checks against the reference.
  void check_call(LamportAllGather& ag, const std::vector<std::vector<uint8_t>>& in, const char* what) {
    const int64_t bytes = static_cast<int64_t>(in[0].size());
    DeviceBuffer d_in(bytes), d_out(bytes * tp());
    d_in.upload(in[rank()]);
    d_out.poison();
    Desc din(d_in.get(), testing::kF32, {bytes / 16, 4}, env().device);
    Desc dout(d_out.get(), testing::kF32, {tp() * bytes / 16, 4}, env().device);
    ASSERT_TRUE(ag.accepts(din.t));
    ag.call(din.t, dout.t, env().stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    const std::vector<uint8_t> got = d_out.download<uint8_t>(bytes * tp());
    EXPECT_TRUE(got == expected(in)) << what << ": " << bytes << " bytes per rank";
    EXPECT_TRUE(env().same_on_all_ranks(testing::fnv1a(got.data(), got.size()), tp())) << what;
    comm().check_errors();
  }
};

TEST_P(AllGather, SizesAgainstReference) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  uint64_t seed = 1;
  for (int64_t bytes : {int64_t{16}, int64_t{48}, int64_t{4096}, int64_t{1} << 20, kCapacity}) {
    for (int rep = 0; rep < 3; ++rep) check_call(ag, rank_inputs(seed++, tp(), bytes), "random");
  }
  EXPECT_EQ(ag.mailbox_bytes() >= (tp() > 1 ? size_t(3 * tp() * kCapacity) : 0u), true);
}

TEST_P(AllGather, SentinelWordsAndNegativeZero) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  for (uint32_t word : {0x80000000u /* FP32 -0.0 */, 0x80008000u /* two BF16 -0.0 */}) {
    std::vector<std::vector<uint8_t>> in(tp(), std::vector<uint8_t>(4096));
    for (auto& v : in) for (size_t i = 0; i < v.size(); i += 4) std::memcpy(v.data() + i, &word, 4);
    check_call(ag, in, word == 0x80000000u ? "all 0x80000000" : "all BF16 -0.0");
  }
  // Mixed with data, and a rank-dependent pattern.
  auto in = rank_inputs(99, tp(), 48);
  const uint32_t s = 0x80000000u;
  std::memcpy(in[0].data() + 4, &s, 4);
  check_call(ag, in, "mixed");
}

// Every word arrives as sent (SPEC.md, changed 2026-12-01): int32 INT32_MIN, the marker
// 0x80000001 the encoding uses, packs mixing both with data in every lane position, UE8M0 scale
// bytes [2^-127, 2^-127, 2^-127, 2^1] (the word 0x80000000), and every byte pattern of a word.
TEST_P(AllGather, EveryWordArrivesAsSent) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  const uint32_t kS = 0x80000000u, kMarker = 0x80000001u;
  auto fill = [&](uint64_t seed, int64_t bytes, auto word_at) {
    std::vector<std::vector<uint8_t>> in(tp(), std::vector<uint8_t>(static_cast<size_t>(bytes)));
    for (int r = 0; r < tp(); ++r) {
      std::mt19937_64 rng(seed * 31 + r);
      for (int64_t i = 0; i < bytes / 4; ++i) {
        const uint32_t w = word_at(r, i, rng);
        std::memcpy(in[r].data() + 4 * i, &w, 4);
      }
    }
    return in;
  };
  check_call(ag, fill(1, 4096, [&](int, int64_t, auto&) { return kS; }), "every word INT32_MIN");
  check_call(ag, fill(2, 4096, [&](int, int64_t, auto&) { return kMarker; }), "every word 0x80000001");
  check_call(ag, fill(3, 4096, [&](int r, int64_t i, auto&) { return (i + r) % 2 ? kS : kMarker; }),
             "sentinel and marker alternating");
  // Each lane of a pack independently the sentinel, the marker or random data: all 81 patterns
  // of a pack's 4 lanes, at every rank.
  check_call(ag, fill(4, 81 * 16, [&](int r, int64_t i, auto& rng) {
               int code = static_cast<int>(i / 4);
               for (int l = 0; l < i % 4; ++l) code /= 3;
               code = (code + r) % 3;
               return code == 0 ? kS : code == 1 ? kMarker : static_cast<uint32_t>(rng());
             }),
             "every lane pattern");
  // UE8M0 bytes: 2^-127 is 0x00, 2^1 is 0x80; a group [2^-127, 2^-127, 2^-127, 2^1] is the word
  // 0x80000000 (little-endian).
  check_call(ag, fill(5, 1 << 16, [&](int, int64_t i, auto& rng) {
               return i % 7 == 0 ? kS : static_cast<uint32_t>(rng() % 2 ? 0x7F7F7F7Fu : rng());
             }),
             "UE8M0 scale bytes");
  check_call(ag, fill(6, 1 << 16, [&](int, int64_t, auto& rng) {
               const uint32_t w = static_cast<uint32_t>(rng());
               return rng() % 5 == 0 ? (w | 1u) == kMarker ? w : kS : w;
             }),
             "random words, a fifth of them the sentinel");
}

TEST_P(AllGather, ThousandCallsWithoutHostSync) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  constexpr int kCalls = 1000;
  constexpr int64_t kBytes = 4096;
  std::vector<std::vector<std::vector<uint8_t>>> inputs(kCalls);
  std::vector<uint8_t> mine(kCalls * kBytes);
  for (int c = 0; c < kCalls; ++c) {
    inputs[c] = rank_inputs(1000 + c, tp(), kBytes);
    std::memcpy(mine.data() + c * kBytes, inputs[c][rank()].data(), kBytes);
  }
  DeviceBuffer d_in(kCalls * kBytes), d_out(kCalls * kBytes * tp());
  d_in.upload(mine);
  d_out.poison();
  env().barrier();
  for (int c = 0; c < kCalls; ++c) {
    Desc din(d_in.as<char>() + c * kBytes, testing::kU8, {kBytes}, env().device);
    Desc dout(d_out.as<char>() + c * kBytes * tp(), testing::kU8, {kBytes * tp()}, env().device);
    ag.call(din.t, dout.t, env().stream);
  }
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  const std::vector<uint8_t> got = d_out.download<uint8_t>(kCalls * kBytes * tp());
  int bad = 0;
  for (int c = 0; c < kCalls; ++c) {
    const std::vector<uint8_t> want = expected(inputs[c]);
    if (std::memcmp(got.data() + c * kBytes * tp(), want.data(), want.size()) != 0 && bad++ < 3) {
      ADD_FAILURE() << "call " << c << " differs";
    }
  }
  EXPECT_EQ(bad, 0);
  comm().check_errors();
}

TEST_P(AllGather, OneRankDelayed) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  DeviceBuffer d_in(65536), d_out(65536 * tp());
  for (int c = 0; c < 30; ++c) {
    const auto in = rank_inputs(5000 + c, tp(), 65536);
    d_in.upload(in[rank()]);
    d_out.poison();
    if (rank() == tp() - 1) MHCCL_TEST_CUDA(testing::launch_gpu_delay(200000 + 50000 * (c % 5), env().stream));
    Desc din(d_in.get(), testing::kBF16, {32768}, env().device);
    Desc dout(d_out.get(), testing::kBF16, {32768 * tp()}, env().device);
    ag.call(din.t, dout.t, env().stream);
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    EXPECT_TRUE(d_out.download<uint8_t>(65536 * tp()) == expected(in)) << "call " << c;
  }
  comm().check_errors();
}

TEST_P(AllGather, GraphOfThreeCallsReplayed) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  constexpr int64_t kBytes[3] = {16, 4096, 65536};
  std::vector<DeviceBuffer> ins, outs;
  for (int64_t b : kBytes) {
    ins.emplace_back(b);
    outs.emplace_back(b * tp());
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MHCCL_TEST_CUDA(cudaStreamBeginCapture(env().stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) {
    Desc din(ins[i].get(), testing::kU8, {kBytes[i]}, env().device);
    Desc dout(outs[i].get(), testing::kU8, {kBytes[i] * tp()}, env().device);
    ag.call(din.t, dout.t, env().stream);
  }
  MHCCL_TEST_CUDA(cudaStreamEndCapture(env().stream, &graph));
  MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  int bad = 0;
  for (int rep = 0; rep < 100; ++rep) {
    std::vector<std::vector<std::vector<uint8_t>>> in(3);
    for (int i = 0; i < 3; ++i) {
      in[i] = rank_inputs(20000 + rep * 3 + i, tp(), kBytes[i]);
      ins[i].upload(in[i][rank()]);
      outs[i].poison();
    }
    MHCCL_TEST_CUDA(cudaGraphLaunch(exec, env().stream));
    MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
    for (int i = 0; i < 3; ++i) {
      if (outs[i].download<uint8_t>(kBytes[i] * tp()) != expected(in[i]) && bad++ < 3) {
        ADD_FAILURE() << "replay " << rep << " call " << i;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm().check_errors();
}

TEST_P(AllGather, StridedAndMisalignedInputsAreCopied) {
  MHCCL_REQUIRE_TP(tp());
  LamportAllGather ag(comm(), kCapacity);
  // A [64, 8] float32 view with row stride 9 (non-contiguous), and a view 4 bytes off alignment.
  const auto base = rank_inputs(777, tp(), 64 * 9 * 4 + 16);
  std::vector<std::vector<uint8_t>> strided(tp()), shifted(tp());
  for (int r = 0; r < tp(); ++r) {
    for (int i = 0; i < 64; ++i) {
      strided[r].insert(strided[r].end(), base[r].begin() + i * 36, base[r].begin() + i * 36 + 32);
    }
    shifted[r].assign(base[r].begin() + 4, base[r].begin() + 4 + 2048);
  }
  DeviceBuffer d_in(base[0].size()), d_out(2048 * tp());
  d_in.upload(base[rank()]);
  Desc view(d_in.get(), testing::kF32, {64, 8}, env().device);
  view.with_strides({9, 1});
  Desc dout(d_out.get(), testing::kF32, {64 * tp(), 8}, env().device);
  d_out.poison();
  ag.call(view.t, dout.t, env().stream);
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  EXPECT_TRUE(d_out.download<uint8_t>(2048 * tp()) == expected(strided)) << "strided";
  Desc mis(d_in.get(), testing::kF32, {512}, env().device);
  mis.t.byte_offset = 4;
  Desc dout2(d_out.get(), testing::kF32, {512 * tp()}, env().device);
  d_out.poison();
  ag.call(mis.t, dout2.t, env().stream);
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  EXPECT_TRUE(d_out.download<uint8_t>(2048 * tp()) == expected(shifted)) << "misaligned";
  // Rejected calls leave the protocol intact: the next call is right.
  Desc too_big(d_in.get(), testing::kU8, {kCapacity + 16}, env().device);
  EXPECT_THROW(ag.call(too_big.t, dout.t, env().stream), Error);
  EXPECT_FALSE(ag.accepts(too_big.t));
  check_call(ag, rank_inputs(778, tp(), 4096), "after a rejected call");
}

TEST_P(AllGather, EveryRejectedCallBetweenValidCalls) {
  MHCCL_REQUIRE_TP(tp());
  constexpr int64_t kCap = 4096;
  LamportAllGather ag(comm(), kCap);
  DeviceBuffer d_in(kCap + 64), d_out((kCap + 64) * tp());
  const int dev = env().device;
  using testing::kF32;
  using testing::kU8;
  struct Bad { const char* what; Desc in, out; };
  std::vector<Bad> bad = {
      {"above capacity", Desc(d_in.get(), kU8, {kCap + 16}, dev), Desc(d_out.get(), kU8, {(kCap + 16) * tp()}, dev)},
      {"not a multiple of 16 bytes", Desc(d_in.get(), kU8, {40}, dev), Desc(d_out.get(), kU8, {40 * tp()}, dev)},
      {"empty", Desc(d_in.get(), kU8, {0}, dev), Desc(d_out.get(), kU8, {0}, dev)},
      {"scalar", Desc(d_in.get(), kF32, {}, dev), Desc(d_out.get(), kF32, {tp()}, dev)},
      {"output rows", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(d_out.get(), kF32, {16 * tp() + 1, 4}, dev)},
      {"output dtype", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(d_out.get(), kU8, {16 * tp(), 16}, dev)},
      {"input on the host", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(d_out.get(), kF32, {16 * tp(), 4}, dev)},
      {"output on another device", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(d_out.get(), kF32, {16 * tp(), 4}, dev + 1)},
      {"output misaligned", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(static_cast<char*>(d_out.get()) + 4, kF32, {16 * tp(), 4}, dev)},
      {"output non-contiguous", Desc(d_in.get(), kF32, {16, 4}, dev), Desc(d_out.get(), kF32, {16 * tp(), 4}, dev)},
  };
  bad[6].in.t.device = DLDevice{kDLCPU, 0};
  bad[9].out.with_strides({8, 1});
  uint64_t seed = 900;
  for (Bad& b : bad) {
    check_call(ag, rank_inputs(seed++, tp(), 16 * (1 + seed % 200)), "before");
    EXPECT_THROW(ag.call(b.in.t, b.out.t, env().stream), Error) << b.what;
    check_call(ag, rank_inputs(seed++, tp(), 16 * (1 + seed % 200)), "after");
  }
  std::printf("TP=%d: %zu kinds of bad all-gather rejected, each between two checked calls\n", tp(), bad.size());
}

INSTANTIATE_TEST_SUITE_P(Tp, AllGather, ::testing::Values(1, 2),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

}  // namespace
}  // namespace mhccl::gputest
