// The local launcher: environment of each rank, exit codes, killing the group on a failure or
// at the deadline.
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
  for (const double deadline : {0.0, 1.0}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run_sh(2, deadline > 0 ? "setsid sleep 30 & exec sleep 60" : "setsid sleep 30 & exit 0", deadline);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, deadline > 0 ? 124 : 0) << "deadline " << deadline;
    EXPECT_LT(s, deadline > 0 ? 15.0 : 10.0) << "deadline " << deadline;
  }
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
