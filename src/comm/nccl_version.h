// Which NCCL library mhccl accepts at run time, given the nccl.h it was compiled against.
// NCCL keeps its ABI (host API and the device API's structures) within a major version, and a
// newer library still provides what older headers declare; an older one may lack it (symmetric
// windows and the device API came with 2.28). So: the same major version, at least as new as
// the headers. The Python wheel relies on this to share PyTorch's libnccl, whatever 2.x >=
// the build's headers PyTorch brings.
#pragma once

#include <string>

namespace mhccl::comm {

// "X.Y.Z" of an NCCL_VERSION_CODE-style number (X*10000 + Y*100 + Z since NCCL 2.9).
inline std::string nccl_version_string(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

// Empty when a library of version `library` may run code built against headers of version
// `headers`; otherwise why not, naming both versions.
inline std::string nccl_version_mismatch(int library, int headers) {
  const std::string lib = nccl_version_string(library), hdr = nccl_version_string(headers);
  if (library / 10000 != headers / 10000) {
    return "NCCL library " + lib + " is of another major version than the headers mhccl was built with (" +
           hdr + "): its ABI differs. Use an NCCL " + std::to_string(headers / 10000) + ".x at least as new as " +
           hdr + ".";
  }
  if (library < headers) {
    return "NCCL library " + lib + " is older than the headers mhccl was built with (" + hdr +
           "): it may lack what they declare. Use NCCL >= " + hdr + " (of the same major version) or "
           "rebuild mhccl against this one's headers.";
  }
  return {};
}

}  // namespace mhccl::comm
