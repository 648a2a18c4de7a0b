// mhccl-launch's command line (CLI11).
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launch/cli.h"
#include "launch/launcher.h"

namespace mhccl::launch {

int parse_command_line(int argc, char** argv, Options& opts) {
  opts = Options{};
  opts.nprocs = 0;  // every local GPU
  int timeout_s = 0, grace_s = 0;
  bool no_prefix = false;
  CLI::App app{
      "mhccl-launch [-n N] [--timeout SECONDS] [--grace SECONDS] [--no-prefix] [--] PROGRAM [ARGS...]\n"
      "Runs PROGRAM once per local GPU (or N times) as the ranks of one TP group.\n"
      "MHCCL_RANK, MHCCL_WORLD_SIZE, MHCCL_LOCAL_RANK and MHCCL_UNIQUE_ID_FILE are set for each.\n"
      "Kills every rank when one fails (after --grace) or the deadline passes.\n"
      "Exit: 0 passed, 77 skipped (fewer GPUs than ranks), 124 deadline, 2 bad command line,\n"
      "else the first failing rank's code.",
      "mhccl-launch"};
  // Whole numbers in decimal, as the launcher read them before CLI11 (cli.h). Given twice, an
  // option's last value holds (a wrapper's default, then its caller's).
  const CLI::Validator decimal = decimal_digits();
  app.add_option("-n,--nprocs", opts.nprocs, "ranks to start (default: every local GPU)")
      ->transform(decimal)
      ->check(CLI::Range(1, INT_MAX))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--timeout", timeout_s, "deadline in whole seconds for the group (default 0: none)")
      ->transform(decimal)
      ->check(CLI::Range(0, INT_MAX))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--grace", grace_s, "whole seconds the other ranks may run on to end by themselves after one "
                                     "fails, before the kill (default 0)")
      ->transform(decimal)
      ->check(CLI::Range(0, INT_MAX))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--no-prefix", no_prefix, "forward the ranks' output without \"[rank N] \" before each line");
  // PROGRAM and everything after it are the ranks' command line, options included: CLI11
  // stops at the first argument it does not know, and leaves it and the rest in remaining().
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad option: CLI11's message, exit 2
  }
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && !rest.front().empty() && rest.front()[0] == '-') {
    std::fprintf(stderr, "mhccl-launch: unknown option %s (see --help)\n", rest.front().c_str());
    return 2;
  }
  if (rest.empty()) {
    std::fprintf(stderr, "mhccl-launch: no program given (see --help)\n");
    return 2;
  }
  opts.argv = std::move(rest);
  opts.timeout_s = timeout_s;
  opts.grace_s = grace_s;
  opts.prefix_output = !no_prefix;
  return -1;
}

}  // namespace mhccl::launch
