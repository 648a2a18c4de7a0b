// FNV-1a, 64 bits: the one byte hash of the library and its tools (the configuration
// agreement's field names, the all-gather's layout digest, the tests' and the bench's output
// hashes compared between ranks and runs). Not cryptographic: what it tells apart is a
// mismatch of honest inputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mhccl::detail {

// The offset basis as this project has always used it: one digit short of FNV's published
// 14695981039346656037, which changes the values, not how well it hashes. Every hash compared
// between ranks is made by the same build, so only its use everywhere matters.
constexpr uint64_t kFnv1aBasis = 1469598103934665603ull;

// `bytes` bytes at `data` hashed onto `h` (chain calls to hash several pieces as one).
inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace mhccl::detail
