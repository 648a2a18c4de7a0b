// One rank of a TP group in a tool (mhccl-bench's and mhccl-tune's harness): collective helpers
// over the communicator's NCCL and the CUDA-graph timing the bench uses (CUDA events around
// graph replays of many calls, median of repeats, the slowest rank's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/device_buffer.h"
#include "mhccl/communicator.h"

namespace mhccl::testing {

struct GroupTiming {
  int calls_per_graph = 20;
  int launches_per_repeat = 5;
  int repeats = 11;
  int warmup = 3;
};

class Group {
 public:
  Group(Communicator& comm, cudaStream_t stream) : comm_(comm), stream_(stream), scratch_(64) {}
  int tp() const { return comm_.tp(); }
  int rank() const { return comm_.rank(); }
  cudaStream_t stream() const { return stream_; }

  void sync() { MHCCL_TEST_CUDA(cudaStreamSynchronize(stream_)); }
  void nccl(ncclResult_t r) {  // the communicator is non-blocking: settled first
    r = settle_nccl(comm_.nccl(), r);
    if (r != ncclSuccess) throw std::runtime_error(ncclGetErrorString(r));
  }
  void barrier() {
    if (tp() > 1) nccl(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclInt32, ncclSum, comm_.nccl(), stream_));
    sync();
  }
  double max_over_ranks(double v) {
    if (tp() == 1) return v;
    MHCCL_TEST_CUDA(cudaMemcpy(scratch_.get(), &v, 8, cudaMemcpyHostToDevice));
    nccl(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat64, ncclMax, comm_.nccl(), stream_));
    sync();
    MHCCL_TEST_CUDA(cudaMemcpy(&v, scratch_.get(), 8, cudaMemcpyDeviceToHost));
    return v;
  }
  bool all_ranks(bool ok) { return max_over_ranks(ok ? 0.0 : 1.0) == 0.0; }
  bool same_on_all_ranks(uint64_t h) {
    const double v = double(h >> 11);  // exact in a double
    return max_over_ranks(v) == v && -max_over_ranks(-v) == v;
  }

  // Median time of one call, us: CUDA events around graph replays of calls_per_graph calls (call
  // i uses input set i), warm-up excluded; the slowest rank's median.
  double time_calls(const std::function<void(int)>& enqueue, const GroupTiming& t = {}) {
    enqueue(0);  // eager: first-use allocations happen outside capture
    barrier();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MHCCL_TEST_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < t.calls_per_graph; ++i) enqueue(i);
    MHCCL_TEST_CUDA(cudaStreamEndCapture(stream_, &graph));
    MHCCL_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < t.warmup; ++w) {
      barrier();
      MHCCL_TEST_CUDA(cudaGraphLaunch(exec, stream_));
      sync();
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> samples;
    for (int r = 0; r < t.repeats; ++r) {
      barrier();
      cudaEventRecord(e0, stream_);
      for (int l = 0; l < t.launches_per_repeat; ++l) MHCCL_TEST_CUDA(cudaGraphLaunch(exec, stream_));
      cudaEventRecord(e1, stream_);
      sync();
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      samples.push_back(ms * 1000.0 / (t.launches_per_repeat * t.calls_per_graph));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    comm_.check_errors();
    std::sort(samples.begin(), samples.end());
    return max_over_ranks(samples[samples.size() / 2]);
  }

 private:
  Communicator& comm_;
  cudaStream_t stream_;
  DeviceBuffer scratch_;
};

}  // namespace mhccl::testing
