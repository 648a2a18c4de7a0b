// mhccl's local launcher: one process per GPU of this machine, no MPI. Each child gets
// MHCCL_RANK, MHCCL_WORLD_SIZE, MHCCL_LOCAL_RANK and a fresh MHCCL_UNIQUE_ID_FILE
// (include/mhccl/bootstrap.h); its output is forwarded line by line with a rank prefix (a line
// is held until its newline, or the rank's end, so that lines of ranks never mix); the
// group is killed when one rank fails (after Options::grace_s) or the deadline passes.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mhccl::launch {

struct Options {
  int nprocs = 1;
  std::vector<std::string> argv;  // the program and its arguments
  double timeout_s = 0;           // 0: no deadline
  double grace_s = 0;             // after a rank fails, how long the others may run on to end
                                  // by themselves (e.g. to report a dead peer) before the kill
  bool prefix_output = true;      // "[rank N] " before each forwarded line
  std::vector<std::pair<std::string, std::string>> env;  // extra environment for every rank
};

struct Result {
  int exit_code = 0;            // 0 all passed; 77 every rank skipped; 124 deadline; else the
                                // first failing rank's code (128 + signal when killed)
  std::vector<int> rank_codes;  // each rank's exit code
  bool timed_out = false;
  int failed_rank = -1;
};

// Runs opts.nprocs copies of opts.argv and waits for them.
Result run(const Options& opts);

// mhccl-launch's command line, [-n N] [--timeout S] [--grace S] [--no-prefix] [--] PROGRAM
// [ARGS...], into `opts` (nprocs 0: every local GPU). Returns -1 to go on and run, else the exit
// code, having printed why: 0 after --help, 2 for a bad command line. Counts and seconds are
// whole numbers in decimal digits ("010" is 10); an option given twice takes its last value.
int parse_command_line(int argc, char** argv, Options& opts);

// Whether the tools (mhccl-bench --json, mhccl-tune --out) can write `path`, asked before a run
// of minutes rather than found after it: an existing path that is no folder and that this
// process may write (a file, /dev/stdout, a pipe), else a folder it may write in; never
// an empty path. Creates nothing.
bool can_write_file(const std::string& path);
// Writes `text` to `path` (replacing it); whether every byte was written and the file closed.
bool write_file(const std::string& path, const std::string& text);

}  // namespace mhccl::launch
