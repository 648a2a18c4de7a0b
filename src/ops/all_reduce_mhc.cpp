// AllReduceMHC host side: buffers, protocol choice, launches (include/mhccl/all_reduce_mhc.h).
#include "mhccl/all_reduce_mhc.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/debug.h"
#include "common/nvtx.h"
#include "common/text.h"
#include "kernels/launch.h"
#include "mhccl/checks.h"
#include "mhccl/fp8_groups.h"
#include "ops/tuning.h"

namespace mhccl {

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kAuto: return "auto";
    case Protocol::kOneShot: return "one-shot";
    case Protocol::kTwoShot: return "two-shot";
    case Protocol::kNccl: return "nccl";
  }
  return "?";
}

namespace {

using kernels::ConsumerInput;
using kernels::ConsumerParams;
using kernels::ConsumerVariant;
using kernels::PublishDest;
using kernels::PublishParams;

// The built-in thresholds and launch shapes are the built-in tuning table's
// (src/ops/tuning_builtin.json: where each number comes from); a caller's table
// (AllReduceMHCConfig::tuning_file, MHCCL_TUNING_FILE) overrides them (src/ops/tuning.h).
constexpr int64_t kNever = tuning::kNever;  // a threshold never reached

// This op's key in the tuning tables: this rank's GPU and NCCL, the group, the variant built.
tuning::Key tuning_key(const AllReduceMHCConfig& cfg, const Communicator::Impl& c) {
  tuning::Key k;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, c.device) == cudaSuccess) {
    k.gpu = prop.name;
    k.sms = prop.multiProcessorCount;
  }
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    k.nccl = std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  }
  k.p2p = tuning::p2p_key(c.tp, c.reachable, cfg.lamport_self_test);
  k.tp = c.tp;
  k.hidden = cfg.hidden_size;
  k.hc = cfg.hc_mult;
  k.variant = tuning::variant_key(cfg);
  k.top_k = cfg.top_k;
  k.mhccl = tuning::library_version();
  return k;
}

const void* data_of(const DLTensor* t) {
  return t == nullptr ? nullptr : static_cast<const char*>(t->data) + t->byte_offset;
}
void* mutable_data_of(const DLTensor* t) { return const_cast<void*>(data_of(t)); }

}  // namespace

struct AllReduceMHC::Impl {
  std::shared_ptr<Communicator::Impl> comm;
  AllReduceMHCConfig cfg;
  int np = 0;
  int64_t ll_rows = 0;     // rows of the one-shot mailbox
  int64_t owner_rows = 0;  // two-shot rows a rank owns at most: ceil(C / tp)
  bool bt_built = false;
  std::unique_ptr<SymmetricBuffer> ll_mailbox, bt_mailbox, bt_reduced;
  kernels::LamportState* states = nullptr;  // [0] one-shot, [1] two-shot
  // The direct streaming consumer's row ticket counter (TP=1's call, the NCCL path's consumer;
  // ConsumerParams::row_tickets): one word, zero between calls.
  uint32_t* row_tickets = nullptr;
  void* fallback_rows = nullptr;            // NCCL fallback: [C, H] BF16
  void* fallback_ids = nullptr;             // NCCL fallback: the call identities (kernels::fallback_ids_bytes)
  uint32_t op_serial = 0;                   // Communicator::Impl::ops_agreed after this op's agreement
  int ctas_per_row = 0;                     // 0: default tiling (MHCCL_CTAS_PER_ROW overrides)
  // Grid of the streaming consumer per input (direct; one-shot slots; two-shot reduced rows;
  // TP=1 finalize) and variant (plain, mxfp8, residual_only, fp8): the minimum over the ranks of
  // its CTAs resident at once, agreed at construction; 0: it does not run.
  int streaming_ctas[4][kernels::kConsumerVariants] = {};
  // Streaming Lamport calls (one-shot above the single launch, two-shot): CTAs of the grid that
  // publish this rank's rows (call, finalize: finalize's publish gathers top_k GEMM2 rows a row
  // from HBM), and two-shot's CTAs of the owners' reduce.
  int publisher_ctas[2] = {0, 0};
  int reducer_ctas = 0;
  // Two-shot owners' reduce at a CTA a row: its CTAs resident at once on this device (0: a CTA
  // an owned row). Where a rank owns more rows, each CTA loops over them.
  int owner_ctas = 0;
  tuning::Resolved resolved;  // the configuration as agreed, and where its values came from

  ~Impl() {
    if (comm) comm->release({states, fallback_rows, fallback_ids, row_tickets});
  }

  // The configuration checked (check_all_reduce_mhc_config) and resolved (src/ops/tuning.h):
  // explicit values, the launch-shape variables of benchmark sweeps, the caller's tuning table,
  // the built-in one. Throws on a bad value or a malformed table.
  void configure(const AllReduceMHCConfig& config) {
    check_all_reduce_mhc_config(config, comm->tp);
    // Benchmark A/B only, set alike on every rank (agreed at construction like the config): CTAs
    // a row, whether the consumers stream, and the role CTAs of a streaming Lamport call
    // (publishers: call and finalize, one-shot and two-shot alike; two-shot's owners).
    tuning::EnvOverrides env;
    long long v = 0;
    if (detail::env_int("MHCCL_CTAS_PER_ROW", 0, kernels::kMaxCtasPerRow, &v)) env.ctas_per_row = v;
    if (detail::env_int("MHCCL_STREAMING_MIN_ROWS", -1, std::numeric_limits<int32_t>::max(), &v)) env.streaming_min_rows = v;
    if (detail::env_int("MHCCL_STREAM_PUBLISHERS", 1, 1024, &v)) env.publisher_ctas = v;
    if (detail::env_int("MHCCL_STREAM_REDUCERS", 1, 1024, &v)) env.reducer_ctas = v;
    std::string path = config.tuning_file;
    if (path.empty()) {
      const char* e = std::getenv("MHCCL_TUNING_FILE");
      if (e != nullptr) path = e;
    }
    std::optional<tuning::Table> table;
    if (!path.empty()) table = tuning::load_table(path);
    resolved = tuning::resolve(config, tuning_key(config, *comm), env, table ? &*table : nullptr);
    resolved.cfg.tuning_file = path;
    cfg = resolved.cfg;
    ctas_per_row = resolved.ctas_per_row;
    publisher_ctas[0] = resolved.publisher_ctas[0];
    publisher_ctas[1] = resolved.publisher_ctas[1];
    reducer_ctas = resolved.reducer_ctas;
    np = static_cast<int>(cfg.hidden_size / 8);
  }

  int64_t threshold(bool finalize) const {
    return finalize ? cfg.two_shot_min_finalize_rows : cfg.two_shot_min_rows;
  }
  int64_t nccl_threshold(bool finalize) const {
    return finalize ? cfg.nccl_min_finalize_rows : cfg.nccl_min_rows;
  }

  // TP=1 with AllReduceMHCConfig::lamport_self_test: a forced Lamport protocol runs through this
  // rank's own mailbox (without mailboxes, the NCCL fallback forced, resolve() refuses it), and so
  // does kAuto with lamport_self_test_auto where the mailboxes exist; else kAuto is the direct
  // path, never NCCL (lamport_self_test_auto's promise).
  bool self_mailbox(Protocol forced) const {
    return comm->tp == 1 && cfg.lamport_self_test &&
           (forced == Protocol::kOneShot || forced == Protocol::kTwoShot ||
            (forced == Protocol::kAuto && cfg.lamport_self_test_auto && comm->reachable));
  }
  // TP=1 with lamport_self_test and Protocol::kNccl forced: the NCCL fallback's path over the
  // one-rank NCCL communicator (its identity exchange, the watchdog's counts, its NCCL operations
  // and the consumer on the all-reduced rows), so that one GPU runs that host code too.
  bool self_nccl(Protocol forced) const {
    return comm->tp == 1 && cfg.lamport_self_test && forced == Protocol::kNccl;
  }
  // TP=1 without either self test: the consumer reads x (or computes it) itself.
  bool direct_path(Protocol forced) const { return comm->tp == 1 && !self_mailbox(forced) && !self_nccl(forced); }

  Protocol resolve(int64_t m, bool finalize, Protocol forced) const {
    if (forced != Protocol::kAuto && forced != Protocol::kOneShot && forced != Protocol::kTwoShot &&
        forced != Protocol::kNccl) {
      throw Error(ErrorCode::kInvalidArgument,
                  "protocol: expected kAuto, kOneShot, kTwoShot or kNccl, got the value " +
                      std::to_string(static_cast<int>(forced)));
    }
    if (direct_path(forced)) return Protocol::kOneShot;  // TP=1: the consumer reads x itself
    if (self_nccl(forced)) return Protocol::kNccl;
    if (!comm->reachable) {
      if (forced == Protocol::kOneShot || forced == Protocol::kTwoShot) {
        throw Error(ErrorCode::kUnsupported,
                    std::string("protocol ") + protocol_name(forced) +
                        ": peers are not load/store reachable (or the NCCL fallback is forced); "
                        "only the NCCL fallback (at TP=1: the direct path) runs here");
      }
      return Protocol::kNccl;
    }
    Protocol p = forced;
    if (p == Protocol::kAuto) {
      p = m >= nccl_threshold(finalize) && comm->tp > 1 ? Protocol::kNccl
          : m >= threshold(finalize)    ? Protocol::kTwoShot
                                        : Protocol::kOneShot;
    }
    if (p == Protocol::kOneShot && m > ll_rows) {
      throw Error(ErrorCode::kInvalidArgument,
                  "protocol one-shot: its mailbox holds " + std::to_string(ll_rows) +
                      " rows (below the two-shot thresholds), got M=" + std::to_string(m));
    }
    if (p == Protocol::kTwoShot && !bt_built) {
      throw Error(ErrorCode::kUnsupported,
                  "protocol two-shot: not built, max_num_tokens " + std::to_string(cfg.max_num_tokens) +
                      " is below both two-shot thresholds");
    }
    return p;
  }

  // streaming_ctas: this device's resident CTAs of the streaming consumer per input and variant,
  // then at TP > 1 their minimum over the ranks (an NCCL all-reduce: construction is collective,
  // and a rank that fails here leaves its peers in this collective, as in the window
  // registrations).
  void agree_streaming_grid(bool polls) {
    const kernels::RowTiling t = kernels::row_tiling(np, kernels::kMaxSingleLaunchCtas + 1, cfg.hc_mult);
    constexpr int kV = kernels::kConsumerVariants;
    int local[4 * kV] = {};
    if (t.ctas_per_row == 1) {  // rows wider than one CTA never stream (the FP8 tiling's threads are these)
      for (int v = 0; v < kV; ++v) {
        const auto variant = static_cast<ConsumerVariant>(v);
        local[v] = kernels::streaming_consumer_resident_ctas(cfg.hc_mult, ConsumerInput::kDirect, variant, 1, t.threads);
        local[3 * kV + v] = kernels::streaming_consumer_resident_ctas(cfg.hc_mult, ConsumerInput::kFinalize, variant, 1,
                                                                  t.threads, static_cast<int>(cfg.top_k));
        if (polls) {  // one-shot reads tp slots a row, two-shot one reduced row
          local[kV + v] = kernels::streaming_consumer_resident_ctas(cfg.hc_mult, ConsumerInput::kPoll, variant,
                                                                    comm->tp, t.threads);
          local[2 * kV + v] = kernels::streaming_consumer_resident_ctas(cfg.hc_mult, ConsumerInput::kPoll, variant, 1,
                                                                    t.threads);
        }
      }
    }
    comm->all_reduce_ints(local, ncclMin, "AllReduceMHC's streaming grid agreement");
    for (int i = 0; i < 4; ++i) {
      for (int v = 0; v < kV; ++v) streaming_ctas[i][v] = local[kV * i + v];
    }
  }

  // The collective part of construction after the agreement: the streaming grid, mailboxes, states.
  void build(Communicator& comm);
  // What build() allocates on this rank, from the configuration, TP and whether the peers are
  // reachable alone, so known before the agreement: the one-shot mailbox's rows, the two-shot's
  // buffers and owned rows, the NCCL path's rows, and the device memory of them all
  // (Communicator::Impl::symmetric_window_bytes for each mailbox).
  struct Buffers {
    bool mailboxes = false;  // the Lamport mailboxes (TP > 1 with peers reachable, or the self-test)
    int64_t ll_rows = 0;     // rows of the one-shot mailbox
    bool two_shot = false;   // the two-shot's mailbox and reduced rows
    int64_t owner_rows = 0;  // two-shot rows a rank owns at most: ceil(C / tp)
    bool fallback = false;   // the NCCL path's rows, allocated now (else by its first call, if any)
    uint64_t bytes = 0;
  };
  Buffers buffers(const Communicator::Impl& c) const {
    Buffers b;
    const int64_t cap = cfg.max_num_tokens, row_bytes = cfg.hidden_size * 2;
    const auto window = Communicator::Impl::symmetric_window_bytes;
    b.mailboxes = (c.tp > 1 || cfg.lamport_self_test) && c.reachable;
    if (b.mailboxes) {
      const int64_t hi = std::max(cfg.two_shot_min_rows, cfg.two_shot_min_finalize_rows);
      const int64_t lo = std::min(cfg.two_shot_min_rows, cfg.two_shot_min_finalize_rows);
      b.ll_rows = std::min(cap, std::max<int64_t>(hi - 1, 1));
      b.bytes += window(kernels::mailbox_bytes(c.tp, b.ll_rows, np));
      b.two_shot = cap >= lo;
      if (b.two_shot) {
        b.owner_rows = (cap + c.tp - 1) / c.tp;
        b.bytes += window(kernels::mailbox_bytes(c.tp, b.owner_rows, np)) + window(kernels::mailbox_bytes(1, cap, np));
      }
      b.fallback = cap >= std::min(cfg.nccl_min_rows, cfg.nccl_min_finalize_rows);  // the automatic choice takes NCCL
    } else {
      b.fallback = c.tp > 1;
    }
    if (b.fallback) b.bytes += static_cast<uint64_t>(cap * row_bytes + kernels::fallback_ids_bytes());
    return b;
  }

  void ensure_fallback_rows(cudaStream_t stream) {
    if (fallback_rows != nullptr) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    MHCCL_CUDA(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) {
      throw Error(ErrorCode::kInvalidArgument,
                  "protocol nccl: its buffer is allocated by the first NCCL-path call, which must "
                  "not be under CUDA-graph capture; make one such call before capturing");
    }
    alloc_fallback(static_cast<size_t>(cfg.max_num_tokens * cfg.hidden_size * 2), stream);
  }
  // The NCCL path's rows and its identity buffer (its call count zeroed, in order on `stream`).
  void alloc_fallback(size_t row_bytes_total, cudaStream_t stream) {
    Communicator::Impl::ready_fallback_ids(fallback_ids, stream);  // a retry after a failure below allocates it once
    MHCCL_CUDA(cudaMalloc(&fallback_rows, row_bytes_total));
  }

  // The launch shape of a call of m rows, from rank-invariant inputs only (but for owner_groups):
  // the consumer's input, the fields of its params that set its grid and roles (tiling, streaming
  // grid, publisher and reducer CTAs, whether it publishes first), and which kernels run before
  // it. run() launches from it; MHCCL_DEBUG=INFO describes it for every M. `direct`: TP=1 without
  // the self-test mailboxes.
  struct Shape {
    ConsumerInput input = ConsumerInput::kPoll;
    ConsumerParams cp = {};
    bool publish_kernel = false;       // one-shot, two-shot: a publish kernel before the consumer
    bool owner_reduce_kernel = false;  // two-shot: and the owners' reduce between them
    // The owners' reduce's grid cap (OwnerReduceParams::max_groups; 0: a CTA an owned row): its
    // CTAs resident at once on this rank's device (owner_ctas, a per-rank query that pairs with
    // nothing), where the consumer after it streams (the shape measured: PERFORMANCE.md, 2026-12-04).
    int64_t owner_groups = 0;
  };
  Shape shape(int64_t m, bool finalize, ConsumerVariant variant, Protocol proto, bool direct) const {
    Shape s;
    ConsumerParams& cp = s.cp;
    // The FP8 variant's groups of 16 packs never straddle the CTAs of a row.
    cp.tiling = kernels::row_tiling(np, m, cfg.hc_mult, ctas_per_row,
                                    variant == ConsumerVariant::kFp8 ? kernels::kFp8GroupPacks : 4);
    cp.m = m;
    cp.np = np;
    cp.streaming_min_rows = cfg.streaming_min_rows;
    if (finalize) cp.fin.top_k = cfg.top_k;
    const int vi = static_cast<int>(variant);
    cp.streaming_ctas = streaming_ctas[0][vi];
    if (direct) {
      s.input = finalize ? ConsumerInput::kFinalize : ConsumerInput::kDirect;
      if (finalize) cp.streaming_ctas = streaming_ctas[3][vi];
    } else if (proto == Protocol::kOneShot) {
      cp.streaming_ctas = streaming_ctas[1][vi];
      cp.publisher_ctas = publisher_ctas[finalize ? 1 : 0];
      // Single launch only where its grid is co-resident by construction: at most 96 CTAs, and
      // rows that fit one CTA (small-M clusters of up to 5 CTAs of at most 128 threads).
      const int64_t ctas = m * cp.tiling.ctas_per_row;
      const bool row_fits_one_cta = np <= kernels::max_threads_per_cta(cfg.hc_mult);
      const bool single = row_fits_one_cta && ctas <= kernels::kMaxSingleLaunchCtas &&
                          (cfg.single_launch_max_rows < 0 || m <= cfg.single_launch_max_rows);
      if (single) {
        cp.publish_first = true;
      } else if (!kernels::consumer_streams(cp, ConsumerInput::kPoll)) {
        cp.publisher_ctas = 0;  // a publish kernel, then a CTA per row
        s.publish_kernel = true;
      }  // else: the streaming consumer's first CTAs publish (it waits for the call's inputs)
    } else if (proto == Protocol::kTwoShot) {
      cp.contributions = bt_mailbox->local();
      cp.streaming_ctas = streaming_ctas[2][vi];
      // Streaming: one launch whose first CTAs to arrive publish, the next reduce the owned rows, the
      // rest consume. Otherwise three kernels: publish, owners' reduce, consumer.
      cp.publisher_ctas = publisher_ctas[finalize ? 1 : 0];
      cp.reducer_ctas = reducer_ctas;
      if (!kernels::consumer_streams(cp, ConsumerInput::kPoll)) {
        cp.publisher_ctas = cp.reducer_ctas = 0;
        s.publish_kernel = s.owner_reduce_kernel = true;
        // The consumer after them streams (with no roles) automatically from
        // kPollStreamingMinRows rows (consumer_streams), and its owners' CTAs then loop.
        if (kernels::consumer_streams(cp, ConsumerInput::kPoll)) s.owner_groups = owner_ctas;
      }
    } else {  // NCCL fallback: the consumer reads the all-reduced rows
      s.input = ConsumerInput::kDirect;
    }
    return s;
  }

  // MHCCL_DEBUG=INFO: how an automatic call of m rows runs, in words.
  std::string launch_text(int64_t m, bool finalize, ConsumerVariant variant) const {
    const Protocol proto = resolve(m, finalize, Protocol::kAuto);
    const bool direct = direct_path(Protocol::kAuto);
    const Shape s = shape(m, finalize, variant, proto, direct);
    const ConsumerParams& cp = s.cp;
    std::string t = direct ? "direct (TP=1), one launch" : protocol_name(proto);
    if (!direct && proto == Protocol::kNccl) {
      t += ": ncclAllReduce, then the consumer";
    } else if (s.owner_reduce_kernel) {
      t += ": publish, owners' reduce, consumer";
      if (kernels::owner_reduce_loops(m, comm->tp, s.owner_groups)) {
        t += " (the owners' reduce on " + std::to_string(s.owner_groups) + " CTAs, each looping over rows)";
      }
    } else if (s.publish_kernel) {
      t += ": publish, consumer";
    } else if (!direct) {
      t += cp.publish_first ? ", one launch (each CTA publishes its row, then polls)" : ", one launch";
    }
    if (kernels::consumer_streams(cp, s.input)) {
      t += "; streaming consumer: a persistent grid of " +
           std::to_string(std::min<int64_t>(m + cp.publisher_ctas + cp.reducer_ctas, cp.streaming_ctas)) + " CTAs";
      if (cp.publisher_ctas > 0) t += " (" + std::to_string(cp.publisher_ctas) + " publish";
      if (cp.reducer_ctas > 0) t += ", " + std::to_string(cp.reducer_ctas) + " reduce";
      if (cp.publisher_ctas > 0) t += ")";
    } else {
      t += "; " + std::to_string(cp.tiling.ctas_per_row) + (cp.tiling.ctas_per_row > 1 ? " CTAs (a cluster)" : " CTA") +
           " a row of " + std::to_string(cp.tiling.threads) + " threads";
    }
    return t;
  }

  // MHCCL_DEBUG=INFO: this construction's decisions, once.
  void report_construction() const;

  // AllReduceMHC::mailbox_bytes(): the mailboxes and the NCCL path's rows.
  size_t mailbox_bytes_total() const {
    size_t b = 0;
    for (const auto* buf : {ll_mailbox.get(), bt_mailbox.get(), bt_reduced.get()}) {
      if (buf) b += buf->bytes();
    }
    if (fallback_rows) b += static_cast<size_t>(cfg.max_num_tokens * cfg.hidden_size * 2 + kernels::fallback_ids_bytes());
    return b;
  }

  // `launched`: set once anything that pairs with the peers went out (Communicator::Impl::guarded_call).
  void run(const DLTensor* x, const AllReduceMHCFinalizeArgs* fin, const MHCEpilogueArgs& e,
           Protocol forced, int64_t m, cudaStream_t stream, bool& launched) {
    const bool finalize = fin != nullptr;
    const Protocol proto = resolve(m, finalize, forced);
    Communicator::Impl& c = *comm;
    const bool direct = direct_path(forced);
    const ConsumerVariant variant = e.pre == nullptr ? ConsumerVariant::kResidualOnly
                                    : e.mxfp8_values != nullptr ? ConsumerVariant::kMxfp8
                                    : e.fp8_values != nullptr   ? ConsumerVariant::kFp8
                                                                : ConsumerVariant::kPlain;
    const Shape s = shape(m, finalize, variant, proto, direct);
    detail::nvtx::Range range(finalize ? detail::nvtx::Kind::kFinalize : detail::nvtx::Kind::kCall, m, [&] {
      return detail::nvtx::call_name(finalize ? "finalize" : "call", direct ? "direct" : protocol_name(proto), m);
    });
    detail::DeviceGuard guard(c.device);
    const bool pdl = cfg.enable_pdl;
    const uint32_t op = finalize ? kernels::kOpAllReduceFinalize : kernels::kOpAllReduceCall;

    // A launch that fails before anything went out rejects the call (its state is untouched); a
    // Lamport call whose first launch went out and a later one failed has this rank's protocol
    // state (the generation the publish used, not advanced) behind its peers': guarded_call makes
    // the communicator unusable then, so the error surfaces now and the op is rebuilt, instead
    // of timing out later.
    auto launch = [&](cudaError_t status, const char* what) {
      detail::check_cuda(status, what);
      if (c.tp > 1) launched = true;
    };
    PublishParams pp = {};

    ConsumerParams cp = s.cp;  // the launch shape; the tensors and the protocol's buffers below
    cp.residual = data_of(e.residual);
    cp.post = static_cast<const float*>(data_of(e.post));
    cp.comb = static_cast<const float*>(data_of(e.comb));
    cp.pre = static_cast<const float*>(data_of(e.pre));
    cp.norm_weight = data_of(e.norm_weight);
    cp.eps = e.eps;
    cp.residual_out = mutable_data_of(e.residual_out);
    cp.layer_input = mutable_data_of(e.layer_input);
    cp.mxfp8_values = mutable_data_of(e.mxfp8_values);
    cp.mxfp8_scales = static_cast<uint8_t*>(mutable_data_of(e.mxfp8_scales));
    cp.fp8_values = mutable_data_of(e.fp8_values);
    cp.fp8_scales = static_cast<float*>(mutable_data_of(e.fp8_scales));
    cp.fp8_scale_rows = fp8_group_scale_rows(m);
    cp.fp8_scale_floats = e.fp8_scales == nullptr ? 0 : fp8_scale_floats(*e.fp8_scales, m, cfg.hidden_size);
    cp.fp8_ue8m0 = cfg.fp8_ue8m0_scales;
    cp.err = c.sink(op);
    // This rank's identity of the call (PROTOCOL.md, I19): every peer's call header must equal it.
    cp.id = kernels::make_call_identity(op, proto == Protocol::kTwoShot ? kernels::kProtoTwoShotOwner : kernels::kProtoOneShot,
                                        static_cast<uint32_t>(variant), static_cast<uint64_t>(m));
    cp.tp = c.tp;
    cp.row_tickets = row_tickets;
    cp.wait_predecessor = true;  // cleared below where our own publish precedes the consumer

    pp.x = finalize ? nullptr : data_of(x);
    if (finalize) {
      pp.fin.gemm2 = data_of(fin->gemm2_permuted);
      pp.fin.gemm2_rows = fin->gemm2_permuted->shape[0];
      pp.fin.weights = static_cast<const float*>(data_of(fin->expert_weights));
      pp.fin.routes = static_cast<const int32_t*>(data_of(fin->expanded_idx_to_permuted_idx));
      pp.fin.shared = data_of(fin->shared_output);
      pp.fin.top_k = cfg.top_k;
    }
    cp.fin = pp.fin;
    cp.x = pp.x;       // a single-launch consumer publishes what the publish kernel would
    cp.rank = c.rank;
    pp.m = m;
    pp.np = np;
    pp.tiling = cp.tiling;
    pp.tp = c.tp;
    pp.rank = c.rank;
    pp.err = cp.err;
    pp.id = cp.id;

    if (direct) {
      if (!finalize) cp.in = pp.x;
    } else if (proto == Protocol::kOneShot) {
      pp.dest = PublishDest::kAllRanks;
      for (int i = 0; i < c.tp; ++i) pp.targets[i] = ll_mailbox->peer((c.rank + 1 + i) % c.tp);
      pp.slot_rows = ll_rows;
      pp.state = &states[0];
      for (int i = 0; i < c.tp; ++i) cp.targets[i] = pp.targets[i];
      cp.in = ll_mailbox->local();
      cp.nslots = c.tp;
      cp.slot_rows = ll_rows;
      cp.state = &states[0];
      cp.protocol = kernels::kProtoOneShot;
      if (s.publish_kernel) {
        launch(kernels::launch_publish(pp, stream, pdl), "launch of the one-shot publish");
        cp.wait_predecessor = false;
      }
    } else if (proto == Protocol::kTwoShot) {
      pp.dest = PublishDest::kOwner;
      for (int r = 0; r < c.tp; ++r) pp.targets[r] = bt_mailbox->peer(r);
      pp.slot_rows = owner_rows;
      pp.state = &states[1];
      kernels::OwnerReduceParams orp = {};
      orp.wait_predecessor = false;  // the publish before it waited for the call's inputs
      orp.mailbox = bt_mailbox->local();
      for (int i = 0; i < c.tp; ++i) orp.reduced[i] = bt_reduced->peer((c.rank + 1 + i) % c.tp);
      orp.tp = c.tp;
      orp.rank = c.rank;
      orp.owner_rows = owner_rows;
      orp.reduced_rows = cfg.max_num_tokens;
      orp.m = m;
      orp.np = np;
      orp.tiling = cp.tiling;
      orp.max_groups = s.owner_groups;
      orp.state = &states[1];
      orp.err = cp.err;
      orp.id = cp.id;
      cp.in = bt_reduced->local();
      cp.owner_rows = owner_rows;
      cp.nslots = 1;
      cp.slot_rows = cfg.max_num_tokens;
      cp.state = &states[1];
      cp.protocol = kernels::kProtoTwoShotReduced;
      for (int r = 0; r < c.tp; ++r) cp.targets[r] = pp.targets[r];
      for (int i = 0; i < c.tp; ++i) cp.reduced[i] = orp.reduced[i];
      if (s.publish_kernel) {
        launch(kernels::launch_publish(pp, stream, pdl), "launch of the two-shot publish");
        launch(kernels::launch_owner_reduce(orp, stream, pdl), "launch of the two-shot owners' reduce");
        cp.wait_predecessor = false;
      }
    } else {  // NCCL fallback: all-reduce the BF16 rows, then the same consumer on them
      ensure_fallback_rows(stream);
      const void* src = pp.x;
      if (finalize) {
        pp.dest = PublishDest::kLocal;
        pp.targets[0] = fallback_rows;
        MHCCL_CUDA(kernels::launch_publish(pp, stream, pdl));
        src = fallback_rows;
      }
      // Bracketed by the watchdog's progress counts (NCCL's wait for a peer has no budget of its
      // own), with the call's identity exchanged and checked (PROTOCOL.md I19: every rank checks
      // every rank's; the op's serial number too, since ops share the NCCL communicator).
      const kernels::CallIdentity id = kernels::with_op_serial(
          kernels::make_call_identity(op, kernels::kProtoNccl, static_cast<uint32_t>(variant), static_cast<uint64_t>(m)),
          op_serial);
      c.fallback_call("protocol nccl", cp.err, id, fallback_ids, [&] {
        return ncclAllReduce(src, fallback_rows, static_cast<size_t>(m * cfg.hidden_size), ncclBfloat16, ncclSum, c.comm,
                             stream);
      }, stream, "ncclAllReduce of the NCCL fallback", launched);
      cp.in = fallback_rows;
    }
    launch(kernels::launch_consumer(cp, cfg.hc_mult, s.input, variant, stream, pdl), "launch of the consumer");
  }
};

AllReduceMHC::AllReduceMHC(Communicator& comm, const AllReduceMHCConfig& config)
    : impl_(std::make_unique<Impl>()) {
  detail::nvtx::Range range(detail::nvtx::Kind::kConstruction, config.max_num_tokens, [&] {
    return "mhccl.AllReduceMHC H=" + std::to_string(config.hidden_size) + " hc=" + std::to_string(config.hc_mult) +
           " C=" + std::to_string(config.max_num_tokens);
  });
  Impl& im = *impl_;
  im.comm = comm.impl();
  Communicator::Impl& c = *im.comm;
  c.check_for_construction("AllReduceMHC");
  // This rank's configuration, checked and resolved; an error waits for the agreement below, so
  // that every rank throws (a rank leaving alone would leave its peers in the collective).
  std::exception_ptr local_error;
  try {
    im.configure(config);
    // Every kernel an op can launch loaded now, before the agreement: a failure here is a
    // local error every rank learns of there, not a peer left in a later collective.
    detail::DeviceGuard guard(c.device);
    MHCCL_CUDA(kernels::preload_all_reduce_mhc_kernels(im.cfg.hc_mult));
    MHCCL_CUDA(kernels::preload_all_gather_kernels());  // the fill and count kernels among them
    c.require_device_memory("AllReduceMHC with max_num_tokens " + std::to_string(im.cfg.max_num_tokens),
                            im.buffers(c).bytes, "lower max_num_tokens, or free device memory before building the op");
  } catch (...) {  // ours or not (std::bad_alloc): every rank learns of it at the agreement
    local_error = std::current_exception();
  }
  // Every field of the configuration, the resolved thresholds and launch shapes among them
  // (tuning::agreement_fields): ranks whose tuning tables differ raise here, naming the field.
  if (local_error) im.resolved.cfg = config;  // a rank whose configure failed still agrees on its fields
  c.agree("AllReduceMHC", tuning::agreement_fields(im.resolved, c.options.force_nccl_fallback), local_error);
  im.op_serial = c.ops_agreed;
  // After the agreement a failure on this rank leaves its peers in a later collective (they
  // raise kPeerTimeout within the budget): this rank's communicator is out of step with theirs
  // from then on, so it becomes unusable too.
  try {
    im.build(comm);
  } catch (...) {
    c.apart_after_agreement("AllReduceMHC", std::current_exception());
    throw;
  }
  if (detail::debug_info()) {
    try {  // a report that fails must not fail a construction every rank completed
      im.report_construction();
    } catch (const std::exception& e) {
      detail::debug_print("AllReduceMHC", std::string("the construction report failed: ") + e.what());
    }
  }
}

void AllReduceMHC::Impl::report_construction() const {
  const Communicator::Impl& c = *comm;
  const auto never = [](int64_t rows) { return rows == kNever ? std::string("never") : "M >= " + std::to_string(rows); };
  const ConsumerVariant built = cfg.residual_only              ? ConsumerVariant::kResidualOnly
                                : cfg.quantize_layer_input     ? ConsumerVariant::kMxfp8
                                : cfg.quantize_layer_input_fp8 ? ConsumerVariant::kFp8
                                                               : ConsumerVariant::kPlain;
  static constexpr const char* kVariantNames[] = {"plain", "mxfp8", "residual-only", "fp8"};
  detail::Text t;
  t << "tuning: " << resolved.source << "\n";
  t << "H=" << cfg.hidden_size << " hc=" << cfg.hc_mult << " max_num_tokens=" << cfg.max_num_tokens
    << " top_k=" << cfg.top_k << ", variants: plain" << (cfg.quantize_layer_input ? ", mxfp8" : "")
    << (cfg.quantize_layer_input_fp8 ? (cfg.fp8_ue8m0_scales ? ", fp8 (UE8M0 scales)" : ", fp8") : "")
    << (cfg.residual_only ? ", residual-only" : "") << ", PDL " << (cfg.enable_pdl ? "on" : "off") << "\n";
  if (c.tp > 1 && !c.reachable) {
    t << "every call: the NCCL fallback (peers not load/store reachable, or the fallback forced)\n";
  } else {
    t << "two-shot: call " << never(cfg.two_shot_min_rows) << ", finalize " << never(cfg.two_shot_min_finalize_rows)
      << (bt_built || c.tp == 1 ? "" : " (not built: max_num_tokens is below both)") << "; NCCL all-reduce: call "
      << never(cfg.nccl_min_rows) << ", finalize " << never(cfg.nccl_min_finalize_rows) << "\n";
  }
  t << "mailboxes a rank: ";
  if (ll_mailbox) t << "one-shot " << ll_rows << " rows " << detail::bytes_text(ll_mailbox->bytes()) << "; ";
  if (bt_mailbox) {
    t << "two-shot " << owner_rows << " owned rows " << detail::bytes_text(bt_mailbox->bytes()) << " + reduced rows "
      << detail::bytes_text(bt_reduced->bytes()) << "; ";
  }
  if (fallback_rows) t << "NCCL path rows " << detail::bytes_text(static_cast<uint64_t>(cfg.max_num_tokens * cfg.hidden_size * 2)) << "; ";
  t << "in all " << detail::bytes_text(mailbox_bytes_total()) << "\n";
  t << "grid: CTAs a row " << (ctas_per_row > 0 ? std::to_string(ctas_per_row) + " (MHCCL_CTAS_PER_ROW)" : "by M")
    << "; streaming consumer resident CTAs (agreed over the ranks; direct, one-shot, two-shot, TP=1 finalize) for "
    << kVariantNames[static_cast<int>(built)] << ": " << streaming_ctas[0][static_cast<int>(built)] << ", "
    << streaming_ctas[1][static_cast<int>(built)] << ", " << streaming_ctas[2][static_cast<int>(built)] << ", "
    << streaming_ctas[3][static_cast<int>(built)] << "; publishing CTAs " << publisher_ctas[0] << " (call), "
    << publisher_ctas[1] << " (finalize), owners' reducing CTAs " << reducer_ctas
    << "; owners' reduce kernel at most " << owner_ctas << " CTAs (0: one an owned row); streaming_min_rows "
    << cfg.streaming_min_rows << (cfg.streaming_min_rows < 0 ? " (automatic)" : "") << "\n";
  // The M classes: consecutive M whose calls launch alike, for the variant built (every M up to
  // 65536 rows; beyond, at powers of two and at max_num_tokens).
  constexpr int64_t kEveryM = 65536;
  const int64_t every = std::min(cfg.max_num_tokens, kEveryM);
  for (const bool finalize : {false, true}) {
    t << (finalize ? "finalize" : "call") << " (" << kVariantNames[static_cast<int>(built)] << ") by M:\n";
    std::string last;
    int64_t from = 1;
    for (int64_t m = 1; m <= every + 1; ++m) {
      const std::string now = m <= every ? launch_text(m, finalize, built) : std::string();
      if (m > 1 && now != last) {
        t << "  M " << from << (m - 1 > from ? "-" + std::to_string(m - 1) : std::string()) << ": " << last << "\n";
        from = m;
      }
      last = now;
    }
    for (int64_t m = 2 * kEveryM; m < 2 * cfg.max_num_tokens; m *= 2) {
      const int64_t at = std::min(m, cfg.max_num_tokens);
      t << "  M " << at << ": " << launch_text(at, finalize, built) << "\n";
    }
  }
  detail::debug_print("rank " + std::to_string(c.rank) + "/" + std::to_string(c.tp) + " cuda:" + std::to_string(c.device) +
                          " AllReduceMHC",
                      t.str());
}

void AllReduceMHC::Impl::build(Communicator& comm) {
  Impl& im = *this;
  Communicator::Impl& c = *im.comm;
  const AllReduceMHCConfig& cfg = im.cfg;
  detail::DeviceGuard guard(c.device);
  const Buffers b = im.buffers(c);  // what the check before the agreement counted
  im.agree_streaming_grid(b.mailboxes);
  const int64_t row_bytes = cfg.hidden_size * 2;
  const int64_t cap = cfg.max_num_tokens;
  MHCCL_CUDA(cudaMalloc(&im.row_tickets, sizeof(uint32_t)));
  MHCCL_CUDA(cudaMemsetAsync(im.row_tickets, 0, sizeof(uint32_t), c.setup_stream));
  if (b.mailboxes) {
    im.ll_rows = b.ll_rows;
    // Each mailbox: its rows and the call headers beside them (kernels/params.h, mailbox_bytes).
    im.ll_mailbox = comm.alloc_symmetric(static_cast<size_t>(kernels::mailbox_bytes(c.tp, im.ll_rows, im.np)),
                                         kernels::kBf16SentinelPair);
    im.bt_built = b.two_shot;
    if (im.bt_built) {
      im.owner_rows = b.owner_rows;
      im.bt_mailbox = comm.alloc_symmetric(static_cast<size_t>(kernels::mailbox_bytes(c.tp, im.owner_rows, im.np)),
                                           kernels::kBf16SentinelPair);
      im.owner_ctas = kernels::owner_reduce_resident_ctas(
          kernels::row_tiling(im.np, kernels::kMaxSingleLaunchCtas + 1, cfg.hc_mult).threads);
      im.bt_reduced = comm.alloc_symmetric(static_cast<size_t>(kernels::mailbox_bytes(1, cap, im.np)),
                                           kernels::kBf16SentinelPair);
    }
    if (b.fallback) im.alloc_fallback(static_cast<size_t>(cap * row_bytes), c.setup_stream);
    MHCCL_CUDA(cudaMalloc(&im.states, 2 * sizeof(kernels::LamportState)));
    MHCCL_CUDA(cudaMemsetAsync(im.states, 0, 2 * sizeof(kernels::LamportState), c.setup_stream));
  } else if (b.fallback) {
    im.alloc_fallback(static_cast<size_t>(cap * row_bytes), c.setup_stream);
  }
  c.setup_wait("AllReduceMHC construction");  // the fills and zeroed words above
}

AllReduceMHC::~AllReduceMHC() = default;

void AllReduceMHC::call(const AllReduceMHCCallArgs& args, cudaStream_t stream) {
  Impl& im = *impl_;
  im.comm->guarded_call("AllReduceMHC.call", stream, [&](bool& launched) {
    im.comm->check();
    const int64_t m = check_all_reduce_mhc_call(im.cfg, im.comm->device, args);
    im.run(args.x, nullptr, args.epilogue, args.protocol, m, stream, launched);
  });
}

void AllReduceMHC::finalize(const AllReduceMHCFinalizeArgs& args, cudaStream_t stream) {
  Impl& im = *impl_;
  im.comm->guarded_call("AllReduceMHC.finalize", stream, [&](bool& launched) {
    im.comm->check();
    const int64_t m = check_all_reduce_mhc_finalize(im.cfg, im.comm->device, args);
    im.run(nullptr, &args, args.epilogue, args.protocol, m, stream, launched);
  });
}

Protocol AllReduceMHC::protocol_for(int64_t m, bool finalize) const {
  if (m < 1 || m > impl_->cfg.max_num_tokens) {  // as a call's M (check_all_reduce_mhc_call)
    throw Error(ErrorCode::kInvalidArgument, "protocol_for: m: expected 1.." + std::to_string(impl_->cfg.max_num_tokens) +
                                                 " (max_num_tokens), got " + std::to_string(m));
  }
  return impl_->resolve(m, finalize, Protocol::kAuto);
}

const AllReduceMHCConfig& AllReduceMHC::config() const { return impl_->cfg; }

const std::string& AllReduceMHC::tuning_source() const { return impl_->resolved.source; }

size_t AllReduceMHC::mailbox_bytes() const { return impl_->mailbox_bytes_total(); }

}  // namespace mhccl
