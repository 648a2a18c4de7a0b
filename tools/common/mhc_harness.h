// Runs AllReduceMHC calls on the GPU from Problem inputs and checks them against the
// CPU reference: residual_out, MXFP8 and FP8 bit-exact, layer_input within 1 BF16 ulp of FP64.
#pragma once

#include <string>
#include <vector>

#include "common/device_buffer.h"
#include "common/mhc_data.h"
#include "mhccl/all_reduce_mhc.h"

namespace mhccl::testing {

// kFp8 / kFp8Ue8m0: the per-token-group FP8 outputs, of an op built with quantize_layer_input_fp8
// (and fp8_ue8m0_scales for kFp8Ue8m0). The first three need an op built with neither FP8 option
// for kMxfp8 (quantize_layer_input) and residual_only for kResidualOnly.
enum class Variant { kPlain, kMxfp8, kResidualOnly, kFp8, kFp8Ue8m0 };
const char* variant_name(Variant v);
bool is_fp8(Variant v);
// Bytes of the scales a call of variant v for M rows of width H writes, the scales as launch()
// passes them: MXFP8's buffer; kFp8's [G, Mp] buffer, padding rows included; kFp8Ue8m0's
// MN-major view's extent, (G - 1) * Mp + M floats, without the last column's padding rows.
// 0 for the variants without scales.
int64_t scale_bytes_written(Variant v, int64_t m, int64_t h);

// Which quantized variant an op is built for (at most one per op): the config's options, and the
// variant whose outputs its calls take.
enum class Quant { kMxfp8, kFp8, kFp8Ue8m0 };
const char* quant_name(Quant q);
Variant quant_variant(Quant q);
// Sets quantize_layer_input, quantize_layer_input_fp8 and fp8_ue8m0_scales for q (MXFP8 only
// where H is a multiple of 32, FP8 of 128).
void build_quant(AllReduceMHCConfig& c, Quant q);

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

// scales holds the whole scale buffer (FP8: G columns of Mp rows), scales_written its first bytes
// a call defines: all of it, except kFp8Ue8m0's MN-major view, whose extent ((G - 1) * Mp + M
// floats) ends before the last column's padding rows; those keep what was there.
struct Outputs {
  std::vector<uint16_t> residual_out, layer_input;
  std::vector<uint8_t> values, scales;
  size_t scales_written = 0;
  uint64_t hash() const;  // of the bits the call defines (scales: its first scales_written bytes)
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
