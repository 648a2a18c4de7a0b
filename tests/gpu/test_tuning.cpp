// Tuning tables on a GPU (docs/TUNING.md): mhccl-tune at TP=1 through the own mailbox writes a
// table; loading it changes protocol_for() as written; every path gives the same bits whichever
// thresholds are chosen; mhccl-tune --verify passes, and fails when a path is broken on purpose
// (MHCCL_TEST_BREAK_PATH, test only). The tests that run mhccl-tune do so only where this
// process is alone (gpu_tp1): under mhccl-launch -n 2 every rank would start its own, and the
// ranks' tools would share the GPUs the ranks hold.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nccl.h>

#include "common/mhc_harness.h"
#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/all_reduce_mhc.h"
#include "mhccl/error.h"
#include "ops/tuning.h"
#include "tune/verify.h"

// The mhccl-tune this build made (tests/gpu/CMakeLists.txt); none with MHCCL_BUILD_TOOLS=OFF.
#ifdef MHCCL_TUNE_BIN
constexpr const char* kTuneBin = MHCCL_TUNE_BIN;
#else
constexpr const char* kTuneBin = nullptr;
#endif

namespace mhccl::gputest {
namespace {

using testing::CallBuffers;
using testing::Variant;

struct Output {
  int code = -1;
  std::string text;
};

Output run_command(const std::string& cmd) {
  Output o;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) o.text += buf;
  const int st = pclose(p);
  o.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return o;
}

bool alone() { return env().world == nullptr; }

// This machine's key for a TP=1 self-test op of H=5120, hc=4, plain.
tuning::Key self_key() {
  cudaDeviceProp prop{};
  MHCCL_TEST_CUDA(cudaGetDeviceProperties(&prop, env().device));
  int v = 0;
  ncclGetVersion(&v);
  tuning::Key k;
  k.gpu = prop.name;
  k.sms = prop.multiProcessorCount;
  k.p2p = "self";
  k.nccl = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  k.tp = 1;
  k.variant = "plain";
  k.mhccl = tuning::library_version();
  return k;
}

std::string write_table(const std::string& name, int64_t two_shot, int64_t two_shot_fin, int64_t streaming) {
  const tuning::Key k = self_key();
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << R"({"schema_version": 1, "entries": [{"key": {"gpu": ")" << k.gpu << R"(", "sms": )" << k.sms
                      << R"(, "p2p": "self", "nccl": ")" << k.nccl << R"(", "tp": 1, "hidden": 5120, "hc": 4, )"
                      << R"("variant": "plain"}, "provenance": "measured", "thresholds": {"two_shot_min_rows": )"
                      << two_shot << R"(, "two_shot_min_finalize_rows": )" << two_shot_fin
                      << R"(, "streaming_min_rows": )" << streaming << R"(}, "timings": []}]})";
  return path;
}

AllReduceMHCConfig self_test_config(int64_t capacity, const std::string& table) {
  AllReduceMHCConfig c;
  c.max_num_tokens = capacity;
  c.lamport_self_test = true;
  c.lamport_self_test_auto = true;
  c.tuning_file = table;
  return c;
}

TEST(Tuning, LoadingATableChangesProtocolForAsWritten) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  const std::string path = write_table("mhccl-gpu-tuning.json", 100, 40, 0);
  AllReduceMHC op(*env().solo, self_test_config(256, path));
  EXPECT_NE(op.tuning_source().find("tuning table " + path + " entries[0] (measured)"), std::string::npos)
      << op.tuning_source();
  EXPECT_EQ(op.config().two_shot_min_rows, 100);
  EXPECT_EQ(op.config().two_shot_min_finalize_rows, 40);
  EXPECT_EQ(op.config().streaming_min_rows, 0);
  EXPECT_EQ(op.protocol_for(99, false), Protocol::kOneShot);
  EXPECT_EQ(op.protocol_for(100, false), Protocol::kTwoShot);
  EXPECT_EQ(op.protocol_for(39, true), Protocol::kOneShot);
  EXPECT_EQ(op.protocol_for(40, true), Protocol::kTwoShot);
  // An explicit value wins over the table; without the table: the built-in defaults (TP=1: never).
  AllReduceMHCConfig explicit_cfg = self_test_config(256, path);
  explicit_cfg.two_shot_min_rows = 200;
  AllReduceMHC e(*env().solo, explicit_cfg);
  EXPECT_EQ(e.protocol_for(150, false), Protocol::kOneShot);
  EXPECT_EQ(e.protocol_for(200, false), Protocol::kTwoShot);
  EXPECT_EQ(e.protocol_for(40, true), Protocol::kTwoShot);
  AllReduceMHC d(*env().solo, self_test_config(256, ""));
  EXPECT_EQ(d.protocol_for(256, false), Protocol::kOneShot);
  EXPECT_NE(d.tuning_source().find("built-in defaults"), std::string::npos);
  // A table for another machine: the built-in defaults, saying why.
  AllReduceMHCConfig other = self_test_config(256, path);
  other.hidden_size = 4096;
  AllReduceMHC o(*env().solo, other);
  EXPECT_EQ(o.protocol_for(256, false), Protocol::kOneShot);
  EXPECT_NE(o.tuning_source().find("no entry for"), std::string::npos) << o.tuning_source();
  // A malformed table: kInvalidArgument naming the file.
  const std::string bad = ::testing::TempDir() + "/mhccl-gpu-bad.json";
  std::ofstream(bad) << "{\"schema_version\": 1, \"entries\": [";
  try {
    AllReduceMHC x(*env().solo, self_test_config(256, bad));
    ADD_FAILURE() << "a malformed table was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("tuning table " + bad + ": line 1"), std::string::npos) << err.what();
  }
  EXPECT_TRUE(env().solo->usable());
}

// An op whose buffers the device cannot hold raises kInvalidArgument before the configuration
// agreement (every rank alike, nothing allocated), and the communicator stays usable: after the
// agreement a failed allocation left it unusable, and with it every op built on it (an
// adversarial review, 2026-12-05: max_num_tokens up to 2^24 and rank_capacity_bytes up to 2^35
// pass the configuration checks whatever the device's memory).
TEST(Construction, MoreDeviceMemoryThanIsFreeIsRefusedBeforeTheAgreement) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  Communicator& solo = *env().solo;
  try {  // the self-test's one-shot mailbox of 2^24 rows: about 500 GB
    AllReduceMHC op(solo, self_test_config(int64_t{1} << 24, ""));
    ADD_FAILURE() << "a configuration needing more device memory than the device has was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("AllReduceMHC with max_num_tokens 16777216: needs"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(solo.usable());
  // LamportAllGather's staging copy, with the device's free memory taken down to about 64 MiB.
  size_t free_bytes = 0, total_bytes = 0;
  MHCCL_TEST_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  void* hog = nullptr;
  if (free_bytes < (size_t{256} << 20) || cudaMalloc(&hog, free_bytes - (size_t{64} << 20)) != cudaSuccess) {
    cudaGetLastError();
    GTEST_SKIP() << "could not take the device's free memory down";
  }
  try {
    LamportAllGather ag(solo, int64_t{256} << 20);
    ADD_FAILURE() << "a capacity larger than the device's free memory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("LamportAllGather with rank_capacity_bytes 268435456: needs"),
              std::string::npos)
        << e.what();
  }
  MHCCL_TEST_CUDA(cudaFree(hog));
  EXPECT_TRUE(solo.usable());
  AllReduceMHC op(solo, self_test_config(256, ""));  // the communicator builds ops as before
  LamportAllGather ag(solo, int64_t{1} << 20);
  EXPECT_TRUE(solo.usable());
  // protocol_for takes what a call takes: M in [1, max_num_tokens].
  for (int64_t m : {int64_t{0}, int64_t{-1}, int64_t{257}}) {
    try {
      op.protocol_for(m, false);
      ADD_FAILURE() << "protocol_for(" << m << ") was answered";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
  EXPECT_EQ(op.protocol_for(256, true), Protocol::kOneShot);
}

// lamport_self_test_auto promises "never NCCL": with the NCCL fallback forced (no mailboxes),
// kAuto at TP=1 is the direct path, and a forced Lamport protocol is refused (kUnsupported).
TEST(Tuning, SelfTestAutoNeverNcclEvenWithTheFallbackForced) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  CommunicatorOptions o;
  o.wait_timeout_ms = 20000;
  o.force_nccl_fallback = true;
  Communicator solo(Communicator::make_unique_id(), 0, 1, env().device, o);
  AllReduceMHC op(solo, self_test_config(64, ""));
  EXPECT_EQ(op.protocol_for(1, false), Protocol::kOneShot);
  EXPECT_EQ(op.protocol_for(64, true), Protocol::kOneShot);
  CallBuffers b(8, 5120, 4, 6);
  const testing::Problem p = testing::make_problem(70001, 8, 5120, 4, 1, false);
  testing::upload(p, 0, b);
  testing::launch(op, p, Variant::kPlain, Protocol::kAuto, b, env().device, env().stream);
  MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
  EXPECT_EQ(testing::check(p, Variant::kPlain, testing::download(p, Variant::kPlain, b)), "");
  try {
    testing::launch(op, p, Variant::kPlain, Protocol::kOneShot, b, env().device, env().stream);
    ADD_FAILURE() << "a forced one-shot ran without mailboxes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  solo.check_errors();
  EXPECT_TRUE(solo.usable());
}

// Every path gives the bits of the direct path, whichever thresholds a table (or the config) sets:
// the automatic choice at TP=1 through the own mailbox under several tables, against the direct op.
TEST(Tuning, EveryPathSameBitsWhicheverThresholds) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  const int64_t cap = 300;
  AllReduceMHCConfig direct_cfg;
  direct_cfg.max_num_tokens = cap;
  AllReduceMHC direct(*env().solo, direct_cfg);
  struct T { int64_t two, fin, streaming; };
  std::vector<std::unique_ptr<AllReduceMHC>> ops;
  for (const T& t : {T{1, 1, 0}, T{64, 97, 1}, T{97, 300, -1}, T{301, 301, 2}, T{128, 1, 300}}) {
    const std::string path = write_table("mhccl-gpu-bits-" + std::to_string(ops.size()) + ".json", t.two, t.fin, t.streaming);
    ops.push_back(std::make_unique<AllReduceMHC>(*env().solo, self_test_config(cap, path)));
  }
  CallBuffers buf(cap, 5120, 4, 6);
  uint64_t seed = 91000;
  int calls = 0;
  for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{63}, int64_t{64}, int64_t{96}, int64_t{97}, int64_t{128}, int64_t{299}, cap}) {
    for (const bool fin : {false, true}) {
      const testing::Problem p = testing::make_problem(seed++, m, 5120, 4, 1, fin);
      testing::upload(p, 0, buf);
      testing::launch(direct, p, Variant::kPlain, Protocol::kAuto, buf, env().device, env().stream);
      MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
      const testing::Outputs want = testing::download(p, Variant::kPlain, buf);
      ASSERT_EQ(testing::check(p, Variant::kPlain, want), "") << "direct M=" << m;
      for (auto& op : ops) {
        testing::upload(p, 0, buf);
        testing::launch(*op, p, Variant::kPlain, Protocol::kAuto, buf, env().device, env().stream);
        MHCCL_TEST_CUDA(cudaStreamSynchronize(env().stream));
        EXPECT_EQ(testing::download(p, Variant::kPlain, buf).hash(), want.hash())
            << "M=" << m << (fin ? " finalize " : " call ") << protocol_name(op->protocol_for(m, fin)) << " under "
            << op->tuning_source();
        ++calls;
      }
    }
  }
  std::printf("TP=1: %d automatic calls through the own mailbox under 5 tables, each equal to the direct path\n", calls);
  env().solo->check_errors();
}

// The self-test in process (what python -m mhccl.selftest runs), at TP=1 and at the world's TP.
TEST(Tuning, SelfTestPassesInProcess) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  Communicator& c = env().world ? *env().world : *env().solo;
  tune::VerifyOptions o;
  o.ms = {1, 97, 200};
  const tune::VerifyResult r = tune::verify(c, env().stream, o);
  EXPECT_TRUE(r.ok) << r.first_failure << "\n" << r.report;
  EXPECT_GT(r.cases, 0);
  tune::VerifyOptions broken = o;
  broken.variants = {"plain"};
  broken.break_path = "two-shot";
  const tune::VerifyResult b = tune::verify(c, env().stream, broken);
  EXPECT_FALSE(b.ok);
  EXPECT_NE(b.first_failure.find("two-shot"), std::string::npos) << b.first_failure;
  EXPECT_TRUE(c.usable());
  // A bad M or shape: an argument error before any buffer is sized from it (not a failed
  // allocation of a wrapped size), and the communicator stays usable.
  for (const std::vector<int64_t>& ms : {std::vector<int64_t>{0}, std::vector<int64_t>{1, -5},
                                         std::vector<int64_t>{int64_t{1} << 40}}) {
    tune::VerifyOptions bad = o;
    bad.ms = ms;
    try {
      tune::verify(c, env().stream, bad);
      ADD_FAILURE() << "verify accepted M = " << ms.back();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
  tune::VerifyOptions bad_shape = o;
  bad_shape.hc = 3;
  try {
    tune::verify(c, env().stream, bad_shape);
    ADD_FAILURE() << "verify accepted hc = 3";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  EXPECT_TRUE(c.usable());
}

TEST(Tuning, MhcclTuneWritesATableAtTp1ThatLoads) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!alone()) GTEST_SKIP() << "runs mhccl-tune itself: in a process of its own (gpu_tp1)";
  if (kTuneBin == nullptr) GTEST_SKIP() << "mhccl-tune not built (MHCCL_BUILD_TOOLS=OFF)";
  const std::string path = ::testing::TempDir() + "/mhccl-tune-written.json";
  std::remove(path.c_str());
  // A short sweep: powers of two to 256 rows, the plain variant.
  const Output out = run_command(std::string(kTuneBin) + " --tp 1 --quick --max-m 256 --variants plain --out " + path);
  std::fputs(out.text.c_str(), stdout);
  ASSERT_EQ(out.code, 0) << out.text;
  EXPECT_NE(out.text.find("wrote the table " + path), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("summary"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("measured again, over 18 (variant, op, M)"), std::string::npos) << out.text;  // 9 M x 2 ops
  const tuning::Table t = tuning::load_table(path);
  ASSERT_EQ(t.entries.size(), 1u);
  const tuning::Entry& e = t.entries[0];
  EXPECT_EQ(e.provenance, "measured");
  EXPECT_EQ(*e.p2p, "self");
  EXPECT_EQ(*e.tp, 1);
  const tuning::Match m = tuning::match(t, self_key());
  ASSERT_NE(m.entry, nullptr) << m.why;
  std::ifstream raw(path);
  std::stringstream text;
  text << raw.rdbuf();
  EXPECT_NE(text.str().find("\"measured_tuned_us\""), std::string::npos);  // the per-M comparison, in the table
  // Loading it: protocol_for follows its thresholds.
  AllReduceMHC op(*env().solo, self_test_config(256, path));
  const int64_t two = *e.settings.two_shot_min_rows, fin = *e.settings.two_shot_min_finalize_rows;
  EXPECT_EQ(op.config().two_shot_min_rows, two);
  EXPECT_EQ(op.config().two_shot_min_finalize_rows, fin);
  for (int64_t rows = 1; rows <= 256; ++rows) {
    EXPECT_EQ(op.protocol_for(rows, false), rows >= two ? Protocol::kTwoShot : Protocol::kOneShot) << rows;
    EXPECT_EQ(op.protocol_for(rows, true), rows >= fin ? Protocol::kTwoShot : Protocol::kOneShot) << rows;
  }
}

TEST(Tuning, MhcclTuneVerifyPassesAndFailsWithABrokenPath) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!alone()) GTEST_SKIP() << "runs mhccl-tune itself: in a process of its own (gpu_tp1)";
  if (kTuneBin == nullptr) GTEST_SKIP() << "mhccl-tune not built (MHCCL_BUILD_TOOLS=OFF)";
  const Output pass = run_command(std::string(kTuneBin) + " --tp 1 --verify");
  std::fputs(pass.text.c_str(), stdout);
  EXPECT_EQ(pass.code, 0) << pass.text;
  EXPECT_NE(pass.text.find("mhccl-tune --verify: PASSED"), std::string::npos) << pass.text;
  const Output fail = run_command("MHCCL_TEST_BREAK_PATH=two-shot " + std::string(kTuneBin) + " --tp 1 --verify");
  std::fputs(fail.text.c_str(), stdout);
  EXPECT_EQ(fail.code, 1) << fail.text;
  EXPECT_NE(fail.text.find("mhccl-tune --verify: FAILED"), std::string::npos) << fail.text;
  EXPECT_NE(fail.text.find("two-shot"), std::string::npos) << fail.text;
  EXPECT_EQ(fail.text.find("FAIL  call plain M=1 one-shot:"), std::string::npos) << fail.text;  // only the broken path
}

}  // namespace
}  // namespace mhccl::gputest
