// mhccl errors: one exception type with a code that says whose fault it is.
#pragma once

#include <stdexcept>
#include <string>

namespace mhccl {

enum class ErrorCode {
  kInvalidArgument,  // a caller's argument is wrong (shape, dtype, device, alignment, M range, ...)
  kUnsupported,      // valid in general, not built or not supported here (variant, hc, tp, H)
  kNoDevice,         // no CUDA device (CPU-only machine)
  kCuda,             // a CUDA runtime call failed
  kNccl,             // an NCCL call failed
  kPeerTimeout,      // a bounded wait expired: a peer never published (died, hung, or a protocol bug)
  kInvalidRoute,     // finalize got a route index outside [-1, rows); the route was skipped
  kUnusable,         // the communicator saw a peer timeout earlier and must be rebuilt
};

const char* error_code_name(ErrorCode code);

// Every failure the library reports, with a message that names the argument or the peer,
// what was expected and what was given.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }
  // True for caller mistakes (kInvalidArgument, kUnsupported): a binding maps these to its
  // argument error (Python: ValueError), everything else to its runtime error.
  bool is_argument_error() const noexcept {
    return code_ == ErrorCode::kInvalidArgument || code_ == ErrorCode::kUnsupported;
  }

 private:
  ErrorCode code_;
};

}  // namespace mhccl
