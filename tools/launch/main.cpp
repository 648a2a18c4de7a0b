// mhccl-launch: runs a program once per local GPU (or -n N times) as the ranks of a TP group.
//   mhccl-launch [-n N] [--timeout SECONDS] [--no-prefix] -- PROGRAM [ARGS...]
// Exit code: 0 when every rank passed, 77 when there are fewer GPUs than ranks (or every rank
// skipped), 124 when the deadline passed, else the first failing rank's code.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launch/launcher.h"

int main(int argc, char** argv) {
  mhccl::launch::Options opts;
  opts.nprocs = 0;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if ((a == "-n" || a == "--nprocs") && i + 1 < argc) {
      opts.nprocs = std::atoi(argv[++i]);
    } else if (a == "--timeout" && i + 1 < argc) {
      opts.timeout_s = std::atof(argv[++i]);
    } else if (a == "--no-prefix") {
      opts.prefix_output = false;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: mhccl-launch [-n N] [--timeout SECONDS] [--no-prefix] -- PROGRAM [ARGS...]\n"
                  "Runs PROGRAM once per local GPU (or N times) as the ranks of one TP group:\n"
                  "MHCCL_RANK, MHCCL_WORLD_SIZE, MHCCL_LOCAL_RANK and MHCCL_UNIQUE_ID_FILE are set\n"
                  "for each. Kills every rank when one fails or the deadline passes.\n"
                  "Exit: 0 passed, 77 skipped (fewer GPUs than ranks), 124 deadline, else the\n"
                  "first failing rank's code.\n");
      return 0;
    } else {
      break;
    }
  }
  for (; i < argc; ++i) opts.argv.push_back(argv[i]);
  if (opts.argv.empty()) {
    std::fprintf(stderr, "mhccl-launch: no program given (see --help)\n");
    return 2;
  }
  const int gpus = mhccl::launch::local_gpu_count();
  if (opts.nprocs == 0) opts.nprocs = gpus;
  if (gpus == 0 || opts.nprocs > gpus) {
    std::printf("mhccl-launch: SKIPPED: %d rank(s) need as many CUDA devices, found %d%s\n",
                opts.nprocs > 0 ? opts.nprocs : 1, gpus, gpus == 0 ? " (no CUDA device)" : "");
    return 77;
  }
  return mhccl::launch::run(opts).exit_code;
}
