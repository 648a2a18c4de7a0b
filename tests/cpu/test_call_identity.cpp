// The call identity (kernels/params.h, CallIdentity; PROTOCOL.md I19), the mailbox layouts its
// headers live in, and the all-gather's escape encoding, on the host: what the kernels compute
// with the same constexpr functions.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/communicator_impl.h"
#include "kernels/params.h"
#include "mhccl/checks.h"

namespace mhccl {
namespace {

using kernels::CallIdentity;

// No 16-bit lane of a header is the BF16 sentinel 0x8000, and no word the all-gather's
// 0x80000000: a written header is never taken for an empty slot.
bool sentinel_free(const CallIdentity& id) {
  for (uint32_t w : id.w) {
    if (w == kernels::kWordSentinel || (w & 0xFFFFu) == 0x8000u || (w >> 16) == 0x8000u) return false;
    if ((w & 0x80008000u) != 0) return false;  // every lane's top bit is clear
  }
  return true;
}

TEST(CallIdentity, FieldsRoundTripAndNoLaneIsASentinel) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t op = 1 + rng() % 3, proto = 1 + rng() % 4, variant = rng() % 4, gen = rng() % 3;
    // The all-gather's size (packs) has 32 bits (kAllGatherSizeBits), the all-reduce's M 45.
    const int size_bits = op == kernels::kOpAllGather ? kernels::kAllGatherSizeBits : 45;
    const uint64_t size = i % 3 == 0 ? rng() % 4097 : rng() & ((uint64_t{1} << size_bits) - 1);
    const uint32_t rejected = static_cast<uint32_t>(i % 5 == 0 ? rng() % 3 : rng() & ((1u << 30) - 1));
    const CallIdentity id = kernels::with_call_state(kernels::make_call_identity(op, proto, variant, size), gen, rejected);
    ASSERT_TRUE(sentinel_free(id)) << i;
    EXPECT_EQ(kernels::identity_op(id), op);
    EXPECT_EQ(kernels::identity_protocol(id), proto);
    EXPECT_EQ(kernels::identity_variant(id), variant);
    EXPECT_EQ(kernels::identity_generation(id), gen);
    EXPECT_EQ(kernels::identity_size(id), size);
    EXPECT_EQ(kernels::identity_rejected(id), rejected);
    EXPECT_EQ(id.w[3] >> 16, kernels::kIdentityMagic);
  }
}

TEST(CallIdentity, EveryFieldThatDiffersMakesTheIdentitiesDiffer) {
  const auto make = [](uint32_t op, uint32_t proto, uint32_t variant, uint64_t m, uint32_t rejected, uint32_t gen) {
    return kernels::with_call_state(kernels::make_call_identity(op, proto, variant, m), gen, rejected);
  };
  const CallIdentity base = make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 8, 0, 1);
  EXPECT_TRUE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 8, 0, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceFinalize, kernels::kProtoOneShot, 0, 8, 0, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoTwoShotOwner, 0, 8, 0, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 1, 8, 0, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 9, 0, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 8, 1, 1)));
  EXPECT_FALSE(kernels::identity_equal(base, make(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 8, 0, 2)));
  // Sizes that differ only above 30 bits, rejected counts only above 15.
  EXPECT_FALSE(kernels::identity_equal(make(1, 4, 0, uint64_t{1} << 40, 0, 0), make(1, 4, 0, 0, 0, 0)));
  EXPECT_FALSE(kernels::identity_equal(make(2, 1, 0, 1, 1u << 20, 0), make(2, 1, 0, 1, 0, 0)));
}

// The kernels add the generation and this rank's device count of rejected calls to the host's
// identity at every call (a CUDA graph's replay reads them again): adding them replaces
// whatever the identity held, so no earlier call's generation or count stays in a replayed one.
TEST(CallIdentity, CallStateReplacesTheGenerationAndTheRejectedCount) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const CallIdentity host = kernels::make_call_identity(1 + rng() % 3, 1 + rng() % 4, rng() % 4, rng() % 5000);
    EXPECT_EQ(kernels::identity_rejected(host), 0u);
    EXPECT_EQ(kernels::identity_generation(host), 0u);
    const uint32_t g1 = rng() % 3, g2 = rng() % 3;
    const uint32_t r1 = static_cast<uint32_t>(rng() & ((1u << 30) - 1)), r2 = static_cast<uint32_t>(rng() % 4);
    const CallIdentity twice = kernels::with_call_state(kernels::with_call_state(host, g1, r1), g2, r2);
    EXPECT_TRUE(kernels::identity_equal(twice, kernels::with_call_state(host, g2, r2))) << i;
    EXPECT_EQ(kernels::identity_generation(twice), g2);
    EXPECT_EQ(kernels::identity_rejected(twice), r2);
    EXPECT_EQ(kernels::identity_size(twice), kernels::identity_size(host));
    EXPECT_EQ(kernels::identity_op(twice), kernels::identity_op(host));
  }
}

// The NCCL fallback's identity (kernels/params.h, FallbackParams): the op's serial number in
// lane 6 round-trips, keeps every lane clear of the sentinels, survives the call state the kernel
// adds, and makes identities that differ only in it differ; the Lamport identities leave lane 6 at 0.
TEST(CallIdentity, FallbackOpSerialRoundTripsAndDiffers) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 10000; ++i) {
    const uint32_t serial = i < 4 ? static_cast<uint32_t>(i) : static_cast<uint32_t>(rng() % 0x8000u);
    const CallIdentity host = kernels::with_op_serial(
        kernels::make_call_identity(1 + rng() % 3, kernels::kProtoNccl, rng() % 4, rng() % 5000), serial);
    const CallIdentity id = kernels::with_call_state(host, 0, static_cast<uint32_t>(rng() & ((1u << 30) - 1)));
    ASSERT_TRUE(sentinel_free(id)) << i;
    EXPECT_EQ(kernels::identity_op_serial(id), serial) << i;
    EXPECT_EQ(kernels::identity_protocol(id), kernels::kProtoNccl);
    EXPECT_EQ(id.w[3] >> 16, kernels::kIdentityMagic);
    EXPECT_FALSE(kernels::identity_equal(id, kernels::with_op_serial(id, (serial + 1) & 0x7FFFu))) << i;
    EXPECT_TRUE(kernels::identity_equal(id, kernels::with_op_serial(id, serial))) << i;
  }
  EXPECT_EQ(kernels::identity_op_serial(kernels::make_call_identity(kernels::kOpAllReduceCall, kernels::kProtoOneShot, 0, 64)), 0u);
}

// The all-gather's layout digest (with_layout): 19 bits that round-trip beside a size of 32 bits,
// keep every lane clear of the sentinels, survive the call state and the fallback's op serial,
// and make identities differ; the digest of a dtype and shape (all_gather_layout_digest) differs
// for the layouts of as many bytes that a divergence pairs (a review, 2026-12-05: f32 [4, 8]
// against bf16 [2, 32] gathered each other's bytes with no error).
TEST(CallIdentity, AllGatherLayoutDigestRoundTripsAndDiffers) {
  std::mt19937_64 rng(13);
  for (int i = 0; i < 10000; ++i) {
    // Up to the largest all-gather rank_capacity_bytes allows (2^35 bytes: 2^31 packs).
    const uint64_t packs = i == 0 ? uint64_t{1} << 31 : 1 + rng() % (uint64_t{1} << 31);
    const uint32_t digest = static_cast<uint32_t>(rng() & ((1u << kernels::kLayoutDigestBits) - 1));
    const uint32_t proto = i % 2 ? kernels::kProtoAllGather : kernels::kProtoNccl;
    CallIdentity id = kernels::with_layout(kernels::make_call_identity(kernels::kOpAllGather, proto, 0, packs), digest);
    if (proto == kernels::kProtoNccl) id = kernels::with_op_serial(id, static_cast<uint32_t>(rng() % 0x8000u));
    id = kernels::with_call_state(id, static_cast<uint32_t>(rng() % 3), static_cast<uint32_t>(rng() & ((1u << 30) - 1)));
    ASSERT_TRUE(sentinel_free(id)) << i;
    EXPECT_EQ(kernels::identity_size(id), packs) << i;
    EXPECT_EQ(kernels::identity_layout(id), digest) << i;
    EXPECT_EQ(kernels::identity_op(id), kernels::kOpAllGather);
    EXPECT_FALSE(kernels::identity_equal(id, kernels::with_layout(id, digest ^ (1u << (i % 19))))) << i;
  }
  // Layouts of the same bytes, as ranks that diverged would pass them.
  const auto layout = [](uint8_t code, uint8_t bits, std::vector<int64_t> shape) {
    static std::vector<std::vector<int64_t>> keep;
    keep.push_back(shape);
    DLTensor t = {};
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = keep.back().data();
    t.dtype = DLDataType{code, bits, 1};
    return all_gather_layout_digest(t);
  };
  const uint32_t f32_4x8 = layout(kDLFloat, 32, {4, 8});
  EXPECT_EQ(f32_4x8, layout(kDLFloat, 32, {4, 8}));
  EXPECT_LT(f32_4x8, 1u << kernels::kLayoutDigestBits);
  std::set<uint32_t> seen = {f32_4x8};
  for (const uint32_t other : {layout(kDLBfloat, 16, {2, 32}), layout(kDLFloat, 32, {8, 4}), layout(kDLInt, 32, {4, 8}),
                               layout(kDLUInt, 32, {4, 8}), layout(kDLFloat, 32, {32}), layout(kDLFloat, 32, {4, 8, 1}),
                               layout(kDLFloat, 16, {4, 16}), layout(kDLBfloat, 16, {4, 16}), layout(kDLUInt, 8, {128})}) {
    EXPECT_TRUE(seen.insert(other).second) << other;
  }
}

// The call headers of every (generation, writer) lie after the rows, apart from one another and
// inside mailbox_bytes, which ends with the last one; likewise the all-gather's headers and
// escape words.
TEST(MailboxLayout, HeadersFollowTheRowsAndFitTheMailbox) {
  for (const int sources : {1, 2, 4, 8}) {
    for (const int64_t rows : {int64_t{1}, int64_t{7}, int64_t{300}}) {
      for (const int np : {1, 640, 896}) {
        const int64_t row_packs = kernels::mailbox_row_packs(sources, rows, np);
        std::set<int64_t> seen;
        int64_t last = 0;
        for (uint32_t gen = 0; gen < kernels::kGenerations; ++gen) {
          for (int w = 0; w < kernels::kMaxTp; ++w) {
            const int64_t off = kernels::call_header_offset(gen, sources, rows, np, w);
            EXPECT_GE(off, row_packs);
            EXPECT_LT(16 * (off + 1), kernels::mailbox_bytes(sources, rows, np) + 1);
            EXPECT_TRUE(seen.insert(off).second);
            last = std::max(last, off);
          }
        }
        EXPECT_EQ(16 * (last + 1), kernels::mailbox_bytes(sources, rows, np));
      }
    }
  }
  for (const int tp : {2, 4, 8}) {
    for (const int64_t cap : {int64_t{1}, int64_t{4096}}) {
      const int64_t bytes = kernels::all_gather_mailbox_bytes(tp, cap);
      const int64_t rows_end = 16 * kernels::kGenerations * tp * cap;
      const int64_t hdr_lo = 16 * kernels::all_gather_header_offset(0, tp, 0, cap, 0);
      const int64_t hdr_hi = 16 * (kernels::all_gather_header_offset(2, tp, tp - 1, cap, kernels::kAllGatherMaxCtas - 1) + 1);
      const int64_t esc_lo = 4 * kernels::all_gather_escape_offset(0, tp, 0, cap, 0);
      const int64_t esc_hi = 4 * (kernels::all_gather_escape_offset(2, tp, tp - 1, cap, cap - 1) + 1);
      EXPECT_EQ(hdr_lo, rows_end);
      EXPECT_EQ(esc_lo, hdr_hi);
      EXPECT_EQ(esc_hi, bytes);
    }
  }
}

// Every pattern of a pack's 4 lanes from {sentinel, marker, 0, data}: the encoded lanes are
// never the sentinel, the escape word is never the sentinel (nor 0 where a marker travels),
// and decoding restores every lane.
TEST(AllGatherEscape, EveryLanePatternRoundTrips) {
  const uint32_t values[] = {kernels::kWordSentinel, kernels::kWordMarker, 0u, 0x3F800000u, 0x80000002u, 0x7FFFFFFFu};
  for (int code = 0; code < 6 * 6 * 6 * 6; ++code) {
    uint32_t w[4], orig[4];
    for (int i = 0, c = code; i < 4; ++i, c /= 6) orig[i] = w[i] = values[c % 6];
    const uint32_t escape = kernels::escape_encode(w);
    bool marker = false;
    for (int i = 0; i < 4; ++i) {
      EXPECT_NE(w[i], kernels::kWordSentinel) << code;
      marker |= w[i] == kernels::kWordMarker;
    }
    EXPECT_NE(escape, kernels::kWordSentinel);
    EXPECT_EQ(escape != 0, marker) << code;
    if (!marker) {
      for (int i = 0; i < 4; ++i) EXPECT_EQ(w[i], orig[i]) << code;  // travels as it is
    }
    kernels::escape_decode(w, escape);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(w[i], orig[i]) << code << " lane " << i;
  }
}

// The messages a divergence gives name both identities and say what differs.
TEST(CallIdentity, DivergenceMessageNamesWhatDiffers) {
  const auto id = [](uint32_t op, uint64_t m, uint32_t rejected, uint32_t variant = 0) {
    return kernels::with_call_state(kernels::make_call_identity(op, kernels::kProtoOneShot, variant, m), 1, rejected);
  };
  struct Case {
    CallIdentity mine, theirs;
    const char* says;
  };
  const Case cases[] = {
      {id(kernels::kOpAllReduceCall, 8, 0), id(kernels::kOpAllReduceCall, 8, 1), "rejected on one of these ranks"},
      {id(kernels::kOpAllReduceCall, 8, 0), id(kernels::kOpAllReduceFinalize, 8, 0), "call on one, finalize on the other"},
      {id(kernels::kOpAllReduceCall, 8, 0), id(kernels::kOpAllReduceCall, 5, 0), "different M"},
      {id(kernels::kOpAllReduceCall, 8, 0), id(kernels::kOpAllReduceCall, 8, 0, 1), "different outputs"},
      {id(kernels::kOpAllReduceCall, 8, 0), CallIdentity{{1, 2, 3, 4}}, "no call header"},
  };
  for (const Case& c : cases) {
    const std::string msg = comm::divergence_message(0, 3, "AllReduceMHC.call (one-shot, call 7)", c.mine, c.theirs);
    EXPECT_NE(msg.find("No rank stores into a mailbox"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("M=8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unusable"), std::string::npos) << msg;
  }
}

// An all-gather's divergence names the size in bytes and the layout digests, and says which differs.
TEST(CallIdentity, AllGatherDivergenceMessageNamesSizeOrLayout) {
  const auto id = [](uint64_t packs, uint32_t digest) {
    return kernels::with_call_state(
        kernels::with_layout(kernels::make_call_identity(kernels::kOpAllGather, kernels::kProtoAllGather, 0, packs), digest),
        2, 0);
  };
  std::string msg = comm::divergence_message(0, 1, "LamportAllGather (all-gather, call 3)", id(8, 0x12345), id(8, 0x54321));
  // The largest all-gather (rank_capacity_bytes = 2^35: 2^31 packs) keeps its size (a review,
  // 2026-12-05: with 31 bits for it, its message said 0 bytes).
  const uint64_t max_packs = static_cast<uint64_t>(kMaxAllGatherCapacity / 16);
  EXPECT_NE(comm::divergence_message(0, 1, "LamportAllGather (NCCL fallback, call 0)", id(max_packs, 0x12345),
                                     id(max_packs, 0x54321))
                .find("34359738368 bytes a rank"),
            std::string::npos);
  EXPECT_NE(msg.find("another dtype or shape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128 bytes a rank (dtype and shape digest 0x12345)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("digest 0x54321"), std::string::npos) << msg;
  msg = comm::divergence_message(0, 1, "LamportAllGather (all-gather, call 3)", id(8, 0x12345), id(9, 0x12345));
  EXPECT_NE(msg.find("gathered different sizes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("144 bytes a rank"), std::string::npos) << msg;
}

// The NCCL fallback's divergences (PROTOCOL.md I19): the op's serial number is named where it
// differs, no generation is named (it has none), and the message says that every rank found it
// (no mailbox to stop storing into).
TEST(CallIdentity, FallbackDivergenceMessageNamesWhatDiffers) {
  const auto id = [](uint32_t op, uint64_t m, uint32_t serial, uint32_t rejected) {
    return kernels::with_call_state(
        kernels::with_op_serial(kernels::make_call_identity(op, kernels::kProtoNccl, 0, m), serial), 0, rejected);
  };
  struct Case {
    CallIdentity mine, theirs;
    const char* says;
  };
  const Case cases[] = {
      {id(kernels::kOpAllReduceCall, 8, 2, 0), id(kernels::kOpAllReduceCall, 8, 2, 1), "rejected on one of these ranks"},
      {id(kernels::kOpAllReduceCall, 8, 2, 0), id(kernels::kOpAllReduceCall, 5, 2, 0), "different M"},
      {id(kernels::kOpAllReduceCall, 8, 2, 0), id(kernels::kOpAllReduceFinalize, 8, 2, 0), "call on one, finalize"},
      {id(kernels::kOpAllReduceCall, 8, 2, 0), id(kernels::kOpAllReduceCall, 8, 3, 0), "different ops of the communicator"},
      {id(kernels::kOpAllReduceCall, 8, 2, 0), CallIdentity{{0x3F803F80u, 0x40004000u, 0xBF80BF80u, 0x3F003F00u}},
       "another NCCL operation paired"},
      // An all-gather and an all-reduce of one communicator pair on the fallback (a review,
      // 2026-12-05: the message said "call on one, finalize on the other").
      {id(kernels::kOpAllReduceCall, 8, 2, 0), id(kernels::kOpAllGather, 8, 2, 0), "an all-gather on one, an all-reduce"},
  };
  for (const Case& c : cases) {
    const std::string msg = comm::divergence_message(1, 0, "AllReduceMHC.call (NCCL fallback, call 5)", c.mine, c.theirs);
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_NE(msg.find("NCCL fallback"), std::string::npos) << msg;
    EXPECT_NE(msg.find("op #1 of the communicator"), std::string::npos) << msg;  // serial 2: the communicator's agreement is 1
    EXPECT_EQ(msg.find("generation"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("No rank stores into a mailbox"), std::string::npos) << msg;
    EXPECT_NE(msg.find("each finds it here"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unusable"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mhccl
