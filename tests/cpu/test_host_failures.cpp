// Host code under failure: mhccl-launch when a rank cannot be started or -n is out of range, and
// the all-gather's capacity against the widths of the state and the records (found by an
// adversarial review, 2026-12-04; each test failed on the code before its fix). The error
// records out of range are in test_error_records.cpp.
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launch/cli.h"
#include "launch/launcher.h"
#include "mhccl/checks.h"

// fork() as the launcher (linked into this executable) sees it: the real one unless a test asks
// for the n-th call to fail (as fork does under RLIMIT_NPROC or memory pressure).
namespace {
std::atomic<int> g_fail_fork_at{-1};
std::atomic<int> g_forks{0};
}  // namespace
extern "C" pid_t fork() {
  using Fork = pid_t (*)();
  static Fork real = reinterpret_cast<Fork>(dlsym(RTLD_NEXT, "fork"));
  const int at = g_fail_fork_at.load();
  if (at >= 0 && g_forks.fetch_add(1) == at) {
    errno = EAGAIN;
    return -1;
  }
  return real();
}

namespace mhccl {
namespace {

// Runs `body` in a child process; its exit code, or -1 if it did not end within `deadline_s`
// (then it is killed with its process group).
int in_child(int deadline_s, int (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    _exit(body());
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > end) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// --- tools/launch ------------------------------------------------------------------------------

int launch_exit(const std::string& args) {
  const int st = std::system((std::string(MHCCL_LAUNCH_BIN) + " " + args + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// -n is parsed as a long and cast to int: 4294967296 becomes 0 ("every GPU"), 4294967297 one
// rank, 2147483648 INT_MIN (run() then sizes a vector by it: std::length_error, abort). Like
// -n 0, each must be refused with exit code 2 (here, without a GPU, they "skip" with 77).
TEST(LauncherFailures, RankCountsOutsideIntAreRefused) {
  ASSERT_EQ(launch_exit("-n 0 -- true"), 2);
  for (const char* n : {"4294967296", "4294967297", "2147483648", "9223372036854775807"}) {
    EXPECT_EQ(launch_exit(std::string("-n ") + n + " -- true"), 2) << "-n " << n;
  }
}

// The command line (CLI11): a bad one exits 2 before any GPU is looked for; PROGRAM's own
// options, after `--` or after PROGRAM, are not the launcher's. Without a GPU a good command
// line skips (77); with one, `true` passes (0).
TEST(LauncherFailures, CommandLine) {
  EXPECT_EQ(launch_exit("--help"), 0);
  for (const char* bad : {"--bogus -- true", "--nprocs=0 -- true", "--timeout 1.5 -- true", "--timeout -1 -- true",
                          "--grace x -- true", "-n", "-n 1", "-n 1 --", "-n 0x3 -- true", "-n 1 - true"}) {
    EXPECT_EQ(launch_exit(bad), 2) << "mhccl-launch " << bad;
  }
  for (const char* good : {"-n 1 -- true --bogus", "-n 1 true --bogus -n 0", "--nprocs=1 --timeout=5 --grace 1 "
                           "--no-prefix true", "-n1 -- true"}) {
    const int rc = launch_exit(good);
    EXPECT_TRUE(rc == 0 || rc == 77) << "mhccl-launch " << good << ": exit " << rc;
  }
}

// The values read (a review, 2026-12-05: CLI11 read "-n 010" as 8 ranks, refused "-n 08", took
// "-n 0x3", and refused an option given twice, where the hand-written parser before it read
// decimal digits and let the last value hold).
TEST(LauncherFailures, CommandLineValues) {
  auto parse = [](std::vector<std::string> args, launch::Options& o) {
    args.insert(args.begin(), "mhccl-launch");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return launch::parse_command_line(static_cast<int>(argv.size()), argv.data(), o);
  };
  launch::Options o;
  ASSERT_EQ(parse({"-n", "010", "--timeout", "08", "--grace", "0", "--", "prog", "-n", "3"}, o), -1);
  EXPECT_EQ(o.nprocs, 10);
  EXPECT_EQ(o.timeout_s, 8);
  EXPECT_EQ(o.grace_s, 0);
  EXPECT_TRUE(o.prefix_output);
  EXPECT_EQ(o.argv, (std::vector<std::string>{"prog", "-n", "3"}));
  ASSERT_EQ(parse({"--timeout", "600", "-n", "1", "--timeout", "5", "-n", "2", "--no-prefix", "prog"}, o), -1);
  EXPECT_EQ(o.nprocs, 2);
  EXPECT_EQ(o.timeout_s, 5);
  EXPECT_FALSE(o.prefix_output);
  EXPECT_EQ(o.argv, (std::vector<std::string>{"prog"}));
  ASSERT_EQ(parse({"prog", "--timeout", "3"}, o), -1);
  EXPECT_EQ(o.nprocs, 0);  // every local GPU
  EXPECT_EQ(o.timeout_s, 0);
  EXPECT_EQ(o.argv, (std::vector<std::string>{"prog", "--timeout", "3"}));
  EXPECT_EQ(parse({"-n", "0x3", "prog"}, o), 2);
  EXPECT_EQ(parse({"-n", "00", "prog"}, o), 2);
  EXPECT_EQ(parse({"-n", "", "prog"}, o), 2);
}

// The tools' default TP on a machine of 3, 5, 6 or 7 GPUs (a review, 2026-12-05: every local GPU
// as one group, a TP no op builds, failed only after its ranks started).
TEST(LauncherFailures, DefaultTpIsOneTheOpsSupport) {
  const int want[] = {1, 1, 2, 2, 4, 4, 4, 4, 8, 8, 8};
  for (int gpus = 0; gpus <= 10; ++gpus) EXPECT_EQ(launch::supported_tp_at_most(gpus), want[gpus]) << gpus << " GPUs";
}

// An empty path is no file: mhccl-tune --out "" swept for minutes, then could not write.
TEST(LauncherFailures, AnEmptyPathCannotBeWritten) {
  EXPECT_FALSE(launch::can_write_file(""));
  EXPECT_TRUE(launch::can_write_file(::testing::TempDir() + "/mhccl-can-write-test.json"));
  EXPECT_FALSE(launch::can_write_file("/nonexistent-dir/t.json"));
}

// The ranks' output as the launcher forwards it (a review, 2026-12-05): a NUL byte cut the last,
// unterminated line (printf "%s"), and a line without a newline was searched again whole at
// every 8 KiB read (128 MB: 44 s of the launcher's time, the rank blocked on its full pipe
// meanwhile). Lines stay whole, one rank's never inside another's.
std::string g_forward_path;
int forward_into_file(int nprocs, const char* script) {
  if (std::freopen(g_forward_path.c_str(), "w", stdout) == nullptr) return 3;
  launch::Options o;
  o.nprocs = nprocs;
  o.argv = {"/bin/sh", "-c", script};
  const int code = launch::run(o).exit_code;
  std::fflush(stdout);
  return code;
}
int forward_nul_and_long_lines() {
  return forward_into_file(1, "printf 'abc\\0def\\n'; head -c 300000 /dev/zero | tr '\\0' x; echo; printf 'a\\0b\\n';"
                              "head -c 65536 /dev/zero | tr '\\0' y");
}
int forward_two_ranks() {
  return forward_into_file(2, "if [ \"$MHCCL_RANK\" = 0 ]; then head -c 200000 /dev/zero | tr '\\0' x; sleep 0.3; "
                              "echo END; else sleep 0.1; echo rank1-line; fi");
}
// The launcher's own CPU time for 128 MB without a newline: under 10 s (48 s before, on two cores).
int forward_128_mb_without_newline() {
  const int code = forward_into_file(1, "head -c 134217728 /dev/zero | tr '\\0' x");
  struct rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu_s = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return code != 0 ? 2 : cpu_s < 10 ? 0 : 1;
}
std::string read_all(const std::string& path) {
  std::string got;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) got.append(buf, n);
    std::fclose(f);
  }
  return got;
}
TEST(LauncherFailures, OutputForwardedWholeByteForByteAndInLinearTime) {
  g_forward_path = ::testing::TempDir() + "/mhccl-launch-forward-test.txt";
  struct Remove {
    ~Remove() { std::remove(g_forward_path.c_str()); }
  } remove_at_end;
  ASSERT_EQ(in_child(60, forward_nul_and_long_lines), 0);
  std::string got = read_all(g_forward_path);
  const std::string want = std::string("[rank 0] abc\0def\n", 17) + "[rank 0] " + std::string(300000, 'x') + "\n" +
                           std::string("[rank 0] a\0b\n", 13) + "[rank 0] " + std::string(65536, 'y') + "\n";
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the forwarded output differs from the rank's (first 40 bytes: " << got.substr(0, 40)
                           << ")";
  ASSERT_EQ(in_child(60, forward_two_ranks), 0);
  got = read_all(g_forward_path);
  const std::string long_line = "[rank 0] " + std::string(200000, 'x') + "END\n";
  EXPECT_TRUE(got == long_line + "[rank 1] rank1-line\n" || got == "[rank 1] rank1-line\n" + long_line)
      << "a line of one rank was split by another's (" << got.size() << " bytes)";
  EXPECT_EQ(in_child(120, forward_128_mb_without_newline), 0) << "1: 10 s of CPU or more; -1: not done in 120 s";
}

// A fork() that fails (EAGAIN) is not checked: the rank's pid is -1, and waitpid(-1, WNOHANG)
// then reaps any other rank (or returns -1 == pid once none is left). Rank 1, never started,
// is reported as exit 0 (the group "passed"), or another rank's status is stolen and run()
// never returns. Expected: an error exit code, promptly.
int fork_fails_for_rank_1() {
  g_forks = 0;
  g_fail_fork_at = 1;  // the second fork: rank 1
  launch::Options o;
  o.nprocs = 3;
  o.argv = {"/bin/sh", "-c", "sleep 0.3; exit 0"};
  o.timeout_s = 5;
  const launch::Result r = launch::run(o);
  g_fail_fork_at = -1;
  // 0: the failure went unnoticed; 1: noticed.
  return r.exit_code != 0 && r.rank_codes.at(1) != 0 ? 1 : 0;
}
TEST(LauncherFailures, ForkFailureIsAnErrorNotAPassOrAHang) {
  const int got = in_child(30, fork_fails_for_rank_1);
  EXPECT_NE(got, -1) << "run() did not return within 30 s (a rank's status was reaped by waitpid(-1))";
  EXPECT_EQ(got, 1) << "a rank that was never started was reported as passed";
}

// pipe2() failing for a later rank (EMFILE) returns exit code 1 at once, leaving the ranks
// already forked running, unreaped and unkilled (and the unique-id directory behind).
int pipe_fails_midway() {
  int open_fds = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) (void)e, ++open_fds;
  const rlim_t lim = static_cast<rlim_t>(open_fds + 6);  // room for ~3 ranks' pipes
  struct rlimit rl = {lim, lim};
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
  launch::Options o;
  o.nprocs = 32;
  o.argv = {"/bin/sh", "-c", "exec sleep 3"};
  const launch::Result r = launch::run(o);
  if (r.exit_code == 0) return 4;
  int status = 0;
  const pid_t left = waitpid(-1, &status, WNOHANG);  // 0: a rank is still running
  return left == -1 && errno == ECHILD ? 0 : 1;
}
TEST(LauncherFailures, PipeFailureLeavesNoRankRunning) {
  EXPECT_EQ(in_child(30, pipe_fails_midway), 0) << "ranks forked before the failure were left running";
}

// --- LamportAllGather: widths (latent; needs a >= 32-64 GiB capacity a rank) -------------------

// check_all_gather_config accepted up to 2^40 bytes (2^36 packs), but the all-gather kernel
// keeps the packs to reset next call in LamportState::prev_rows (uint32: advance_if_last(...,
// static_cast<uint32_t>(p.packs)), all_gather.cu) and reports a pack in ErrorRecord::row
// (int32). At 2^32 packs (64 GiB) prev_rows wraps to 0: the next call of that generation finds
// the old packs unreset (wrong bits, no error); from 2^31 packs errors name a wrong pack.
TEST(AllGatherCapacity, LargestCapacityFitsTheStateAndRecordWidths) {
  const int64_t max_packs = kMaxAllGatherCapacity / 16;
  EXPECT_LE(max_packs, int64_t{UINT32_MAX}) << "LamportState::prev_rows";
  EXPECT_LE(max_packs - 1, int64_t{INT32_MAX}) << "ErrorRecord::row (a pack index)";
}

}  // namespace
}  // namespace mhccl
