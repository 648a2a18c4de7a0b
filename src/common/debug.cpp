// MHCCL_DEBUG (src/common/debug.h).
#include "common/debug.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace mhccl::detail {

namespace {
bool same_word(const char* value, const char* word) {
  for (; *value != '\0' && *word != '\0'; ++value, ++word) {
    if (std::toupper(static_cast<unsigned char>(*value)) != *word) return false;
  }
  return *value == '\0' && *word == '\0';
}
}  // namespace

DebugLevel parse_debug_level(const char* value, bool* unknown) {
  if (unknown != nullptr) *unknown = false;
  if (value == nullptr || *value == '\0' || same_word(value, "WARN")) return DebugLevel::kWarn;
  if (same_word(value, "INFO")) return DebugLevel::kInfo;
  if (unknown != nullptr) *unknown = true;
  return DebugLevel::kWarn;
}

bool debug_info() {
  static const bool info = [] {
    const char* v = std::getenv("MHCCL_DEBUG");
    bool unknown = false;
    const DebugLevel level = parse_debug_level(v, &unknown);
    if (unknown) std::fprintf(stderr, "mhccl WARN MHCCL_DEBUG=%s: expected INFO or WARN; printing nothing\n", v);
    return level == DebugLevel::kInfo;
  }();
  return info;
}

void debug_print(const std::string& who, const std::string& text) {
  std::string s;
  for (size_t at = 0; at < text.size();) {  // every line, as std::getline splits them
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    s += "mhccl INFO " + who + ": " + text.substr(at, end - at) + "\n";
    at = end + 1;
  }
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
}

std::string bytes_text(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB (%llu bytes)", static_cast<double>(bytes) / (1 << 20),
                static_cast<unsigned long long>(bytes));
  return buf;
}

}  // namespace mhccl::detail
