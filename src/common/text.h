// Text built without iostreams: the library's messages and reports (errors, MHCCL_DEBUG=INFO,
// the environment report, tuning tables read from a file).
//
// Why: libmhccl.so is loaded into other runtimes' processes (Python with PyTorch). Built by a
// toolchain that links libstdc++ statically into it (one GPU machine's compiler did, 2026-12-02),
// its private iostreams meet locale state that the process's shared libstdc++ initialized, and
// the first `std::ostringstream` insertion crashed (SIGSEGV in `python -m mhccl.info` and in
// every MHCCL_DEBUG=INFO construction beside torch). std::string, std::to_string and snprintf
// touch no C++ locale. The ctest `library-without-iostreams` fails where libmhccl.so or the
// Python extension references an iostream or std::locale symbol again.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

namespace mhccl::detail {

// A string with `<<` for text, integers and floating point (printf's %g), as an ostringstream
// is used: `Text t; t << "rows " << m << "\n"; use(t.str());`. `bool` prints 1 or 0, as a
// stream does without std::boolalpha; int8_t and uint8_t print as numbers (a stream prints them
// as characters).
class Text {
 public:
  Text& operator<<(const std::string& s) {
    s_ += s;
    return *this;
  }
  Text& operator<<(const char* s) {
    s_ += s != nullptr ? s : "(null)";
    return *this;
  }
  Text& operator<<(char c) {
    s_ += c;
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, char>, int> = 0>
  Text& operator<<(T v) {
    s_ += std::to_string(v);
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Text& operator<<(T v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    s_ += buf;
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// `v` in hexadecimal, lower case, without a prefix (as `std::hex` prints it): 0x3f80 -> "3f80".
inline std::string hex_text(unsigned long long v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%llx", v);
  return buf;
}

// The whitespace-separated words of `s` ("90 100-real" -> {"90", "100-real"}), calling
// `f(word)` for each in order.
template <typename F>
void for_each_word(const std::string& s, F&& f) {
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == ';')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\n' && s[j] != ';') ++j;
    if (j > i) f(s.substr(i, j - i));
    i = j;
  }
}

}  // namespace mhccl::detail
