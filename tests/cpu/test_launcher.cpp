// The local launcher: environment of each rank, exit codes, killing the group on a failure or
// at the deadline.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "launch/launcher.h"
#include "mhccl/bootstrap.h"
#include "mhccl/error.h"

namespace mhccl::launch {
namespace {

Result run_sh(int n, const std::string& script, double timeout_s = 0) {
  Options o;
  o.nprocs = n;
  o.argv = {"/bin/sh", "-c", script};
  o.timeout_s = timeout_s;
  return run(o);
}

TEST(Launcher, EveryRankGetsItsEnvironment) {
  const Result r = run_sh(3,
      "test \"$MHCCL_WORLD_SIZE\" = 3 && test \"$MHCCL_RANK\" = \"$MHCCL_LOCAL_RANK\" && "
      "test \"$MHCCL_RANK\" -lt 3 && test -d \"$(dirname \"$MHCCL_UNIQUE_ID_FILE\")\"");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.rank_codes, (std::vector<int>{0, 0, 0}));
  EXPECT_FALSE(r.timed_out);
}

TEST(Launcher, OneFailingRankStopsTheGroup) {
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run_sh(3, "if [ \"$MHCCL_RANK\" = 1 ]; then exit 3; fi; exec sleep 60");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_LT(s, 20.0);  // the sleepers were killed, not waited for
  EXPECT_EQ(r.rank_codes[0], 128 + 15);  // SIGTERM
}

TEST(Launcher, GraceLetsTheOthersEndByThemselves) {
  Options o;
  o.nprocs = 3;
  o.grace_s = 30;
  // Rank 1 dies by a signal; ranks 0 and 2 notice within the grace and end with their own codes.
  o.argv = {"/bin/sh", "-c",
            "if [ \"$MHCCL_RANK\" = 1 ]; then kill -9 $$; fi; sleep 1; exit $((MHCCL_RANK + 4))"};
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 128 + 9);
  EXPECT_EQ(r.rank_codes, (std::vector<int>{4, 128 + 9, 6}));
  EXPECT_LT(s, 20.0);
  // A rank that does not end within the grace is killed when it runs out.
  o.grace_s = 1;
  o.argv = {"/bin/sh", "-c", "if [ \"$MHCCL_RANK\" = 1 ]; then exit 3; fi; exec sleep 60"};
  const auto t1 = std::chrono::steady_clock::now();
  const Result k = run(o);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 20.0);
  EXPECT_EQ(k.exit_code, 3);
  EXPECT_EQ(k.rank_codes[0], 128 + 15);
}

// A rank other than 0 reads the id rank 0 wrote (128 bytes), or gives up at its deadline.
TEST(Bootstrap, UniqueIdFileIsReadOrTimesOut) {
  const std::string path = ::testing::TempDir() + "mhccl_uid_test";
  std::remove(path.c_str());
  mhccl::RankEnvironment env;
  env.rank = 1;
  env.world_size = 2;
  env.unique_id_file = path;
  try {
    mhccl::share_unique_id(env, 50);
    ADD_FAILURE() << "no timeout";
  } catch (const mhccl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("within 50 ms"), std::string::npos) << e.what();
    // A wait on a peer that never arrived: kPeerTimeout naming rank 0, not a caller's mistake.
    EXPECT_EQ(e.code(), mhccl::ErrorCode::kPeerTimeout) << e.what();
    EXPECT_EQ(e.peer(), 0);
  }
  char bytes[128];
  for (int i = 0; i < 128; ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes, 1, 128, f), 128u);
  std::fclose(f);
  const ncclUniqueId id = mhccl::share_unique_id(env, 1000);
  EXPECT_EQ(std::memcmp(id.internal, bytes, 128), 0);
  std::remove(path.c_str());
}

TEST(Launcher, DeadlineKillsEveryRank) {
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run_sh(2, "exec sleep 60", 1.0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(s, 20.0);
}

// A rank that leaves a process behind in a session of its own (out of killpg's reach) holding
// its output pipe: the launcher stops reading it kDrainS after every rank exited, rather than
// wait for its end of file (30 s here; for ever with `sleep infinity`), deadline or none.
TEST(Launcher, OutputHeldByALeftBehindProcessIsNotWaitedFor) {
  if (std::system("command -v setsid > /dev/null 2>&1") != 0) GTEST_SKIP() << "no setsid on this machine";
  const std::string pids = ::testing::TempDir() + "/mhccl-launcher-left-behind.pids";
  std::remove(pids.c_str());
  // Each left-behind process writes its pid, so that the test ends them.
  const std::string leave = "setsid sh -c 'echo $$ >> " + pids + "; exec sleep 30' & ";
  struct Case {
    std::string script;
    double deadline;
    int code;
  };
  // The deadline passes while ranks run (124), or only after every rank exited (no timeout).
  for (const Case& k : {Case{leave + "exit 0", 0.0, 0}, Case{leave + "exec sleep 60", 1.0, 124},
                        Case{"sleep 1; " + leave + "exit 0", 2.0, 0}}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run_sh(2, k.script, k.deadline);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, k.code) << k.script << ", deadline " << k.deadline;
    EXPECT_LT(s, 15.0) << k.script;
  }
  EXPECT_EQ(std::system(("kill $(cat " + pids + ") 2> /dev/null").c_str()), 0) << "the left-behind processes' pids";
  std::remove(pids.c_str());
}

// Every line a rank wrote before it exited arrives, however slowly the launcher's own stdout is
// read (the rank exits with 64 KiB still in its pipe, which takes longer than the 2 s after its
// exit to pass through), and a process it left in its own process group is stopped, not waited
// for (its "late" never comes).
TEST(Launcher, AnExitedRanksOutputArrivesWhole) {
  if (std::system("python3 -c pass > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 on this machine";
  const std::string out = ::testing::TempDir() + "/mhccl-launcher-slow-stdout.txt";
  // Our stdout (where run() forwards the ranks' lines) into a reader of 1 KiB every 60 ms.
  const std::string slow_reader =
      "python3 -c 'import sys, time\nwhile True:\n b = sys.stdin.buffer.read(1024)\n if not b: break\n"
      " sys.stdout.buffer.write(b); sys.stdout.flush(); time.sleep(0.06)' > " + out;
  std::fflush(stdout);
  const int saved = dup(1);
  std::FILE* reader = popen(slow_reader.c_str(), "w");
  ASSERT_NE(reader, nullptr);
  dup2(fileno(reader), 1);
  Options o;
  o.nprocs = 1;
  o.prefix_output = false;
  o.argv = {"/bin/sh", "-c", "seq 1 20000; (sleep 30; echo late) & exit 0"};
  const Result r = run(o);
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  EXPECT_EQ(pclose(reader), 0);
  EXPECT_EQ(r.exit_code, 0);
  std::FILE* f = std::fopen(out.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int lines = 0, last = 0;
  bool late = false;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f) != nullptr) {
    if (std::sscanf(buf, "%d", &last) == 1) ++lines;
    late = late || std::strstr(buf, "late") != nullptr;
  }
  std::fclose(f);
  std::remove(out.c_str());
  EXPECT_EQ(lines, 20000);
  EXPECT_EQ(last, 20000);
  EXPECT_FALSE(late);
}

TEST(Launcher, AllSkippedIsSkipped) {
  EXPECT_EQ(run_sh(2, "exit 77").exit_code, 77);
  EXPECT_EQ(run_sh(2, "if [ \"$MHCCL_RANK\" = 0 ]; then exit 77; fi; exit 0").exit_code, 0);
}

TEST(Launcher, MissingProgramFails) {
  Options o;
  o.nprocs = 1;
  o.argv = {"/nonexistent/program"};
  EXPECT_EQ(run(o).exit_code, 127);
}

}  // namespace
}  // namespace mhccl::launch
