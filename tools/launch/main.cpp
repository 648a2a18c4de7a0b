// mhccl-launch: runs a program once per local GPU (or -n N times) as the ranks of a TP group.
//   mhccl-launch [-n N] [--timeout SECONDS] [--grace SECONDS] [--no-prefix] [--] PROGRAM [ARGS...]
// Exit code: 0 when every rank passed, 77 when there are fewer GPUs than ranks (or every rank
// skipped), 124 when the deadline passed, 2 for a bad command line, else the first failing
// rank's code.
#include <cstdio>

#include "common/devices.h"
#include "launch/launcher.h"

int main(int argc, char** argv) {
  mhccl::launch::Options opts;
  if (const int code = mhccl::launch::parse_command_line(argc, argv, opts); code >= 0) return code;
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
