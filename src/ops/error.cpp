#include "mhccl/error.h"

namespace mhccl {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kNoDevice: return "no CUDA device";
    case ErrorCode::kCuda: return "CUDA error";
    case ErrorCode::kNccl: return "NCCL error";
    case ErrorCode::kPeerTimeout: return "peer timeout";
    case ErrorCode::kInvalidRoute: return "invalid route";
    case ErrorCode::kUnusable: return "communicator unusable";
  }
  return "unknown";
}

}  // namespace mhccl
