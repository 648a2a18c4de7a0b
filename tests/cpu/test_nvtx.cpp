// The NVTX ranges of src/common/nvtx.h: without a tool, no name is built and nothing reaches
// NVTX; with one (the cpu_nvtx test runs these with nvtx_recorder as NVTX_INJECTION64_PATH), the
// tool sees each range in the "mhccl" domain, named as the ops name theirs, with M as payload.
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "common/nvtx.h"

namespace {

using mhccl::detail::nvtx::call_name;
using mhccl::detail::nvtx::Kind;
using mhccl::detail::nvtx::Range;

const char* tool() { return std::getenv("NVTX_INJECTION64_PATH"); }

// What the recorder saw, or "" when it is not loaded.
std::string recorded() {
  void* lib = tool() ? dlopen(tool(), RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (lib == nullptr) return "";
  auto* events = reinterpret_cast<const char* (*)()>(dlsym(lib, "nvtx_recorder_events"));
  const std::string out = events ? events() : "";
  dlclose(lib);
  return out;
}

TEST(Nvtx, CallNames) {
  EXPECT_EQ(call_name("call", "one-shot", 8), "mhccl.call one-shot M=8");
  EXPECT_EQ(call_name("finalize", "two-shot", 2048), "mhccl.finalize two-shot M=2048");
}

TEST(Nvtx, WithoutAToolNoNameIsBuilt) {
  if (tool() != nullptr) GTEST_SKIP() << "NVTX_INJECTION64_PATH is set: a tool is attached";
  int built = 0;
  for (int i = 0; i < 3; ++i) {  // the first range initializes NVTX, the later ones find no tool
    Range r(Kind::kCall, 8, [&] {
      ++built;
      return call_name("call", "one-shot", 8);
    });
  }
  EXPECT_EQ(built, 0);
#if MHCCL_NVTX
  EXPECT_FALSE(mhccl::detail::nvtx::attached());
#endif
}

TEST(Nvtx, AToolSeesEveryRange) {
  if (tool() == nullptr) GTEST_SKIP() << "run by the cpu_nvtx test, with the recorder as NVTX_INJECTION64_PATH";
  int built = 0;
  {
    Range outer(Kind::kConstruction, 256, [&] {
      ++built;
      return std::string("mhccl.AllReduceMHC H=5120 hc=4 C=256");
    });
    Range inner(Kind::kCall, 8, [&] {
      ++built;
      return call_name("call", "one-shot", 8);
    });
  }
#if MHCCL_NVTX
  EXPECT_TRUE(mhccl::detail::nvtx::attached());
  EXPECT_EQ(built, 2);
  EXPECT_EQ(recorded(),
            "push mhccl: mhccl.AllReduceMHC H=5120 hc=4 C=256 payload 256\n"
            "push mhccl: mhccl.call one-shot M=8 payload 8\n"
            "pop mhccl\n"
            "pop mhccl\n");
#else  // compiled out: nothing is built, nothing reaches the tool
  EXPECT_EQ(built, 0);
  EXPECT_EQ(recorded(), "");
#endif
}

}  // namespace
