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
    case ErrorCode::kDivergence: return "ranks diverged";
  }
  return "unknown";
}

const char* error_code_id(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "kInvalidArgument";
    case ErrorCode::kUnsupported: return "kUnsupported";
    case ErrorCode::kNoDevice: return "kNoDevice";
    case ErrorCode::kCuda: return "kCuda";
    case ErrorCode::kNccl: return "kNccl";
    case ErrorCode::kPeerTimeout: return "kPeerTimeout";
    case ErrorCode::kInvalidRoute: return "kInvalidRoute";
    case ErrorCode::kUnusable: return "kUnusable";
    case ErrorCode::kDivergence: return "kDivergence";
  }
  return "unknown";
}

}  // namespace mhccl
