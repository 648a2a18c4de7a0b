// Runs AllReduceMHC calls on the GPU from Problem inputs and checks them against the
// CPU reference: residual_out and MXFP8 bit-exact, layer_input within 1 BF16 ulp of FP64.
#pragma once

#include <string>
#include <vector>

#include "common/device_buffer.h"
#include "common/mhc_data.h"
#include "mhccl/all_reduce_mhc.h"

namespace mhccl::testing {

enum class Variant { kPlain, kMxfp8, kResidualOnly };
const char* variant_name(Variant v);

// All device tensors of one call, carved from one allocation (sized for up to `rows` rows).
struct CallBuffers {
  CallBuffers(int64_t rows, int64_t h, int hc, int top_k);
  DeviceBuffer mem;
  int64_t rows, h;
  int hc, top_k;
  char *x, *gemm2, *weights, *routes, *shared, *residual, *post, *comb, *pre, *norm, *res_out,
      *layer, *values, *scales;
  size_t output_offset, output_bytes;  // the outputs' span, poisoned before each call
};

struct Outputs {
  std::vector<uint16_t> residual_out, layer_input;
  std::vector<uint8_t> values, scales;
  uint64_t hash() const;
};

// Uploads this rank's inputs of `p` and poisons the outputs.
void upload(const Problem& p, int rank, CallBuffers& b);
// Launches the call (or finalize) on `stream` without synchronizing.
void launch(AllReduceMHC& op, const Problem& p, Variant v, Protocol protocol,
            CallBuffers& b, int device, cudaStream_t stream);
Outputs download(const Problem& p, Variant v, const CallBuffers& b);
// "" when `got` is right for `p`; else what differs first.
std::string check(const Problem& p, Variant v, const Outputs& got);

}  // namespace mhccl::testing
