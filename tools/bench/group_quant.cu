// Per-token-group FP8 quantization as a kernel of its own (bench/group_quant.h): the baseline the
// fused FP8 variant is timed against.
#include "bench/group_quant.h"

#include "kernels/lamport.cuh"
#include "kernels/launch.h"
#include "mhccl/fp8_groups.h"

namespace mhccl::bench {
namespace {

struct GroupQuantParams {
  const uint4* in;
  uint2* values;
  float* scales;
  int64_t m, mp;
  int np;
  bool ue8m0;
};

// One CTA a row, one 16-byte pack (8 elements) a thread, a group of 128 elements on 16
// consecutive lanes: one load and one 8-byte store a thread, the group's amax by 4 shuffles, one
// scale store a group. The CTA count (M) fills the GPU from a few hundred rows; below it the
// kernel is launch- and latency-bound, which is the cost the fused variant saves.
__global__ void __launch_bounds__(1024) group_quant_kernel(const GroupQuantParams p) {
  kernels::pdl_wait();  // the layer input comes from the predecessor
  kernels::pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  const int pack = static_cast<int>(threadIdx.x);
  const bool active = pack < p.np;
  const uint4 v = active ? __ldg(p.in + row * p.np + pack) : make_uint4(0, 0, 0, 0);
  const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = max(amax, max(w4[i] & 0x7FFFu, (w4[i] >> 16) & 0x7FFFu));
#pragma unroll
  for (int lane = 1; lane < 16; lane <<= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lane));
  if (!active) return;
  const float s = fp8_group_scale(bf16_to_float(static_cast<uint16_t>(amax)), p.ue8m0);
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_to_float(static_cast<uint16_t>(w4[i] & 0xFFFFu));
    f[2 * i + 1] = bf16_to_float(static_cast<uint16_t>(w4[i] >> 16));
  }
  const uint32_t lo = fp8_group_encode2(f[0], f[1], s) | (uint32_t(fp8_group_encode2(f[2], f[3], s)) << 16);
  const uint32_t hi = fp8_group_encode2(f[4], f[5], s) | (uint32_t(fp8_group_encode2(f[6], f[7], s)) << 16);
  p.values[row * p.np + pack] = make_uint2(lo, hi);
  if (pack % 16 == 0) {
    const int64_t g = pack / 16;
    p.scales[fp8_group_scale_offset(row, g, p.mp)] = s;
    if (row == p.m - 1) {
      for (int64_t r = p.m; r < p.mp; ++r) p.scales[fp8_group_scale_offset(r, g, p.mp)] = 0.0f;
    }
  }
}

}  // namespace

cudaError_t launch_group_quant(const void* in, void* values, float* scales, int64_t m, int64_t h, bool ue8m0,
                               cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (h % kFp8GroupElems != 0 || h > 8192) return cudaErrorInvalidValue;
  GroupQuantParams p;
  p.in = static_cast<const uint4*>(in);
  p.values = static_cast<uint2*>(values);
  p.scales = scales;
  p.m = m;
  p.mp = fp8_group_scale_rows(m);
  p.np = static_cast<int>(h / 8);
  p.ue8m0 = ue8m0;
  const unsigned threads = static_cast<unsigned>((p.np + 31) / 32 * 32);
  return kernels::launch_ex(group_quant_kernel, p, dim3(static_cast<unsigned>(m)), dim3(threads), 0, stream,
                            /*pdl=*/true);
}

}  // namespace mhccl::bench
