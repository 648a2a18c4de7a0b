// The environment report (include/mhccl/info.h).
#include "mhccl/info.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/nccl_version.h"
#include "common/build_info.h"
#include "common/debug.h"
#include "common/devices.h"
#include "common/nvtx.h"
#include "common/text.h"

extern char** environ;

#ifndef MHCCL_VERSION_STRING
#define MHCCL_VERSION_STRING "unknown"
#endif
#ifndef MHCCL_GIT_COMMIT
#define MHCCL_GIT_COMMIT ""
#endif
#ifndef MHCCL_CUDA_ARCHITECTURES
#define MHCCL_CUDA_ARCHITECTURES "unknown"
#endif

namespace mhccl {
namespace detail {
namespace {

// CUDA's version numbers (1000 * major + 10 * minor) as "13.0".
std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// The file the dynamic linker took `symbol` from.
std::string library_file(const void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "file unknown";
  return info.dli_fname;
}

}  // namespace

std::string nccl_library_text() {
  int v = 0;
  const ncclResult_t st = ncclGetVersion(&v);
  const std::string file = library_file(reinterpret_cast<const void*>(&ncclGetVersion));
  if (st != ncclSuccess) return std::string("version unknown (ncclGetVersion: ") + ncclGetErrorString(st) + "), " + file;
  const std::string why = comm::nccl_version_mismatch(v, NCCL_VERSION_CODE);
  return comm::nccl_version_string(v) + " (" + file + "), headers " + comm::nccl_version_string(NCCL_VERSION_CODE) +
         (why.empty() ? ": accepted" : ": refused: " + why);
}

std::string kernels_for(const std::string& architectures, int major, int minor) {
  const int cc = major * 10 + minor;
  std::string sass, ptx;
  bool symbolic = false;  // all, all-major, native: CMake chose the architectures
  for_each_word(architectures, [&](const std::string& a) {
    const bool real_only = a.size() > 5 && a.compare(a.size() - 5, 5, "-real") == 0;
    const bool virtual_only = a.size() > 8 && a.compare(a.size() - 8, 8, "-virtual") == 0;
    std::string num = a.substr(0, a.find('-'));
    const char suffix = !num.empty() && (num.back() == 'a' || num.back() == 'f') ? num.back() : '\0';
    if (suffix != '\0') num.pop_back();
    if (num.empty() || num.size() > 4 || num.find_first_not_of("0123456789") != std::string::npos) {
      symbolic = true;
      return;
    }
    const int arch = std::stoi(num);
    const std::string name = num + (suffix ? std::string(1, suffix) : "");
    // SASS runs on the same major version at an equal or newer minor (an arch-specific "a" build
    // on that exact one); PTX is compiled by the driver for any equal or newer device.
    const bool sass_runs = suffix == 'a' ? arch == cc : arch / 10 == major && arch % 10 <= minor;
    if (!virtual_only && sass_runs && sass.empty()) sass = "sm_" + name + " SASS";
    if (!real_only && suffix == '\0' && arch <= cc) ptx = "compute_" + name + " PTX, compiled by the driver at load";
  });
  if (!sass.empty()) return sass;
  if (!ptx.empty()) return ptx;
  if (symbolic) return "not known: this build holds the architectures CMake chose for " + architectures;
  return "none: this build holds " + architectures + " (rebuild with CMAKE_CUDA_ARCHITECTURES including " +
         std::to_string(cc) + ")";
}

const char* cuda_architectures() { return MHCCL_CUDA_ARCHITECTURES; }

}  // namespace detail

std::string environment_report() {
  detail::Text r;
  const std::string commit = MHCCL_GIT_COMMIT;
  r << "mhccl " << MHCCL_VERSION_STRING << (commit.empty() ? "" : " (commit " + commit + ")") << "\n";
  r << "  built with CUDA " << detail::cuda_version_text(CUDART_VERSION) << ", NCCL headers "
    << comm::nccl_version_string(NCCL_VERSION_CODE) << ", CUDA architectures " << MHCCL_CUDA_ARCHITECTURES
    << ", NVTX ranges " << (MHCCL_NVTX ? "on" : "compiled out (MHCCL_NVTX=OFF)") << "\n";
#if MHCCL_NVTX
  r << "  NVTX: " << (detail::nvtx::attached() ? "a profiler is attached" : "no profiler attached") << "\n";
#endif
  r << "  MHCCL_DEBUG: " << (detail::debug_info() ? "INFO" : "WARN (silent)") << "\n";

  int runtime = 0, driver = 0;
  const cudaError_t rst = cudaRuntimeGetVersion(&runtime);
  r << "CUDA runtime " << (rst == cudaSuccess ? detail::cuda_version_text(runtime) : "unknown") << " ("
    << detail::library_file(reinterpret_cast<const void*>(&cudaRuntimeGetVersion)) << ")\n";
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    r << "CUDA driver: supports CUDA " << detail::cuda_version_text(driver) << "\n";
  } else {
    r << "CUDA driver: none loaded (no libcuda.so.1, or it failed to load)\n";
  }
  r << "NCCL library " << detail::nccl_library_text() << "\n";

  const detail::DeviceCount dc = detail::cuda_device_count();
  if (dc.count == 0) {
    r << "GPUs: no CUDA device: " << dc.why_none << "\n";
  } else {
    r << "GPUs: " << dc.count << "\n";
    for (int d = 0; d < dc.count; ++d) {
      cudaDeviceProp p{};
      const cudaError_t st = cudaGetDeviceProperties(&p, d);
      if (st != cudaSuccess) {
        cudaGetLastError();
        r << "  cuda:" << d << ": cudaGetDeviceProperties returned " << cudaGetErrorName(st) << ": "
          << cudaGetErrorString(st) << "\n";
        continue;
      }
      char pci[32];
      std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
      char mem[32];
      std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1ull << 30));
      r << "  cuda:" << d << ": " << p.name << ", compute capability " << p.major << "." << p.minor << ", "
        << p.multiProcessorCount << " SMs, " << mem << ", PCI " << pci << "; kernels: "
        << detail::kernels_for(MHCCL_CUDA_ARCHITECTURES, p.major, p.minor) << "\n";
    }
    if (dc.count > 1) {
      r << "P2P (cudaDeviceCanAccessPeer, row: from, column: to; A: also native atomics):\n      ";
      for (int j = 0; j < dc.count; ++j) r << " " << (j < 10 ? " " : "") << j;
      r << "\n";
      for (int i = 0; i < dc.count; ++i) {
        r << "    " << (i < 10 ? " " : "") << i;
        for (int j = 0; j < dc.count; ++j) {
          int can = 0, atomics = 0;
          if (i == j) {
            r << "  -";
            continue;
          }
          if (cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess) {
            cudaGetLastError();
            r << "  ?";
            continue;
          }
          if (can && cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, i, j) != cudaSuccess) {
            cudaGetLastError();
            atomics = 0;
          }
          r << "  " << (!can ? "n" : atomics ? "A" : "y");
        }
        r << "\n";
      }
    }
  }

  std::vector<std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "MHCCL_", 6) == 0 || std::strncmp(*e, "NCCL_", 5) == 0 ||
        std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) {
      vars.emplace_back(*e);
    }
  }
  std::sort(vars.begin(), vars.end());
  r << "Environment (MHCCL_*, NCCL_*, CUDA_VISIBLE_DEVICES):" << (vars.empty() ? " none set" : "") << "\n";
  for (const std::string& v : vars) r << "  " << v << "\n";
  return r.str();
}

}  // namespace mhccl
