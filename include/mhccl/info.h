// What a bug report needs to say about the machine and this build of mhccl.
#pragma once

#include <string>

namespace mhccl {

// A plain-text report, several lines: mhccl's version (and commit, where built from a git
// checkout), the CUDA architectures the build holds, NVTX on or off; the CUDA runtime (compiled
// against, loaded, its file) and driver versions; NCCL compiled against and loaded (its file,
// and whether mhccl accepts it); the CUDA devices with compute capability, SMs, memory, PCI bus
// id and whether the build has kernels for them, and their P2P matrix (cudaDeviceCanAccessPeer);
// the MHCCL_*, NCCL_* and CUDA_VISIBLE_DEVICES variables in effect. Without a usable device it
// says "no CUDA device" and why, in CUDA's own words (cudaGetDeviceCount's error). Needs no
// GPU and never throws. `mhccl-bench --info` and `python -m mhccl.info` print it.
std::string environment_report();

}  // namespace mhccl
