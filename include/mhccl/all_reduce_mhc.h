// AllReduceMHC: a Lamport TP all-reduce fused with DeepSeek V4.1's mHC post-mix, the collapse
// with the carried pre-mix, RMSNorm and an optional MXFP8 layer input (SPEC.md, AllReduceMHC);
// `finalize` also folds the MoE top-k reduction and the shared expert into the publish.
//
// One call = one launch for small M (the consumer publishes its own row first, then polls) and
// for large M (a persistent grid whose CTAs publish or consume: streaming_min_rows), a publish +
// a consumer launch in between, and the owners' reduce between them for two-shot.
// Algorithm: the one-shot ("LL") and two-shot ("BT") Lamport protocols of TensorRT-LLM /
// FlashInfer all-reduce fusion, here over unicast NVLink peer mappings of NCCL symmetric
// windows (no multicast); invariants in docs/PROTOCOL.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

namespace mhccl {

class Communicator;

enum class Protocol {
  kAuto,     // by row thresholds that depend on M, tp and H only (every rank decides alike)
  kOneShot,  // LL: every rank stores its rows into every rank's mailbox, each sums all tp slots
  kTwoShot,  // BT: row m owned by rank m % tp; owners sum and store into every rank
  kNccl,     // ncclAllReduce on BF16 + the same fused consumer (also where peers are unreachable)
};
const char* protocol_name(Protocol p);

struct AllReduceMHCConfig {
  int64_t hidden_size = 5120;    // H: a multiple of 8 (of 32 with quantize_layer_input, of 128
                                 // with quantize_layer_input_fp8), <= 32768
  int hc_mult = 4;               // hc: 1, 2, 4 or 8
  int64_t max_num_tokens = 0;    // C: rows per call at most, 1 to 2^24 (kMaxTokens)
  int top_k = 6;                 // routes per token of finalize, 1..16
  bool quantize_layer_input = false;  // build the MXFP8 variant (accept mxfp8 outputs)
  // Build the per-token-group FP8 variant (accept fp8 outputs: groups of 128 elements, FP32
  // scales in DeepGEMM's MN-major TMA-aligned layout, include/mhccl/fp8_groups.h): H a multiple
  // of 128; not together with quantize_layer_input.
  bool quantize_layer_input_fp8 = false;
  // With quantize_layer_input_fp8: power-of-two scales, s = 2^ceil(log2(s)) (the UE8M0 rule of
  // DeepGEMM's newer recipes and vLLM's use_ue8m0); still stored as FP32.
  bool fp8_ue8m0_scales = false;
  bool residual_only = false;         // build the residual-only variant (pre, norm_weight absent)
  // A call of M rows uses two-shot when M >= two_shot_min_rows (finalize:
  // two_shot_min_finalize_rows), one-shot below. 0 takes the default measured for tp;
  // a value above max_num_tokens disables two-shot. The one-shot mailbox holds only the rows
  // below the larger threshold. Defaults: TP=2 call 2048, finalize never (two-shot measured
  // slower for finalize at every M; the one-shot mailbox then holds max_num_tokens rows:
  // 3 * tp * max_num_tokens * H * 2 bytes); TP=4 384/512, TP=8 192/256 (extrapolated);
  // TP=1 with lamport_self_test: never (forced two-shot needs a threshold set).
  int64_t two_shot_min_rows = 0;
  int64_t two_shot_min_finalize_rows = 0;
  // Opt-in: the automatic choice takes the NCCL all-reduce + the fused consumer
  // (Protocol::kNccl) for M >= nccl_min_rows (finalize: nccl_min_finalize_rows), ahead of the
  // two-shot threshold. 0 (the default): never. Why opt-in: NCCL waits for a dead peer without
  // a budget (no kPeerTimeout; the Lamport paths never hang). Why one may want it: at TP=2 and
  // M >= 4096 the NCCL all-reduce + the streaming consumer beats both Lamport protocols for call
  // (2 x H200, 2026-12-01, 6c0c77d: 271 vs 300 us two-shot at M = 4096, 517 vs 597 at 8192;
  // about even at 2048; finalize: never faster). The same bits at TP=2 only (at TP > 2 NCCL's
  // sum is not in rank order). Where set at or below max_num_tokens, the NCCL path's row buffer
  // (C * H * 2 bytes) is allocated at construction, so CUDA-graph capture needs no first eager
  // call. Forced one-shot and two-shot stay available (the mailboxes are sized by the two-shot
  // thresholds alone).
  int64_t nccl_min_rows = 0;
  int64_t nccl_min_finalize_rows = 0;
  // Programmatic dependent launch: kernels may start while their predecessor runs and wait
  // (griddepcontrol.wait) before reading anything it writes.
  bool enable_pdl = true;
  // One-shot calls of at most this many rows run as a single launch (the consumer publishes
  // its own row first, then polls) instead of publish + consumer: the same protocol and bits,
  // one launch less. -1: every M whose grid is co-resident by construction (at most 96 CTAs,
  // rows that fit one CTA: M <= 96 at H <= 5120 with hc <= 4, H <= 4096 with hc = 8); 0: always
  // two launches.
  int64_t single_launch_max_rows = -1;
  // The consumer of rows that fit one CTA runs as a persistent grid that prefetches the next
  // row into shared memory while it computes the current one (cp.async), from this many rows:
  // the same bits, more of the HBM bandwidth. For a one-shot or two-shot call (above the single
  // launch) it is the call's only launch: some of its CTAs publish this rank's rows (two-shot:
  // some reduce the owned rows) while the others consume, so the NVLink stores overlap the
  // epilogue. 0: never. -1 (automatic): the direct consumer (TP=1 call, TP=1 finalize with
  // top_k <= 8, after the NCCL fallback's all-reduce) when M exceeds the CTAs resident at once;
  // one-shot from 1024 rows; two-shot from 1024 rows as the consumer after its publish and owners'
  // reduce kernels, which stay separate, the owners looping on their resident CTAs where the
  // owned rows exceed them (measured on
  // one GPU so far: docs/PERFORMANCE.md). A value > 0 gives the two-shot the one launch with
  // roles above, not that automatic shape (through the own mailbox on one H200 the automatic
  // shape was the faster at 4096 rows: docs/PERFORMANCE-HISTORY.md, docs/PERFORMANCE.md).
  int64_t streaming_min_rows = -1;
  // Testing: at TP=1, also build the Lamport mailboxes, and run a call with Protocol::kOneShot
  // or kTwoShot forced through them (the rank publishes into and polls its own mailbox: the
  // protocols' kernels, generations and resets on one GPU), and one with Protocol::kNccl forced
  // through the NCCL fallback's path over the one-rank NCCL communicator (its call identity's
  // exchange and check, the watchdog's counts, the consumer on the all-reduced rows). kAuto
  // still reads x directly. Ignored at TP > 1.
  bool lamport_self_test = false;
  // Testing, with lamport_self_test at TP=1: kAuto runs through the own mailbox too, one-shot or
  // two-shot by the thresholds as at TP > 1 (protocol_for says which; never NCCL), so that the
  // thresholds, a tuning table's among them, can be exercised on one GPU. Ignored otherwise.
  bool lamport_self_test_auto = false;
  // A tuning table (JSON, written by mhccl-tune; docs/TUNING.md): the entry matching this GPU,
  // group and variant sets the thresholds above left at their default (0, -1) and the streaming
  // call's publisher and reducer CTAs. Empty: the file MHCCL_TUNING_FILE names, if set. No
  // matching entry, or a stale one (another schema version, another NCCL major.minor): the
  // built-in defaults (MHCCL_DEBUG=INFO says why). A file that cannot be read or parsed is an
  // Error(kInvalidArgument) naming the file and the place. The resolved values are agreed over
  // the ranks like the rest of the configuration.
  std::string tuning_file;
};

// Tensors of the fused epilogue, as DLPack views the caller owns (nothing is copied or kept).
// Every tensor is a contiguous CUDA tensor on the communicator's device; BF16 and 8-bit tensors
// 16-byte aligned, FP32/int32 ones 4-byte aligned. M is the number of rows of the call.
// Outputs may not overlap inputs or each other, except residual_out == residual exactly (an
// in-place update): an overlap of the byte ranges is an Error (kInvalidArgument) naming both.
struct MHCEpilogueArgs {
  const DLTensor* residual = nullptr;     // [M, hc, H] BF16 residual streams
  const DLTensor* post = nullptr;         // [M, hc] or [M, hc, 1] FP32 post-mix
  const DLTensor* comb = nullptr;         // [M, hc, hc] FP32 residual mix, [source, target]
  const DLTensor* pre = nullptr;          // [M, hc] FP32 carried pre-mix; nullptr together with
  const DLTensor* norm_weight = nullptr;  // [H] BF16 RMSNorm weight: a residual-only call
  float eps = 1e-6f;                      // RMSNorm epsilon, finite and >= 0
  const DLTensor* residual_out = nullptr;  // [M, hc, H] BF16, written (may alias residual)
  const DLTensor* layer_input = nullptr;   // [M, H] BF16, written; nullptr iff residual-only
  const DLTensor* mxfp8_values = nullptr;  // [M, H] 8-bit E4M3, written; optional, with scales
  const DLTensor* mxfp8_scales = nullptr;  // mxfp8_scale_bytes(M, H) 8-bit UE8M0, swizzled
  // Per-token-group FP8 copy of layer_input (built with quantize_layer_input_fp8; not with the
  // mxfp8 outputs, not residual-only): values [M, H] 8-bit E4M3, written; and scales, FP32,
  // fp8_group_scale_bytes(M, H) bytes, 16-byte aligned: either a contiguous tensor of
  // Mp * (H / 128) floats (any shape, e.g. [H / 128, Mp], but not a row-major [M, H / 128] or
  // [Mp, H / 128], whose element [r, g] is not scale(r, g); every padding row M .. Mp-1 written 0)
  // or the MN-major view [M, H / 128] with strides [1, Mp] that DeepGEMM and vLLM take: then its
  // extent, (H / 128 - 1) * Mp + M floats, is written (the padding rows of all but the last
  // column 0) and nothing past it, so vLLM's TMA-aligned scales, whose storage ends there at
  // M % 4 != 0, are accepted (mhccl/checks.h, fp8_scale_floats); the last column's padding rows
  // are then left as they are (DeepGEMM reads them only for rows >= M): pass the flat buffer to
  // have them 0 (the Python call does so for a view over storage of Mp * (H / 128) floats).
  // Mp = fp8_group_scale_rows(M).
  const DLTensor* fp8_values = nullptr;
  const DLTensor* fp8_scales = nullptr;
};

struct AllReduceMHCCallArgs {
  const DLTensor* x = nullptr;  // [M, H] BF16: this rank's partial sublayer output
  MHCEpilogueArgs epilogue;
  // At TP=1 ignored (x read directly), but see lamport_self_test. Every rank passes the same
  // protocol for a call: ranks that force different ones (or one forces what kAuto does not
  // choose on another) publish into different mailboxes, where no identity is compared, and get
  // Error(kPeerTimeout) once the wait budget ends (an error, not kDivergence; never a value).
  Protocol protocol = Protocol::kAuto;
};

struct AllReduceMHCFinalizeArgs {
  const DLTensor* gemm2_permuted = nullptr;  // [rows, H] BF16 unweighted GEMM2 output, permuted
  const DLTensor* expert_weights = nullptr;  // [M, top_k] FP32 routing weights (already scaled)
  const DLTensor* expanded_idx_to_permuted_idx = nullptr;  // [M, top_k] int32, -1 = not here
  const DLTensor* shared_output = nullptr;   // [M, H] BF16 partial shared-expert output
  MHCEpilogueArgs epilogue;
  Protocol protocol = Protocol::kAuto;  // as AllReduceMHCCallArgs::protocol
};

// Per call: one-shot (one launch at small and at large M, publish + consumer in between),
// two-shot (publish, the owners' reduce, consumer; one launch where it streams) or, opted in or
// where peers are unreachable, ncclAllReduce + the consumer; thresholds in AllReduceMHCConfig.
// Constructed collectively over the communicator's group (every rank, same config). Calls are
// stream-ordered and graph-capturable; every rank must issue the same sequence of calls with
// the same M. Calls of one op run one at a time (one stream, or streams ordered by events): the
// op keeps device state between its calls at every TP (at TP=1 too: the row tickets of the
// call's streaming consumer, which the NCCL path's consumer uses as well). Outputs are written
// into the caller's tensors. Arguments are checked before the first launch
// (Error(kInvalidArgument/kUnsupported)); a rejected call changes no state. A kernel launch that
// fails (Error(kCuda)) after the call's first launch went out leaves this rank's protocol state
// behind its peers': the communicator is then unusable (kUnusable on every later call) until it
// and its ops are rebuilt.
class AllReduceMHC {
 public:
  AllReduceMHC(Communicator& comm, const AllReduceMHCConfig& config);
  ~AllReduceMHC();
  AllReduceMHC(const AllReduceMHC&) = delete;
  AllReduceMHC& operator=(const AllReduceMHC&) = delete;

  // y = bf16(sum over ranks of x, FP32 in rank order); residual_out[m,t] = bf16(post[m,t] * y +
  // sum_s comb[m,s,t] * residual[m,s]); p = bf16(sum_t pre[m,t] * residual_out[m,t]) (the
  // collapse, rounded to BF16 once); layer_input = bf16(RMSNorm(p) * norm_weight); the MXFP8 copy
  // of layer_input when mxfp8 outputs are given, the per-token-group FP8 copy when fp8 outputs
  // are (SPEC.md).
  void call(const AllReduceMHCCallArgs& args, cudaStream_t stream);

  // As call, with this rank's x = bf16(sum_k w[m,k] * gemm2[idx[m,k]] + shared_output) (the
  // routed sum from +0.0 in k order, the shared expert added last, one rounding; routes of -1
  // skipped). An index outside [-1, rows) is never read: the route is skipped and
  // reported by Communicator::check_errors() as Error(kInvalidRoute).
  void finalize(const AllReduceMHCFinalizeArgs& args, cudaStream_t stream);

  // The protocol kAuto picks for M rows (rank-invariant). At TP=1 the call reads x directly
  // (no mailbox, no exchange), which this names kOneShot. Throws kInvalidArgument where M is
  // outside [1, max_num_tokens], which no call takes.
  Protocol protocol_for(int64_t m, bool finalize) const;
  // The configuration with defaults resolved (thresholds; kNever = INT64_MAX for never).
  const AllReduceMHCConfig& config() const;
  // Where the resolved thresholds and launch shapes came from, one line: the tuning table and
  // its entry, or the built-in defaults (with, where a table was given, why none of it applied).
  const std::string& tuning_source() const;
  // Device memory per rank of the mailboxes (one-shot, two-shot) and fallback buffers, bytes.
  size_t mailbox_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mhccl
