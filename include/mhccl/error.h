// mhccl errors: one exception type with a code that says whose fault it is.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace mhccl {

// The values are stable (a log's number maps back to its code); new codes take new numbers.
enum class ErrorCode {
  kInvalidArgument = 0,  // a caller's argument is wrong (shape, dtype, device, alignment, M range, ...)
  kUnsupported = 1,      // valid in general, not built or not supported here (variant, hc, tp, H)
  kNoDevice = 2,         // no CUDA device (CPU-only machine, or the driver cannot be used: the message says why)
  kCuda = 3,             // a CUDA runtime call failed
  kNccl = 4,             // an NCCL call failed
  kPeerTimeout = 5,      // a bounded wait expired (a peer died, hung, or never arrived), on this rank or a
                         // peer that stopped the group; the communicator is then unusable
  kInvalidRoute = 6,     // finalize got a route index outside [-1, rows); the route was skipped
  kUnusable = 7,         // the communicator saw a fatal error earlier and must be rebuilt
  kDivergence = 8,       // the ranks diverged: a peer's contribution to a call carried another call's
                         // identity (a call rejected on some ranks only, another M, call against
                         // finalize, another op or variant at the same point), found on this rank or a
                         // peer that stopped the group; the communicator is then unusable
};

// A short human label ("peer timeout").
const char* error_code_name(ErrorCode code);
// The enumerator's name ("kPeerTimeout"), as bindings expose it.
const char* error_code_id(ErrorCode code);

// Where an error comes from, where it is known: the peer it names (the rank waited for, or the
// rank that stopped the group), this rank's call index of the protocol that saw it, the op.
struct ErrorContext {
  int peer = -1;
  int64_t call_index = -1;
  std::string op;
};

// Every failure the library reports, with a message that names the argument or the peer,
// what was expected and what was given.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, ErrorContext context = {})
      : std::runtime_error(message), code_(code), context_(std::move(context)) {}
  ErrorCode code() const noexcept { return code_; }
  // True for caller mistakes (kInvalidArgument, kUnsupported): a binding maps these to its
  // argument error (Python: ValueError), everything else to its runtime error.
  bool is_argument_error() const noexcept {
    return code_ == ErrorCode::kInvalidArgument || code_ == ErrorCode::kUnsupported;
  }
  // -1 / -1 / "" where not known.
  int peer() const noexcept { return context_.peer; }
  int64_t call_index() const noexcept { return context_.call_index; }
  const std::string& op() const noexcept { return context_.op; }
  const ErrorContext& context() const noexcept { return context_; }

 private:
  ErrorCode code_;
  ErrorContext context_;
};

}  // namespace mhccl
