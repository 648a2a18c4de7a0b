// MHCCL_DEBUG, as NCCL_DEBUG: INFO makes every construction (Communicator, AllReduceMHC,
// LamportAllGather) print its decisions once to stderr; unset, empty or WARN: nothing
// (include/mhccl/communicator.h documents it with the other MHCCL_* variables).
#pragma once

#include <cstdint>
#include <string>

namespace mhccl::detail {

enum class DebugLevel { kWarn, kInfo };

// The level a value of MHCCL_DEBUG names (case-insensitive; null or empty: kWarn). Any other
// value: kWarn, with `*unknown` set.
DebugLevel parse_debug_level(const char* value, bool* unknown = nullptr);

// Whether this process prints INFO: MHCCL_DEBUG, read at the first call (a value it does not
// know is named once on stderr, and nothing else is printed).
bool debug_info();

// Writes every line of `text` to stderr as "mhccl INFO <who>: <line>", in one write so that the
// lines of concurrent ranks do not interleave within a construction's report.
void debug_print(const std::string& who, const std::string& text);

// "13.1 MiB (13762560 bytes)".
std::string bytes_text(uint64_t bytes);

}  // namespace mhccl::detail
