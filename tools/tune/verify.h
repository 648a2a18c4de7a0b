// The deployment self-test (mhccl-tune --verify, python -m mhccl.selftest): over the group, for
// each path (one-shot and two-shot, streaming on and off, NCCL at TP=2, the automatic choice)
// and variant at a few M, the fused op against the CPU reference and the ranks' bits against
// each other. Collective: every rank of the communicator calls it with the same options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "mhccl/communicator.h"

namespace mhccl::tune {

struct VerifyOptions {
  int64_t hidden = 5120;
  int hc = 4;
  int top_k = 6;
  std::vector<std::string> variants;     // empty: every variant H allows (variants_for)
  std::vector<int64_t> ms = {1, 7, 97, 300};
  std::string tuning_file;               // the automatic path's op is built with this table
  // TEST ONLY (MHCCL_TEST_BREAK_PATH, honoured by mhccl-tune alone): the last rank corrupts one
  // byte of residual_out after every call of this path ("one-shot", "two-shot", "nccl", "auto";
  // "one-shot" also breaks "one-shot-streaming"), so that the self-test can be seen to fail.
  std::string break_path;
  bool print = true;                     // rank 0 prints a line a case as it goes
};

struct VerifyResult {
  bool ok = true;
  int cases = 0, failures = 0;
  std::string first_failure;  // "call mxfp8 M=97 two-shot: residual_out[...] = ..., reference ..."
  std::string report;         // every case, one line each, and the verdict
};

// Every variant an op of hidden size `hidden` can be built for: plain, residual_only, and mxfp8
// (H % 32 == 0), fp8 and fp8_ue8m0 (H % 128 == 0).
std::vector<std::string> variants_for(int64_t hidden);

// The options' own checks, which verify() makes first: an unknown variant, a variant H does not
// allow, an M outside [1, kMaxTokens] (kInvalidArgument), the shape as an op of a group of `tp`
// ranks checks it (kInvalidArgument or kUnsupported). Needs no GPU: python -m mhccl.selftest
// makes them before it builds its communicator.
void check_verify_options(const VerifyOptions& options, int tp);

// Runs the self-test on `stream` (of the communicator's device). Argument errors (above) throw
// before anything runs.
VerifyResult verify(Communicator& comm, cudaStream_t stream, const VerifyOptions& options);

}  // namespace mhccl::tune
