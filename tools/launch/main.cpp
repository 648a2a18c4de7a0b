// mhccl-launch: runs a program once per local GPU (or -n N times) as the ranks of a TP group.
//   mhccl-launch [-n N] [--timeout SECONDS] [--grace SECONDS] [--no-prefix] -- PROGRAM [ARGS...]
// Exit code: 0 when every rank passed, 77 when there are fewer GPUs than ranks (or every rank
// skipped), 124 when the deadline passed, else the first failing rank's code.
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
// A whole number in [0, INT_MAX], or -1.
long parse_count(const char* s) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  return (end == s || *end != '\0' || errno == ERANGE || v < 0 || v > INT_MAX) ? -1 : v;
}
}  // namespace

#include "common/devices.h"
#include "launch/launcher.h"

int main(int argc, char** argv) {
  mhccl::launch::Options opts;
  opts.nprocs = 0;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if ((a == "-n" || a == "--nprocs") && i + 1 < argc) {
      const long n = parse_count(argv[++i]);
      if (n < 1) {
        std::fprintf(stderr, "mhccl-launch: -n expects a number of ranks >= 1, got '%s'\n", argv[i]);
        return 2;
      }
      opts.nprocs = static_cast<int>(n);
    } else if ((a == "--timeout" || a == "--grace") && i + 1 < argc) {
      const long t = parse_count(argv[++i]);
      if (t < 0) {
        std::fprintf(stderr, "mhccl-launch: %s expects whole seconds >= 0, got '%s'\n", a.c_str(), argv[i]);
        return 2;
      }
      (a == "--timeout" ? opts.timeout_s : opts.grace_s) = static_cast<double>(t);
    } else if (a == "--no-prefix") {
      opts.prefix_output = false;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: mhccl-launch [-n N] [--timeout SECONDS] [--grace SECONDS] [--no-prefix] -- PROGRAM [ARGS...]\n"
                  "Runs PROGRAM once per local GPU (or N times) as the ranks of one TP group:\n"
                  "-n defaults to every local GPU, --timeout to 0 (no deadline).\n"
                  "MHCCL_RANK, MHCCL_WORLD_SIZE, MHCCL_LOCAL_RANK and MHCCL_UNIQUE_ID_FILE are set\n"
                  "for each. Kills every rank when one fails (after --grace seconds, default 0, in\n"
                  "which the others may end by themselves) or the deadline passes.\n"
                  "Exit: 0 passed, 77 skipped (fewer GPUs than ranks), 124 deadline, else the\n"
                  "first failing rank's code.\n");
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "mhccl-launch: unknown option %s (see --help)\n", a.c_str());
      return 2;
    } else {
      break;
    }
  }
  for (; i < argc; ++i) opts.argv.push_back(argv[i]);
  if (opts.argv.empty()) {
    std::fprintf(stderr, "mhccl-launch: no program given (see --help)\n");
    return 2;
  }
  const mhccl::detail::DeviceCount devices = mhccl::detail::cuda_device_count();
  const int gpus = devices.count;
  if (opts.nprocs == 0) opts.nprocs = gpus;
  if (gpus == 0) {
    std::printf("mhccl-launch: SKIPPED: no CUDA device (%s)\n", devices.why_none.c_str());
    return 77;
  }
  if (opts.nprocs > gpus) {
    std::printf("mhccl-launch: SKIPPED: %d ranks need as many CUDA devices, found %d\n", opts.nprocs, gpus);
    return 77;
  }
  return mhccl::launch::run(opts).exit_code;
}
