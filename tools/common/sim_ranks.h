// Ranks of an AllReduceMHC simulated at the kernel level on one GPU (the concurrent tests of
// tests/gpu/test_simulated_ranks.cpp and mhccl-bench's simulated-ranks timing): each rank's
// mailboxes, protocol states, call buffers, stream, error records and fault word, the kernels'
// parameters as src/ops/all_reduce_mhc.cpp builds them, and the launch sequence of each path.
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/device_buffer.h"
#include "common/mhc_harness.h"
#include "kernels/launch.h"
#include "kernels/params.h"
#include "mhccl/fp8_groups.h"

namespace mhccl::sim {

using namespace kernels;
using testing::CallBuffers;
using testing::DeviceBuffer;
using testing::Problem;
using testing::Variant;

// One simulated rank of an AllReduceMHC: its mailboxes (rows and call headers, sized as the
// library sizes them: kernels/params.h, mailbox_bytes), states, call buffers and stream.
struct SimRank {
  SimRank(int64_t cap, int64_t h, int hc, int tp)
      : buf(cap, h, hc, 6),
        ll(static_cast<size_t>(mailbox_bytes(tp, cap, static_cast<int>(h / 8)))),
        bt(static_cast<size_t>(mailbox_bytes(tp, (cap + tp - 1) / tp, static_cast<int>(h / 8)))),
        red(static_cast<size_t>(mailbox_bytes(1, cap, static_cast<int>(h / 8)))),
        states(2 * sizeof(LamportState)) {
    for (const DeviceBuffer* b : {&ll, &bt, &red}) {
      MHCCL_TEST_CUDA(launch_fill_u32(b->get(), b->bytes() / 4, kBf16SentinelPair, nullptr));
    }
    MHCCL_TEST_CUDA(cudaMemset(states.get(), 0, states.bytes()));
    MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~SimRank() { cudaStreamDestroy(stream); }
  CallBuffers buf;
  DeviceBuffer ll, bt, red, states;
  cudaStream_t stream = nullptr;
};

// One rank's error sink: records and claims in device memory, its fault word with its count of
// rejected calls beside it (words [2] and [3], as the communicator's fault window holds them),
// and the table of every rank's fault word (shared by the ranks).
struct RankSink {
  RankSink(uint64_t timeout_ns, int rank, int tp, uint32_t* const* table, uint32_t op = kOpAllReduceCall)
      : records(2 * sizeof(ErrorRecord)), words(16) {
    MHCCL_TEST_CUDA(cudaMemset(records.get(), 0, records.bytes()));
    MHCCL_TEST_CUDA(cudaMemset(words.get(), 0, words.bytes()));
    sink.records = records.as<ErrorRecord>();
    sink.claims = words.as<uint32_t>();
    sink.fault = words.as<uint32_t>() + 2;
    sink.fault_peers = table;
    sink.fault_ranks = tp;
    sink.rank = rank;
    sink.timeout_ns = timeout_ns;
    sink.op = op;
  }
  ErrorRecord timeout() const {
    ErrorRecord rec[2];
    MHCCL_TEST_CUDA(cudaMemcpy(rec, records.get(), sizeof(rec), cudaMemcpyDeviceToHost));
    return rec[kTimeoutRecord];
  }
  uint32_t fault() const { return word(2); }
  // A call of this rank rejected: its count of rejected calls (which its calls' identities carry)
  // by one, in stream order on `stream`, as Communicator::Impl::count_rejected does.
  void count_rejected(cudaStream_t stream) const { MHCCL_TEST_CUDA(launch_count_rejected(sink.fault + 1, stream)); }
  uint32_t rejected() const { return word(3); }
  uint32_t word(int i) const {  // words[i], read now
    uint32_t w = 0;
    MHCCL_TEST_CUDA(cudaMemcpy(&w, words.as<uint32_t>() + i, sizeof(w), cudaMemcpyDeviceToHost));
    return w;
  }
  DeviceBuffer records, words;
  ErrorSink sink{};
};

// One error sink for every simulated rank of the phased tests, in device memory (the library's
// is host-mapped): an expired wait fails a test with its record instead of hanging it. Its fault
// word is one word shared by every simulated rank (the test's ranks stop together): the table
// of one entry holds it.
struct SimErrors : RankSink {
  SimErrors(uint64_t timeout_ns, uint32_t op) : RankSink(timeout_ns, 0, 1, nullptr, op), table(sizeof(void*)) {
    uint32_t* fault = sink.fault;
    MHCCL_TEST_CUDA(cudaMemcpy(table.get(), &fault, sizeof(fault), cudaMemcpyHostToDevice));
    sink.fault_peers = table.as<uint32_t*>();
  }
  DeviceBuffer table;
};

inline ConsumerVariant consumer_variant(Variant v) {
  switch (v) {
    case Variant::kPlain: return ConsumerVariant::kPlain;
    case Variant::kMxfp8: return ConsumerVariant::kMxfp8;
    case Variant::kResidualOnly: return ConsumerVariant::kResidualOnly;
    default: return ConsumerVariant::kFp8;
  }
}

// The tiling src/ops/all_reduce_mhc.cpp takes for variant v (FP8: groups of 16 packs in one CTA).
inline RowTiling variant_tiling(int np, int64_t m, int hc, Variant v) {
  return row_tiling(np, m, hc, 0, testing::is_fp8(v) ? kFp8GroupPacks : 4);
}

// The kernels' parameters of rank r for problem p, as src/ops/all_reduce_mhc.cpp builds them
// (rotated one-shot targets, owners' mailboxes, rotated reduced buffers), from the ranks' own
// buffers; the path's launch shape is set by the caller.
// `bufs`: the rank's call buffers where they are not its own (the concurrent tests keep one set
// a call, since no call's outputs are read before every call ran).
inline void build_params(std::vector<std::unique_ptr<SimRank>>& ranks, int r, const Problem& p, Variant v, bool two_shot,
                  const ErrorSink& err, PublishParams& pp, OwnerReduceParams& orp, ConsumerParams& cp,
                  CallBuffers* bufs = nullptr) {
  const int tp = static_cast<int>(ranks.size());
  const int64_t m = p.m, kCap = ranks[0]->buf.rows;
  const int kHc = p.hc;
  const int np = static_cast<int>(p.h / 8);
  const int64_t owner_rows = (kCap + tp - 1) / tp;
  const bool fin = p.finalize;
  SimRank& k = *ranks[r];
  CallBuffers& b = bufs != nullptr ? *bufs : k.buf;
  pp = {};
  orp = {};
  cp = {};
  cp.residual = b.residual;
  cp.post = reinterpret_cast<const float*>(b.post);
  cp.comb = reinterpret_cast<const float*>(b.comb);
  cp.pre = v == Variant::kResidualOnly ? nullptr : reinterpret_cast<const float*>(b.pre);
  cp.norm_weight = v == Variant::kResidualOnly ? nullptr : b.norm;
  cp.eps = p.eps;
  cp.residual_out = b.res_out;
  cp.layer_input = v == Variant::kResidualOnly ? nullptr : b.layer;
  cp.mxfp8_values = v == Variant::kMxfp8 ? b.values : nullptr;
  cp.mxfp8_scales = v == Variant::kMxfp8 ? reinterpret_cast<uint8_t*>(b.scales) : nullptr;
  cp.fp8_values = testing::is_fp8(v) ? b.values : nullptr;
  cp.fp8_scales = testing::is_fp8(v) ? reinterpret_cast<float*>(b.scales) : nullptr;
  cp.fp8_scale_rows = fp8_group_scale_rows(m);
  // As the harness's launch passes them: kFp8Ue8m0's scales the MN-major view (its extent
  // written), kFp8's the [G, Mp] buffer (every padding row).
  cp.fp8_scale_floats = testing::is_fp8(v) ? testing::scale_bytes_written(v, m, np * 8) / 4 : 0;
  cp.fp8_ue8m0 = v == Variant::kFp8Ue8m0;
  cp.m = m;
  cp.np = np;
  cp.tiling = variant_tiling(np, m, kHc, v);
  cp.err = err;
  cp.id = make_call_identity(fin ? kOpAllReduceFinalize : kOpAllReduceCall, two_shot ? kProtoTwoShotOwner : kProtoOneShot,
                             static_cast<uint32_t>(consumer_variant(v)), static_cast<uint64_t>(m));
  cp.tp = tp;
  cp.rank = r;
  cp.wait_predecessor = true;
  pp.x = fin ? nullptr : b.x;
  if (fin) {
    pp.fin.gemm2 = b.gemm2;
    pp.fin.gemm2_rows = p.gemm2_rows;
    pp.fin.weights = reinterpret_cast<const float*>(b.weights);
    pp.fin.routes = reinterpret_cast<const int32_t*>(b.routes);
    pp.fin.shared = b.shared;
    pp.fin.top_k = p.top_k;
  }
  cp.x = pp.x;
  cp.fin = pp.fin;
  pp.m = m;
  pp.np = np;
  pp.tiling = cp.tiling;
  pp.tp = tp;
  pp.rank = r;
  pp.err = err;
  pp.id = cp.id;
  LamportState* states = k.states.as<LamportState>();
  if (!two_shot) {
    pp.dest = PublishDest::kAllRanks;
    for (int i = 0; i < tp; ++i) pp.targets[i] = ranks[(r + 1 + i) % tp]->ll.get();
    pp.slot_rows = kCap;
    pp.state = &states[0];
    for (int i = 0; i < tp; ++i) cp.targets[i] = pp.targets[i];
    cp.in = k.ll.get();
    cp.nslots = tp;
    cp.slot_rows = kCap;
    cp.state = &states[0];
    cp.protocol = kProtoOneShot;
  } else {
    pp.dest = PublishDest::kOwner;
    for (int i = 0; i < tp; ++i) pp.targets[i] = ranks[i]->bt.get();
    pp.slot_rows = owner_rows;
    pp.state = &states[1];
    orp.mailbox = k.bt.get();
    for (int i = 0; i < tp; ++i) orp.reduced[i] = ranks[(r + 1 + i) % tp]->red.get();
    orp.tp = tp;
    orp.rank = r;
    orp.owner_rows = owner_rows;
    orp.reduced_rows = kCap;
    orp.m = m;
    orp.np = np;
    orp.tiling = cp.tiling;
    orp.state = &states[1];
    orp.err = err;
    orp.id = cp.id;
    cp.in = k.red.get();
    cp.contributions = k.bt.get();
    cp.owner_rows = owner_rows;
    cp.nslots = 1;
    cp.slot_rows = kCap;
    cp.state = &states[1];
    cp.protocol = kProtoTwoShotReduced;
    for (int i = 0; i < tp; ++i) {
      cp.targets[i] = pp.targets[i];
      cp.reduced[i] = orp.reduced[i];
    }
  }
}

// R simulated ranks on one GPU, each with its own streams, protocol state, error records and
// fault word (the ranks' fault words form one table, as the communicator's fault window does),
// their calls enqueued back to back with no host synchronization between calls (as an engine
// issues them): the orderings only concurrency produces, such as a peer one call ahead while
// this rank's streaming kernel resets the previous generation, or a rank that times out while
// its peers still run (PROTOCOL.md I4, I12b). The launch sequence of each path is the library's
// (src/ops/all_reduce_mhc.cpp): PDL on, a publish's consumer not waiting for its predecessor.
// Every rank's grids together stay well within the device (a streaming grid at most 1/(4R) of the
// streaming kernel's resident CTAs, CTA-per-row grids of a few rows, but for the publish kernels
// of kOwnersStreamTwoShot, whose CTAs wait for nothing, and its two looping owner CTAs a rank;
// with PDL a rank may hold two grids at once), so that no rank's spinning kernels can keep a peer's kernel from being
// scheduled, which on real hardware (a GPU a rank) cannot happen.
// kOwnersStreamTwoShot: the two-shot's automatic shape from 1024 rows (publish, the owners'
// reduce on a capped grid looping over rows, then the streaming consumer with no roles), at
// the streaming kinds' M.
enum class Kind { kSingle, kPhasedOneShot, kTwoShot, kStreamOneShot, kStreamTwoShot, kOwnersStreamTwoShot };
constexpr int kKinds = 6;
inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSingle: return "single launch";
    case Kind::kPhasedOneShot: return "one-shot publish + consumer";
    case Kind::kTwoShot: return "two-shot publish + owners + consumer";
    case Kind::kStreamOneShot: return "streaming one-shot";
    case Kind::kStreamTwoShot: return "streaming two-shot";
    case Kind::kOwnersStreamTwoShot: return "two-shot publish + looping owners + streaming consumer";
  }
  return "?";
}
inline bool kind_two_shot(Kind k) {
  return k == Kind::kTwoShot || k == Kind::kStreamTwoShot || k == Kind::kOwnersStreamTwoShot;
}

// The error sinks and fault words of R simulated ranks: one communicator's. Ops of the same
// communicator (ConcurrentGroup's `comm`) share them, as the library's ops share their
// communicator's records and fault window.
struct SimCommunicator {
  // Every kernel a simulated rank may launch is loaded here, as the ops load theirs at
  // construction. By default CUDA loads a kernel at its first launch (lazy loading, the default
  // on Linux since CUDA 12.2), and such a load may wait for the kernels already running (the CUDA
  // Programming Guide, "Lazy Loading", its hazards). One host thread enqueues every rank's calls:
  // a first launch then blocked that thread behind a kernel polling for a call it had yet to
  // enqueue, until the wait's budget expired (one H200, 2026-12-04, 2629af9: in a fresh process
  // the divergence suite's first scenario of each CTA-a-row kind timed out after 10 s, one kind a
  // repeat, at a variant's consumer, the finalize publish kernel and the owners' kernel; the
  // occupancy queries below had touched the streaming kernels, and in a full run earlier tests
  // had loaded every kernel).
  SimCommunicator(int tp_, uint64_t timeout_ns) : tp(tp_), table(tp_ * sizeof(void*)) {
    MHCCL_TEST_CUDA(kernels::preload_all_gather_kernels());  // the all-gather, fill and count kernels
    MHCCL_TEST_CUDA(mhccl::testing::preload_gpu_delay());
    for (int r = 0; r < tp; ++r) sinks.push_back(std::make_unique<RankSink>(timeout_ns, r, tp, table.as<uint32_t*>()));
    std::vector<uint32_t*> words;
    for (auto& k : sinks) words.push_back(k->sink.fault);
    MHCCL_TEST_CUDA(cudaMemcpy(table.get(), words.data(), words.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  int tp;
  DeviceBuffer table;
  std::vector<std::unique_ptr<RankSink>> sinks;
};

struct ConcurrentGroup {
  ConcurrentGroup(int tp_, int64_t cap, uint64_t timeout_ns) : ConcurrentGroup(std::make_shared<SimCommunicator>(tp_, timeout_ns), cap) {}
  // A second op on the same simulated communicator: its own mailboxes and states, the same
  // records and fault words.
  ConcurrentGroup(std::shared_ptr<SimCommunicator> c, int64_t cap) : tp(c->tp), comm(std::move(c)), sinks(comm->sinks) {
    MHCCL_TEST_CUDA(kernels::preload_all_reduce_mhc_kernels(kHc));  // see SimCommunicator
    for (int r = 0; r < tp; ++r) ranks.push_back(std::make_unique<SimRank>(cap, kH, kHc, tp));
    const RowTiling big = one_cta_a_row();
    for (const bool two_shot : {false, true}) {
      resident[two_shot] = streaming_consumer_resident_ctas(kHc, ConsumerInput::kPoll, ConsumerVariant::kPlain,
                                                            two_shot ? 1 : tp, big.threads);
      for (const ConsumerVariant v : {ConsumerVariant::kMxfp8, ConsumerVariant::kResidualOnly}) {
        resident[two_shot] = std::min(resident[two_shot], streaming_consumer_resident_ctas(
                                                              kHc, ConsumerInput::kPoll, v, two_shot ? 1 : tp, big.threads));
      }
    }
  }
  static constexpr int64_t kH = 5120;
  static constexpr int kHc = 4;
  // A row on one CTA: the tiling the host streams with (large M).
  static RowTiling one_cta_a_row() { return row_tiling(static_cast<int>(kH / 8), kMaxSingleLaunchCtas + 1, kHc); }
  int tp;
  std::shared_ptr<SimCommunicator> comm;
  std::vector<std::unique_ptr<RankSink>>& sinks;
  std::vector<std::unique_ptr<SimRank>> ranks;
  int resident[2] = {0, 0};
  // The even ranks' two-shot owners on one looping row group (launch): what the tests run; the
  // simulated bench turns it off (it times the library's launches).
  bool capped_owners = true;
  // A call of rank r rejected (its count, beside its fault word, by one on its stream).
  void reject(int r) { sinks[r]->count_rejected(ranks[r]->stream); }
  // PDL at TP=2 only: a dependent grid launched early holds its SMs while it waits in
  // griddepcontrol.wait, and with four ranks' grids (clusters of 5 CTAs among them) on one GPU
  // that starved a peer's kernel of SMs (one H200, 2026-12-01, b8e9e10: 10 s timeouts at TP=4 only, in calls
  // the same sequence passes at TP=2), which a GPU a rank never sees.
  bool pdl() const { return tp <= 2; }

  // Enqueues rank r's call of problem p on its stream, the library's way for `kind`.
  void launch(int r, Kind kind, const Problem& p, Variant v, CallBuffers& b) {
    const bool two_shot = kind_two_shot(kind);
    PublishParams pp;
    OwnerReduceParams orp;
    ConsumerParams cp;
    build_params(ranks, r, p, v, two_shot, sinks[r]->sink, pp, orp, cp, &b);
    const ConsumerVariant cv = consumer_variant(v);
    cudaStream_t s = ranks[r]->stream;
    switch (kind) {
      case Kind::kSingle:
        cp.publish_first = true;
        break;
      case Kind::kPhasedOneShot:
      case Kind::kTwoShot:
        MHCCL_TEST_CUDA(launch_publish(pp, s, pdl()));
        // capped_owners: even ranks' owners one row group looping over every owned row (the
        // owners' kernel with its grid capped, which the library runs where its consumer streams,
        // capped at the CTAs resident on the rank's own device, so ranks may differ); odd ranks'
        // a group a row. Off: a group a row on every rank, as the library runs these M.
        orp.max_groups = capped_owners && r % 2 == 0 ? 1 : 0;
        if (two_shot) MHCCL_TEST_CUDA(launch_owner_reduce(orp, s, pdl()));
        cp.wait_predecessor = false;
        cp.streaming_min_rows = 0;
        break;
      case Kind::kOwnersStreamTwoShot: {
        // One CTA a row for all three kernels (the library's tiling from 1024 rows); two owner
        // CTAs a rank, each looping over its owned rows; the consumer's grid as the streaming
        // kinds', every CTA of it consuming.
        pp.tiling = orp.tiling = cp.tiling = one_cta_a_row();
        orp.max_groups = 2;
        MHCCL_TEST_CUDA(launch_publish(pp, s, pdl()));
        MHCCL_TEST_CUDA(launch_owner_reduce(orp, s, pdl()));
        cp.wait_predecessor = false;
        cp.streaming_min_rows = 1;
        cp.streaming_ctas = resident[1] / (4 * tp);
        if (!consumer_streams(cp, ConsumerInput::kPoll)) {
          throw std::runtime_error(std::string(kind_name(kind)) + " M=" + std::to_string(p.m) + ": the consumer does not stream");
        }
        break;
      }
      case Kind::kStreamOneShot:
      case Kind::kStreamTwoShot:
        cp.tiling = one_cta_a_row();
        cp.streaming_min_rows = 1;
        cp.streaming_ctas = resident[two_shot] / (4 * tp);
        cp.publisher_ctas = std::max(2, cp.streaming_ctas / 4);
        cp.reducer_ctas = two_shot ? cp.publisher_ctas : 0;
        if (!consumer_streams(cp, ConsumerInput::kPoll)) {
          throw std::runtime_error(std::string(kind_name(kind)) + " M=" + std::to_string(p.m) + ": the launch does not stream");
        }
        break;
    }
    MHCCL_TEST_CUDA(launch_consumer(cp, kHc, ConsumerInput::kPoll, cv, s, pdl()));
  }
};

}  // namespace mhccl::sim
