// NVTX ranges around mhccl's host calls: every op call ("mhccl.call one-shot M=8") and every
// construction, in the NVTX domain "mhccl", with M (or the size) also as the range's int64
// payload. A profiler that takes NVTX's injection (nsys profile --trace=cuda,nvtx) shows them
// above the kernels they launch.
//
// Cost without a profiler: NVTX3 creates no domain when no tool is attached, and then mhccl
// neither formats a name nor calls NVTX again: a Range is one call (attached()) and one branch.
// Built with -DMHCCL_NVTX=OFF (MHCCL_NVTX=0) a Range is nothing at all. `mhccl-bench
// --nvtx-cost` times the Range of a call on the host, with or without a tool.
#pragma once

#include <cstdint>
#include <string>

#ifndef MHCCL_NVTX
#define MHCCL_NVTX 0
#endif

namespace mhccl::detail::nvtx {

// Colours (ARGB) by kind, so that calls, finalizes, all-gathers and constructions stand apart.
enum class Kind : uint32_t {
  kCall = 0xFF3C9D40u,
  kFinalize = 0xFF2E7DC1u,
  kAllGather = 0xFFE67E22u,
  kConstruction = 0xFF808B96u,
};

#if MHCCL_NVTX
// Whether a tool attached to NVTX in this process: the "mhccl" domain exists (decided at the
// first call; NVTX loads a tool only then, from NVTX_INJECTION64_PATH).
bool attached();
void push(const std::string& name, int64_t payload, Kind kind);
void pop();
#endif

// A range from construction to destruction on this thread. `name()` (returning a std::string) is
// called only when a tool is attached.
class Range {
 public:
  template <class Name>
  Range(Kind kind, int64_t payload, Name&& name) {
#if MHCCL_NVTX
    if (attached()) {
      push(name(), payload, kind);
      pushed_ = true;
    }
#else
    (void)kind;
    (void)payload;
    (void)name;
#endif
  }
  ~Range() {
#if MHCCL_NVTX
    if (pushed_) pop();
#endif
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
#if MHCCL_NVTX
  bool pushed_ = false;
#endif
};

// The name of an op call's range: "mhccl.<op> <protocol> M=<m>" ("mhccl.call one-shot M=8").
std::string call_name(const char* op, const char* protocol, int64_t m);

}  // namespace mhccl::detail::nvtx
