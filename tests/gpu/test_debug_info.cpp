// MHCCL_DEBUG=INFO on a GPU (the gpu_debug_info tests run these with it set; elsewhere they
// skip): every construction prints its decisions once, and the classes of M an AllReduceMHC
// prints cover 1..max_num_tokens and name the protocol protocol_for() gives.
#include <strings.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "mhccl/all_gather.h"
#include "mhccl/all_reduce_mhc.h"

namespace mhccl::gputest {
namespace {

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

bool info_requested() {
  const char* level = std::getenv("MHCCL_DEBUG");
  return level != nullptr && strcasecmp(level, "INFO") == 0;
}

// The "M a-b: text" lines of one section ("call (plain) by M:") of this rank's report.
struct MClass {
  int64_t from, to;
  std::string text;
};
std::vector<MClass> m_classes(const std::string& out, const std::string& prefix, const std::string& section) {
  std::vector<MClass> classes;
  std::istringstream lines(out);
  bool in = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const std::string body = line.substr(prefix.size());
    if (body.rfind("  M ", 0) != 0) {
      in = body == section;
      continue;
    }
    if (!in) continue;
    MClass c{};
    const size_t colon = body.find(": ");
    const std::string range = body.substr(4, colon - 4);
    const size_t dash = range.find('-');
    c.from = std::stoll(range.substr(0, dash));
    c.to = dash == std::string::npos ? c.from : std::stoll(range.substr(dash + 1));
    c.text = body.substr(colon + 2);
    classes.push_back(c);
  }
  return classes;
}

TEST(DebugInfo, EveryConstructionReportsItsDecisionsOnce) {
  if (!env().has_gpu) GTEST_SKIP() << "no CUDA device";
  if (!info_requested()) GTEST_SKIP() << "run by the gpu_debug_info tests, with MHCCL_DEBUG=INFO";
  Communicator& world = env().world ? *env().world : *env().solo;
  AllReduceMHCConfig cfg;  // DSV4.1: H = 5120, hc = 4
  cfg.max_num_tokens = 4096;
  cfg.lamport_self_test = world.tp() == 1;  // TP=1: the mailboxes too
  ::testing::internal::CaptureStderr();
  std::string out;
  {
    Communicator solo(Communicator::make_unique_id(), 0, 1, env().device);
    AllReduceMHC op(world, cfg);
    LamportAllGather ag(world, 1 << 20);
    out = ::testing::internal::GetCapturedStderr();
    std::fputs(out.c_str(), stdout);  // in the test's log

    const std::string solo_who = "mhccl INFO rank 0/1 cuda:" + std::to_string(env().device) + " Communicator: ";
    EXPECT_EQ(count(out, solo_who + "NCCL library "), 1) << out;
    EXPECT_EQ(count(out, solo_who + "peers load/store reachable: yes"), 1) << out;
    const std::string who = "mhccl INFO rank " + std::to_string(world.rank()) + "/" + std::to_string(world.tp()) +
                            " cuda:" + std::to_string(env().device);
    EXPECT_EQ(count(out, who + " AllReduceMHC: mailboxes a rank: "), 1) << out;
    EXPECT_EQ(count(out, who + " AllReduceMHC: grid: "), 1) << out;
    EXPECT_EQ(count(out, who + " LamportAllGather: capacity 1048576 bytes a rank"), 1) << out;
    for (const bool finalize : {false, true}) {
      const auto classes = m_classes(out, who + " AllReduceMHC: ", finalize ? "finalize (plain) by M:" : "call (plain) by M:");
      ASSERT_FALSE(classes.empty()) << out;
      int64_t next = 1;
      for (const MClass& c : classes) {
        EXPECT_EQ(c.from, next) << c.text;
        next = c.to + 1;
        const std::string proto = world.tp() == 1 ? "direct" : protocol_name(op.protocol_for(c.from, finalize));
        EXPECT_EQ(c.text.rfind(proto, 0), 0u) << "M " << c.from << ": " << c.text;
        if (world.tp() > 1) EXPECT_EQ(op.protocol_for(c.to, finalize), op.protocol_for(c.from, finalize));
      }
      EXPECT_EQ(next, cfg.max_num_tokens + 1);
    }
  }
}

}  // namespace
}  // namespace mhccl::gputest
