#include "bench/floor.h"

#include <algorithm>
#include <stdexcept>

#include "common/device_buffer.h"
#include "kernels/lamport.cuh"
#include "kernels/launch.h"

namespace mhccl::bench {
namespace {

using namespace mhccl::kernels;

struct FloorParams {
  const uint4* x;
  uint4* y;
  void* mailboxes[kMaxTp];  // mailboxes[i]: rank (rank + i) % tp's
  int tp, rank;
  int64_t m, capacity;
  int np;
  RowTiling tiling;
  LamportState* state;
  ErrorSink err;
  bool single_launch;
};

__global__ void floor_publish(const FloorParams p) {
  const RowPack rp = row_pack(p.tiling, p.np);
  pdl_wait();
  const uint32_t gen = p.state->generation;  // before the poll kernel may start (and advance it)
  pdl_launch_dependents();
  if (!rp.active) return;
  const uint4 v = publishable<Bf16Lanes>(ld_input(p.x + rp.row * p.np + rp.pack));
  store_to_ranks(p.mailboxes, p.tp, mailbox_offset(gen, p.tp, p.rank, p.capacity, rp.row, p.np, rp.pack), v);
}

__global__ void floor_poll(const FloorParams p) {
  const RowPack rp = row_pack(p.tiling, p.np);
  pdl_wait();
  pdl_launch_dependents();
  uint4 mine = make_uint4(0, 0, 0, 0);  // loaded before the state, as the library does
  if (p.single_launch && rp.active) mine = ld_input(p.x + rp.row * p.np + rp.pack);
  const Generation g = read_generation(p.state, p.err);
  if (p.single_launch && rp.active) {  // publish first: one launch, as the library's small-M path
    const uint4 v = publishable<Bf16Lanes>(mine);
    store_to_ranks(p.mailboxes, p.tp, mailbox_offset(g.current, p.tp, p.rank, p.capacity, rp.row, p.np, rp.pack), v);
  }
  const uint32_t ticket = arrive_early(p.state);
  uint4* local = static_cast<uint4*>(p.mailboxes[0]);
  const int64_t slot = p.capacity * p.np;
  if (rp.active) {
    const uint4* base = local + (int64_t(g.current) * p.tp * p.capacity + rp.row) * p.np + rp.pack;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < p.tp; ++r) {
      uint4 v = ld_volatile(base + r * slot);
      wait_slot<Bf16Lanes>(base + r * slot, v, p.err, WaitSite{kProtoOneShot, r, g.current, rp.row, p.state});
      float f[8];
      unpack_bf16(v, f);
      for (int e = 0; e < 8; ++e) acc[e] += f[e];
    }
    p.y[rp.row * p.np + rp.pack] = pack_bf16(acc);
  }
  reset_slots<Bf16Lanes>(local + int64_t(g.previous) * p.tp * slot, p.tp, slot, int64_t(g.prev_rows) * p.np);
  advance_if_last(p.state, ticket, static_cast<uint32_t>(p.m));
}

__global__ void store_to_peer(const uint4* src, uint4* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

void launch(void (*k)(FloorParams), const FloorParams& p, cudaStream_t s) {
  MHCCL_TEST_CUDA(launch_ex(k, p, dim3(static_cast<unsigned>(p.m * p.tiling.ctas_per_row)),
                            dim3(p.tiling.threads), 0, s, /*pdl=*/true,
                            static_cast<unsigned>(p.tiling.ctas_per_row)));
}

// The launch floor's kernel: one warp, one store (what a CUDA graph's node costs with no work).
// Launched with PDL, it waits for its predecessor first (griddepcontrol.wait: a no-op without).
__global__ void launch_floor_kernel(int* flag) {
  pdl_wait();
  if (threadIdx.x == 0) *flag = 1;
}

// The row floor's kernel: a thread a pack, 128 threads a CTA; every thread loads its packs of the row's
// `streams` input rows, then stores them (XOR-folded, so each store depends on every load) into
// `streams` output rows. No arithmetic beyond that, no reduction.
struct RowFloorParams {
  const uint4* in;
  uint4* out;
  int np, streams;
};
__global__ void row_floor_kernel(const RowFloorParams p) {
  const uint4* in = p.in;
  uint4* out = p.out;
  const int np = p.np, streams = p.streams;
  pdl_wait();  // launched with PDL: the inputs may be the predecessor's outputs
  const int pack = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pack >= np) return;
  uint4 v[16];
  uint4 f = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int s = 0; s < 16; ++s) {
    if (s < streams) {
      v[s] = __ldg(in + s * np + pack);
      f.x ^= v[s].x; f.y ^= v[s].y; f.z ^= v[s].z; f.w ^= v[s].w;
    }
  }
#pragma unroll
  for (int s = 0; s < 16; ++s) {
    if (s < streams) out[s * np + pack] = make_uint4(v[s].x ^ f.x, v[s].y, v[s].z, v[s].w);
  }
}

}  // namespace

LamportFloor::LamportFloor(Communicator& comm, int64_t capacity_rows, int64_t hidden)
    : comm_(comm), capacity_(capacity_rows), hidden_(hidden) {
  mailbox_ = comm.alloc_symmetric(static_cast<size_t>(3 * comm.tp() * capacity_rows * hidden * 2),
                                  kBf16SentinelPair);
  MHCCL_TEST_CUDA(cudaMalloc(&state_, sizeof(LamportState)));
  MHCCL_TEST_CUDA(cudaMemset(state_, 0, sizeof(LamportState)));
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());
}

LamportFloor::~LamportFloor() {
  cudaDeviceSynchronize();
  cudaFree(state_);
}

void LamportFloor::run(const void* x, void* y, int64_t m, cudaStream_t stream) {
  FloorParams p = {};
  p.x = static_cast<const uint4*>(x);
  p.y = static_cast<uint4*>(y);
  p.tp = comm_.tp();
  p.rank = comm_.rank();
  for (int i = 0; i < p.tp; ++i) p.mailboxes[i] = mailbox_->peer((p.rank + i) % p.tp);
  p.m = m;
  p.capacity = capacity_;
  p.np = static_cast<int>(hidden_ / 8);
  p.tiling = row_tiling(p.np, m, 1);
  p.state = static_cast<LamportState*>(state_);
  // Waits of the floor report nowhere: a stand-in sink whose budget is generous.
  static uint32_t* words = nullptr;  // [0, 1] claims, [2] this rank's own fault word
  static uint32_t** fault_table = nullptr;
  static ErrorRecord* record = nullptr;
  if (!words) {
    MHCCL_TEST_CUDA(cudaMalloc(&words, 16));
    MHCCL_TEST_CUDA(cudaMemset(words, 0, 16));
    MHCCL_TEST_CUDA(cudaMalloc(&fault_table, sizeof(uint32_t*)));
    uint32_t* fault = words + 2;
    MHCCL_TEST_CUDA(cudaMemcpy(fault_table, &fault, sizeof(fault), cudaMemcpyHostToDevice));
    MHCCL_TEST_CUDA(cudaMalloc(&record, 2 * sizeof(ErrorRecord)));
    MHCCL_TEST_CUDA(cudaMemset(record, 0, 2 * sizeof(ErrorRecord)));
  }
  p.err = ErrorSink{record, words, words + 2, fault_table, 1, p.rank, 30ull * 1000000000ull, 0};
  p.single_launch = m * p.tiling.ctas_per_row <= kMaxSingleLaunchCtas;
  if (!p.single_launch) launch(floor_publish, p, stream);
  launch(floor_poll, p, stream);
}

double copy_bandwidth_gbps(size_t bytes, cudaStream_t stream) {
  testing::DeviceBuffer a(bytes), b(bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  MHCCL_TEST_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(e0, stream);
    MHCCL_TEST_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * bytes / (best * 1e-3) / 1e9;
}

double peer_store_bandwidth_gbps(Communicator& comm, size_t bytes, cudaStream_t stream) {
  auto buf = comm.alloc_symmetric(bytes, 0);
  testing::DeviceBuffer src(bytes);
  MHCCL_TEST_CUDA(cudaMemset(src.get(), 1, bytes));
  uint4* dst = static_cast<uint4*>(buf->peer((comm.rank() + 1) % comm.tp()));
  const size_t n = bytes / 16;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  store_to_peer<<<132 * 4, 512, 0, stream>>>(src.as<uint4>(), dst, n);
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    cudaEventRecord(e0, stream);
    store_to_peer<<<132 * 4, 512, 0, stream>>>(src.as<uint4>(), dst, n);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  MHCCL_TEST_CUDA(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  MHCCL_TEST_CUDA(cudaStreamSynchronize(stream));
  return bytes / (best * 1e-3) / 1e9;
}

void launch_floor(int* flag, cudaStream_t stream, bool pdl) {
  MHCCL_TEST_CUDA(launch_ex(launch_floor_kernel, flag, dim3(1), dim3(32), 0, stream, pdl));
}

void launch_row_floor(const void* in, void* out, int64_t hidden, int streams, cudaStream_t stream, bool pdl) {
  const int np = static_cast<int>(hidden / 8);
  constexpr int kThreads = 128;  // a row over ceil(np / 128) CTAs: 5 at H = 5120, as the call's tiling at M = 1
  const RowFloorParams p{static_cast<const uint4*>(in), static_cast<uint4*>(out), np, std::min(streams, 16)};
  MHCCL_TEST_CUDA(launch_ex(row_floor_kernel, p, dim3((np + kThreads - 1) / kThreads), dim3(kThreads), 0, stream, pdl));
}

}  // namespace mhccl::bench
