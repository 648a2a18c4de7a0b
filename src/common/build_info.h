// Pieces of the environment report (src/common/info.cpp) that construction's MHCCL_DEBUG=INFO
// lines reuse.
#pragma once

#include <string>

namespace mhccl::detail {

// The NCCL library this process runs: "2.28.9 (/usr/lib/x86_64-linux-gnu/libnccl.so.2), headers
// 2.28.9", and whether mhccl accepts it.
std::string nccl_library_text();

// Whether the kernels of this build run on a device of compute capability major.minor, and how:
// "sm_90 SASS", "compute_100 PTX, compiled by the driver at load", or "none: this build holds
// 90 (rebuild with CMAKE_CUDA_ARCHITECTURES including 103)" ("not known: ..." for CMake's own
// choices, native or all). `architectures` is CMake's list (CMAKE_CUDA_ARCHITECTURES: "90",
// "90-real 100", "100a", "90-virtual"), separated by spaces.
std::string kernels_for(const std::string& architectures, int major, int minor);

// The CUDA architectures libmhccl was compiled for (CMAKE_CUDA_ARCHITECTURES, space-separated).
const char* cuda_architectures();

}  // namespace mhccl::detail
