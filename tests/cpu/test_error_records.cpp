// The host side of the kernels' error records (src/comm/communicator.cpp, kernels/params.h),
// driven here by writing the records as a kernel would: a timeout is never hidden by a route
// report nobody has read, timeouts make the communicator unusable, route reports reach
// check_errors() only and once, and peer_failed() (teardown without waiting) follows timeouts.
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

#include "comm/communicator_impl.h"
#include "mhccl/error.h"

namespace mhccl {
namespace {

using kernels::ErrorRecord;

// What record_error (lamport.cuh) leaves behind once it won the claim of record `slot`.
void kernel_records(ErrorRecord* records, int slot, uint32_t code, int peer, int64_t value) {
  ErrorRecord& r = records[slot];
  r.code = code;
  r.op = kernels::kOpAllReduceFinalize;
  r.protocol = kernels::kProtoOneShot;
  r.peer = peer;
  r.generation = 2;
  r.row = 7;
  r.value = value;
  r.ready = r.epoch + 1;
}

class ErrorRecords : public ::testing::Test {
 protected:
  ErrorRecord records[2] = {};
  Communicator::Impl im;
  void SetUp() override {
    im.rank = 0;
    im.tp = 2;
    im.record = records;
    im.options.wait_timeout_ms = 1000;
  }
  void TearDown() override { im.record = nullptr; }  // not pinned memory: nothing to free
  // What fallback_leave_kernel records when rank 1's identity of an M-row call carries one more
  // rejected call than this rank's (kProtoNccl: no generation; `call`: the op's fallback call).
  void fallback_divergence(int64_t m, uint32_t call) {
    kernel_records(records, kernels::kTimeoutRecord, kernels::kDivergence, /*peer*/ 1, 0);
    ErrorRecord& r = records[kernels::kTimeoutRecord];
    r.protocol = kernels::kProtoNccl;
    r.call = call;
    const kernels::CallIdentity host = kernels::with_op_serial(
        kernels::make_call_identity(kernels::kOpAllReduceCall, kernels::kProtoNccl, 0, static_cast<uint64_t>(m)), 2);
    r.mine = kernels::with_call_state(host, 0, 0);
    r.theirs = kernels::with_call_state(host, 0, 1);
  }
  // The Error check(report_routes) throws; none where it throws nothing.
  std::optional<Error> thrown_by_check(bool report_routes) {
    try {
      im.check(report_routes);
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  }
  ErrorCode check_code(bool report_routes) {
    const std::optional<Error> e = thrown_by_check(report_routes);
    return e ? e->code() : ErrorCode::kInvalidArgument;  // "no error" for these tests
  }
};

// A timeout record (fatal: timeouts, faults, divergences) of a kind the host does not know (0,
// or a newer kernel's) makes the communicator unusable. It is never a route report: from an
// op's call (check(false), which never reports routes) that would reject the call on this rank
// only, and the next call would become a divergence.
TEST_F(ErrorRecords, UnknownKindInTheTimeoutRecordIsFatalNotARouteReport) {
  for (const uint32_t code : {uint32_t{kernels::kNoError}, uint32_t{7}}) {
    records[kernels::kTimeoutRecord] = {};
    im.unusable = false;
    kernel_records(records, kernels::kTimeoutRecord, code, 1, 0);
    const std::optional<Error> e = thrown_by_check(false);
    const ErrorCode got = e ? e->code() : ErrorCode::kInvalidArgument;
    const std::string what = e ? e->what() : "";
    EXPECT_NE(got, ErrorCode::kInvalidRoute) << "code " << code << ": " << what;
    EXPECT_EQ(what.find("expanded_idx_to_permuted_idx"), std::string::npos) << what;
    EXPECT_TRUE(im.unusable) << "code " << code;
  }
}

// A record naming a peer outside [0, tp) (a corrupted or foreign record) names no rank.
TEST_F(ErrorRecords, PeerOutsideTheGroupIsNotNamedAsARank) {
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, 5, 0);
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "nothing thrown";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout);
  EXPECT_EQ(std::string(e->what()).find("waited for rank 5"), std::string::npos) << e->what();
  EXPECT_EQ(e->peer(), -1);
}

TEST_F(ErrorRecords, RouteReportsReachCheckErrorsOnlyAndOnce) {
  kernel_records(records, kernels::kRouteRecord, kernels::kBadRoute, -1, 1 << 20);
  EXPECT_NO_THROW(im.check(false));  // an op's own check leaves it
  EXPECT_FALSE(im.peer_failed());
  const std::optional<Error> e = thrown_by_check(true);
  ASSERT_TRUE(e.has_value()) << "no route report";
  EXPECT_EQ(e->code(), ErrorCode::kInvalidRoute);
  EXPECT_NE(std::string(e->what()).find("1048576"), std::string::npos) << e->what();
  EXPECT_NO_THROW(im.check(true));  // consumed
  EXPECT_EQ(records[kernels::kRouteRecord].epoch, 1u);
  EXPECT_TRUE(!im.unusable);
}

TEST_F(ErrorRecords, UnreadRouteReportDoesNotHideATimeout) {
  kernel_records(records, kernels::kRouteRecord, kernels::kBadRoute, -1, 99);
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, 1, 0);
  EXPECT_TRUE(im.peer_failed());         // teardown will not wait for peers
  EXPECT_EQ(check_code(false), ErrorCode::kPeerTimeout);  // an op's check sees it first
  EXPECT_TRUE(im.unusable);
  EXPECT_NE(im.unusable_reason.find("waited for rank 1"), std::string::npos) << im.unusable_reason;
  EXPECT_EQ(check_code(true), ErrorCode::kUnusable);
  EXPECT_TRUE(im.peer_failed());
}

TEST_F(ErrorRecords, NothingRecordedNothingThrown) {
  EXPECT_NO_THROW(im.check(false));
  EXPECT_NO_THROW(im.check(true));
  EXPECT_FALSE(im.peer_failed());
  records[kernels::kTimeoutRecord].ready = 5;  // a stale ready of an older epoch is not an error
  EXPECT_NO_THROW(im.check(true));
}

// Another rank timed out and raised the fault; a wait of this rank saw it (kPeerFault): the
// next op call throws kPeerTimeout naming the rank that timed out and the one it waited for, and
// the communicator is unusable from then on.
TEST_F(ErrorRecords, PeerFaultNamesTheRankThatTimedOut) {
  // The record of a fault seen: the rank that raised it, and its fault word (record_fault).
  kernel_records(records, kernels::kTimeoutRecord, kernels::kPeerFault, /*timed out*/ 1, kernels::fault_word(1, 0));
  EXPECT_TRUE(im.peer_failed());
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no fault reported";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout);
  EXPECT_NE(std::string(e->what()).find("rank 1 waited for rank 0"), std::string::npos) << e->what();
  EXPECT_EQ(e->peer(), 1);
  EXPECT_EQ(e->op(), "AllReduceMHC.finalize");
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
}

// A divergence this rank found (kDivergence, both identities in the record): kDivergence naming
// the peer and both identities; unusable from then on.
TEST_F(ErrorRecords, DivergenceNamesThePeerAndBothIdentities) {
  kernel_records(records, kernels::kTimeoutRecord, kernels::kDivergence, /*peer*/ 1, 0);
  records[kernels::kTimeoutRecord].call = 12;
  records[kernels::kTimeoutRecord].mine =
      kernels::with_call_state(kernels::make_call_identity(kernels::kOpAllReduceFinalize, kernels::kProtoOneShot, 0, 64), 2, 2);
  records[kernels::kTimeoutRecord].theirs =
      kernels::with_call_state(kernels::make_call_identity(kernels::kOpAllReduceFinalize, kernels::kProtoOneShot, 0, 64), 2, 3);
  EXPECT_TRUE(im.peer_failed());
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no divergence reported";
  EXPECT_EQ(e->code(), ErrorCode::kDivergence);
  const std::string msg = e->what();
  EXPECT_NE(msg.find("after 2 rejected calls"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 3 rejected calls"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rejected on one of these ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("call 12"), std::string::npos) << msg;
  EXPECT_EQ(e->peer(), 1);
  EXPECT_EQ(e->call_index(), 12);
  EXPECT_EQ(check_code(true), ErrorCode::kUnusable);
}

// A divergence the NCCL fallback's check found (kProtoNccl): named like the Lamport ones, at the
// op's fallback call count, with no generation or row (it has neither).
TEST_F(ErrorRecords, FallbackDivergenceNamesThePeerAndTheCall) {
  fallback_divergence(64, 9);
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no divergence reported";
  EXPECT_EQ(e->code(), ErrorCode::kDivergence);
  const std::string msg = e->what();
  EXPECT_NE(msg.find("(NCCL fallback, call 9)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rejected on one of these ranks"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("generation"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("row 7"), std::string::npos) << msg;
  EXPECT_EQ(e->peer(), 1);
  EXPECT_EQ(e->call_index(), 9);
  EXPECT_EQ(check_code(true), ErrorCode::kUnusable);
}

// The NCCL fallback's identity slot of a rank left empty (fallback_leave: kWaitTimeout, protocol
// NCCL): kPeerTimeout naming that rank and the op's fallback call, with no generation or row.
TEST_F(ErrorRecords, FallbackIdentityNotDeliveredNamesThePeerAndTheCall) {
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, /*peer*/ 1, 0);
  records[kernels::kTimeoutRecord].protocol = kernels::kProtoNccl;
  records[kernels::kTimeoutRecord].call = 5;
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout);
  const std::string msg = e->what();
  EXPECT_NE(msg.find("(NCCL fallback, call 5)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1's call identity did not arrive"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("generation"), std::string::npos) << msg;
  EXPECT_EQ(e->peer(), 1);
  EXPECT_EQ(e->call_index(), 5);
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
}

// The same where every slot was empty (no exchange happened): no rank is named.
TEST_F(ErrorRecords, FallbackExchangeThatNeverHappenedNamesNoRank) {
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, /*peer*/ -1, 0);
  records[kernels::kTimeoutRecord].protocol = kernels::kProtoNccl;
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout);
  const std::string msg = e->what();
  EXPECT_NE(msg.find("no rank's call identity (this rank's own neither) arrived"), std::string::npos) << msg;
  EXPECT_EQ(e->peer(), -1);
}

// A divergence recorded and the NCCL fallback's watchdog tripped (a later call left with no
// partner by it): the divergence, the cause, is what is reported; unusable after. The watchdog
// alone still reports kPeerTimeout.
TEST_F(ErrorRecords, DivergenceReportedBeforeTheWatchdogsTimeout) {
  im.watchdog_reason = "the NCCL fallback made no progress";
  im.watchdog_tripped = true;
  EXPECT_EQ(check_code(false), ErrorCode::kPeerTimeout);
  im.unusable = false;
  fallback_divergence(8, 0);
  EXPECT_EQ(check_code(false), ErrorCode::kDivergence);
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
}

// A peer's fault (here a divergence another rank found) or this rank's own wait that gave up,
// recorded, and the watchdog tripped after (a later fallback call with no partner; a graph user
// sees both at one check_errors()): the record, which names the cause and the rank, is reported.
TEST_F(ErrorRecords, PeerFaultAndWaitTimeoutReportedBeforeTheWatchdogsTimeout) {
  im.owns_comm = true;  // the watchdog aborted mhccl's own NCCL communicator (below: a caller's)
  kernel_records(records, kernels::kTimeoutRecord, kernels::kPeerFault, 1, kernels::fault_word(1, 0, true));
  im.watchdog_reason = "the NCCL fallback made no progress";
  im.watchdog_tripped = true;
  std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kDivergence) << e->what();
  EXPECT_EQ(e->peer(), 1) << e->what();
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);

  im.unusable = false;
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, 1, 0);
  e = thrown_by_check(true);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout) << e->what();
  EXPECT_EQ(e->peer(), 1) << e->what();
  EXPECT_NE(std::string(e->what()).find("rank 1"), std::string::npos) << e->what();
  EXPECT_EQ(std::string(e->what()).find("made no progress"), std::string::npos) << e->what();

  // The record an abort itself leaves (the fallback's identity not delivered) comes after the
  // watchdog's timeout, its cause.
  im.unusable = false;
  kernel_records(records, kernels::kTimeoutRecord, kernels::kWaitTimeout, 1, 0);
  records[kernels::kTimeoutRecord].protocol = kernels::kProtoNccl;
  e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kPeerTimeout) << e->what();
  EXPECT_NE(std::string(e->what()).find("made no progress"), std::string::npos) << e->what();

  // A caller's NCCL communicator, which the watchdog does not abort: its reason (which tells the
  // caller to abort it) stays beside the record reported first, and in every later error.
  im.unusable = false;
  im.owns_comm = false;
  im.watchdog_reason = "the NCCL fallback made no progress (it is the caller's: abort it)";
  kernel_records(records, kernels::kTimeoutRecord, kernels::kPeerFault, 1, kernels::fault_word(1, 0, true));
  e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kDivergence) << e->what();
  EXPECT_NE(std::string(e->what()).find("abort it"), std::string::npos) << e->what();
  e = thrown_by_check(true);
  ASSERT_TRUE(e.has_value()) << "no error reported";
  EXPECT_EQ(e->code(), ErrorCode::kUnusable) << e->what();
  EXPECT_NE(std::string(e->what()).find("abort it"), std::string::npos) << e->what();
}

// A divergence another rank found, seen here as its fault: kDivergence naming that rank.
TEST_F(ErrorRecords, DivergenceFaultOfAnotherRankIsADivergence) {
  kernel_records(records, kernels::kTimeoutRecord, kernels::kPeerFault, 3, kernels::fault_word(3, 0, true));
  const std::optional<Error> e = thrown_by_check(false);
  ASSERT_TRUE(e.has_value()) << "no fault reported";
  EXPECT_EQ(e->code(), ErrorCode::kDivergence);
  EXPECT_NE(std::string(e->what()).find("rank 3 found that rank 0's contribution"), std::string::npos) << e->what();
}

// guarded_call (every op call): a call rejected before anything went out counts once on this
// rank and leaves it usable; one that failed after a launch makes the communicator unusable.
TEST_F(ErrorRecords, RejectedCallsCountAndFailuresAfterALaunchAreFatal) {
  EXPECT_EQ(im.rejected, 0u);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_THROW(im.guarded_call("AllReduceMHC.call", nullptr, [](bool&) { throw Error(ErrorCode::kInvalidArgument, "x"); }), Error);
    EXPECT_EQ(im.rejected, static_cast<uint32_t>(i));
    EXPECT_FALSE(im.unusable);
  }
  EXPECT_THROW(im.guarded_call("AllReduceMHC.call", nullptr, [](bool&) { throw std::bad_alloc(); }), std::bad_alloc);
  EXPECT_EQ(im.rejected, 4u);
  EXPECT_EQ(im.launched, 0u);  // none of them went out
  im.guarded_call("AllReduceMHC.call", nullptr, [](bool& launched) { launched = true; });  // a call that went through
  EXPECT_EQ(im.rejected, 4u);
  EXPECT_EQ(im.launched, 1u);
  EXPECT_THROW(im.guarded_call("AllReduceMHC.call", nullptr, [](bool& launched) {
                 launched = true;
                 throw Error(ErrorCode::kCuda, "launch of the consumer failed");
               }),
               Error);
  EXPECT_EQ(im.rejected, 4u);
  EXPECT_EQ(im.launched, 2u);  // it went out: a binding that sees its exception counts no rejection
  EXPECT_TRUE(im.unusable);
  EXPECT_NE(im.unusable_reason.find("after its first launch"), std::string::npos) << im.unusable_reason;
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
}

// Exceptions that are not mhccl::Error after a launch are as fatal as an Error (a review,
// 2026-12-05: the NCCL fallback's watchdog thread, started after the enter kernel, could throw
// std::system_error and leave the rank one NCCL call behind its peers with its rejected count
// unchanged, so that its next call's identity equaled its peers' previous one). Before a launch
// they count as a rejection, as an Error does.
TEST_F(ErrorRecords, ExceptionsNotOursAfterALaunchAreFatalToo) {
  EXPECT_THROW(im.guarded_call("AllReduceMHC.call", nullptr, [](bool&) { throw 7; }), int);
  EXPECT_EQ(im.rejected, 1u);
  EXPECT_FALSE(im.unusable);
  EXPECT_THROW(im.guarded_call("AllReduceMHC.call", nullptr, [](bool& launched) {
                 launched = true;  // the fallback's enter kernel went out
                 throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                         "std::thread (the fallback watchdog)");
               }),
               std::system_error);
  EXPECT_EQ(im.rejected, 1u);
  EXPECT_TRUE(im.unusable);
  EXPECT_NE(im.unusable_reason.find("std::thread (the fallback watchdog)"), std::string::npos) << im.unusable_reason;
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
}
TEST_F(ErrorRecords, ExceptionOfUnknownTypeAfterALaunchIsFatal) {
  EXPECT_THROW(im.guarded_call("LamportAllGather.gather", nullptr, [](bool& launched) {
                 launched = true;
                 throw 7;
               }),
               int);
  EXPECT_EQ(im.rejected, 0u);
  EXPECT_TRUE(im.unusable);
  EXPECT_NE(im.unusable_reason.find("unknown type"), std::string::npos) << im.unusable_reason;
}

// A fault word that cannot be read (here: no device, so the copy fails; on a GPU a sticky CUDA
// error) is a CUDA error naming the failure, not a fault (a review, 2026-12-05: it read as this
// rank's timeout of itself, "rank 0 waited for rank 0"); the word is unknown, so teardown waits
// for no peer.
TEST_F(ErrorRecords, AFaultWordThatCannotBeReadIsACudaErrorNotAPeerTimeout) {
  uint32_t word[2] = {0, 0};  // host memory: the device-to-host copy of it fails without a device
  im.fault_window.ptr = word;
  im.fault_window.plain = false;
  im.fault_window.peers = {word, word};
  const std::optional<Error> e = thrown_by_check(true);
  ASSERT_TRUE(e.has_value()) << "an unknown fault word reported nothing";
  EXPECT_EQ(e->code(), ErrorCode::kCuda) << e->what();
  EXPECT_NE(std::string(e->what()).find("reading this rank's fault word failed ("), std::string::npos) << e->what();
  EXPECT_EQ(std::string(e->what()).find("waited for rank 0"), std::string::npos) << e->what();
  EXPECT_TRUE(im.unusable);
  EXPECT_TRUE(im.peer_failed());  // teardown waits for no peer
  im.fault_window = {};
}

// Teardown's watch (watch_teardown): where a fallback call was made, the watchdog's thread runs
// through a teardown's device synchronization even with options.watchdog off, and is stopped
// after it (at once: a stop ends its sleep), so that it does not watch the op calls that follow
// (a review, 2026-12-05). With the option on it is the thread the calls started, and stays.
TEST_F(ErrorRecords, TeardownWatchesOnlyWhereAFallbackCallWasMadeAndStopsAfterIt) {
  im.options.wait_timeout_ms = 30000;  // the thread looks every second
  im.options.watchdog = false;
  EXPECT_FALSE(im.watch_teardown());  // no fallback call: nothing to watch
  EXPECT_FALSE(im.watchdog.joinable());
  im.fallback_ran = true;
  EXPECT_TRUE(im.watch_teardown());
  EXPECT_TRUE(im.watchdog.joinable());
  const auto t0 = std::chrono::steady_clock::now();
  im.unwatch_teardown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));  // not the 1 s sleep
  EXPECT_FALSE(im.watchdog.joinable());
  // Two teardowns at once (on two threads): the thread runs until the last is synchronized (a
  // review, 2026-12-05: the first stopped it under the second).
  EXPECT_TRUE(im.watch_teardown());
  EXPECT_TRUE(im.watch_teardown());
  im.unwatch_teardown();
  EXPECT_TRUE(im.watchdog.joinable());
  im.unwatch_teardown();
  EXPECT_FALSE(im.watchdog.joinable());
  // With the option on the thread is the calls': a teardown starts it where none runs yet and
  // leaves it running.
  im.options.watchdog = true;
  EXPECT_TRUE(im.watch_teardown());
  im.unwatch_teardown();
  EXPECT_TRUE(im.watchdog.joinable());
  EXPECT_TRUE(im.watch_teardown());
  im.unwatch_teardown();
  EXPECT_TRUE(im.watchdog.joinable());
  im.stop_watchdog();
  EXPECT_FALSE(im.watchdog.joinable());
}

// An op construction that fails after its agreement, with an exception of any type, leaves the
// communicator unusable naming it (a review, 2026-12-05: a std::bad_alloc there left it usable
// while its peers went on into the collective it left).
TEST_F(ErrorRecords, AFailureAfterTheAgreementOfAnyTypeIsFatal) {
  im.apart_after_agreement("AllReduceMHC", std::make_exception_ptr(std::bad_alloc()));
  EXPECT_TRUE(im.unusable);
  EXPECT_NE(im.unusable_reason.find("AllReduceMHC construction on rank 0 failed after the configuration agreement ("),
            std::string::npos)
      << im.unusable_reason;
  EXPECT_NE(im.unusable_reason.find("bad_alloc"), std::string::npos) << im.unusable_reason;
  EXPECT_EQ(check_code(false), ErrorCode::kUnusable);
  im.apart_after_agreement("LamportAllGather", std::make_exception_ptr(7));  // the first reason stays
  EXPECT_EQ(im.unusable_reason.find("LamportAllGather"), std::string::npos) << im.unusable_reason;
}

TEST(FaultWord, EncodesTheRaisingRankThePeerAndTheKind) {
  for (int a = 0; a < kernels::kMaxTp; ++a) {
    for (int b = 0; b < kernels::kMaxTp; ++b) {
      for (const bool divergence : {false, true}) {
        const uint32_t w = kernels::fault_word(a, b, divergence);
        EXPECT_NE(w, 0u);  // 0 means "no fault"
        EXPECT_EQ(kernels::fault_timed_out_rank(w), a);
        EXPECT_EQ(kernels::fault_waited_for(w), b);
        EXPECT_EQ(kernels::fault_is_divergence(w), divergence);
      }
    }
  }
}

// The configuration agreement (Communicator::Impl::agree) modelled over several ranks: each
// rank's words, their elementwise max (what ncclMax gives every rank), and each rank's verdict.
std::vector<std::string> agree_model(const std::vector<comm::ConfigFields>& ranks, const std::vector<bool>& valid) {
  std::vector<int> reduced;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<int> w = comm::agreement_words(ranks[r], valid[r]);
    if (reduced.empty()) reduced = w;
    for (size_t i = 0; i < w.size(); ++i) reduced[i] = std::max(reduced[i], w[i]);
  }
  std::vector<std::string> verdicts;
  for (size_t r = 0; r < ranks.size(); ++r) {
    verdicts.push_back(comm::agreement_error("AllReduceMHC", static_cast<int>(r), ranks[r], reduced));
  }
  return verdicts;
}

comm::ConfigFields config_fields(int64_t capacity, int64_t two_shot, int64_t hidden = 5120) {
  return {{"hidden_size", hidden}, {"max_num_tokens", capacity}, {"two_shot_min_rows", two_shot}, {"hc_mult", 4}};
}

TEST(ConfigAgreement, SameConfigurationAgrees) {
  for (const int tp : {1, 2, 4, 8}) {
    const std::vector<comm::ConfigFields> ranks(tp, config_fields(256, std::numeric_limits<int64_t>::max()));
    for (const std::string& v : agree_model(ranks, std::vector<bool>(tp, true))) EXPECT_EQ(v, "") << "tp=" << tp;
  }
}

TEST(ConfigAgreement, EveryRankNamesTheFieldThatDiffers) {
  // Rank 1 with another max_num_tokens, then another two-shot threshold (64-bit values whose
  // high halves alone differ: 2^32 against 2^33), at TP = 2 and 4.
  for (const int tp : {2, 4}) {
    for (const int field : {1, 2}) {
      std::vector<comm::ConfigFields> ranks(tp, config_fields(256, int64_t{1} << 32));
      if (field == 1) ranks[1] = config_fields(512, int64_t{1} << 32);
      else ranks[1] = config_fields(256, int64_t{1} << 33);
      const char* name = field == 1 ? "max_num_tokens" : "two_shot_min_rows";
      const std::vector<std::string> v = agree_model(ranks, std::vector<bool>(tp, true));
      for (int r = 0; r < tp; ++r) {
        EXPECT_NE(v[r].find(name), std::string::npos) << "tp=" << tp << " rank " << r << ": " << v[r];
        EXPECT_EQ(v[r].find(field == 1 ? "two_shot_min_rows" : "max_num_tokens"), std::string::npos) << v[r];
        EXPECT_NE(v[r].find("rank " + std::to_string(r)), std::string::npos) << v[r];
      }
    }
  }
}

TEST(ConfigAgreement, OneInvalidRankFailsEveryRank) {
  // Rank 2's configuration failed its own check: it rethrows its error, the others say why they throw.
  const std::vector<comm::ConfigFields> ranks(4, config_fields(256, 384));
  const std::vector<std::string> v = agree_model(ranks, {true, true, false, true});
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(v[r].find("another rank's configuration is invalid"), std::string::npos) << r << ": " << v[r];
  }
}

TEST(ConfigAgreement, NegativeAndExtremeValuesCompareExactly) {
  for (const int64_t a : {int64_t{-1}, int64_t{0}, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    for (const int64_t b : {int64_t{-1}, int64_t{0}, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
      const std::vector<comm::ConfigFields> ranks = {config_fields(256, a), config_fields(256, b)};
      const std::vector<std::string> v = agree_model(ranks, {true, true});
      EXPECT_EQ(v[0].empty(), a == b) << a << " vs " << b << ": " << v[0];
      EXPECT_EQ(v[1].empty(), a == b);
    }
  }
}

// The header the agreement exchanges first (PROTOCOL.md, I20), modelled over 2-8 ranks: ranks
// building the same op agree; ranks building different ops (or another field list) all get the
// error naming the kinds, from an all-reduce of one size on every rank.
std::vector<std::string> header_model(const std::vector<std::pair<const char*, comm::ConfigFields>>& ranks) {
  std::vector<int> reduced;
  for (const auto& r : ranks) {
    const std::vector<int> w = comm::agreement_words(comm::agreement_header(r.first, r.second), true);
    if (reduced.empty()) reduced = w;
    EXPECT_EQ(w.size(), reduced.size());  // one count whatever the op
    for (size_t i = 0; i < w.size(); ++i) reduced[i] = std::max(reduced[i], w[i]);
  }
  std::vector<std::string> verdicts;
  for (size_t r = 0; r < ranks.size(); ++r) {
    verdicts.push_back(comm::agreement_header_error(ranks[r].first, static_cast<int>(r), reduced));
  }
  return verdicts;
}

TEST(AgreementHeader, DifferentOpsRaiseOnEveryRankNamingTheKinds) {
  const comm::ConfigFields all_reduce = config_fields(256, 384);
  const comm::ConfigFields gather = {{"rank_capacity_bytes", 1 << 20}, {"MHCCL_ALLGATHER_PACKS_PER_CTA", 0}};
  for (const int tp : {2, 4, 8}) {
    std::vector<std::pair<const char*, comm::ConfigFields>> same(tp, {"AllReduceMHC", all_reduce});
    for (const std::string& v : header_model(same)) EXPECT_EQ(v, "") << "tp=" << tp;
    for (int odd = 0; odd < tp; ++odd) {
      auto ranks = same;
      ranks[odd] = {"LamportAllGather", gather};
      const std::vector<std::string> v = header_model(ranks);
      for (int r = 0; r < tp; ++r) {
        EXPECT_NE(v[r].find("AllReduceMHC"), std::string::npos) << v[r];
        EXPECT_NE(v[r].find("LamportAllGather"), std::string::npos) << v[r];
        EXPECT_NE(v[r].find("rank " + std::to_string(r)), std::string::npos) << v[r];
      }
    }
    // The same op with another field list (another version of the library on one rank).
    auto other = same;
    comm::ConfigFields more = all_reduce;
    more.push_back({"a field one rank has", 1});
    other[tp - 1] = {"AllReduceMHC", more};
    for (const std::string& v : header_model(other)) EXPECT_NE(v.find("the same kind of AllReduceMHC"), std::string::npos) << v;
  }
}

// The NCCL fallback's watchdog decides from the progress counts alone: stuck once the counts
// are unequal and unchanged for longer than the budget; idle or progressing never.
TEST(FallbackWatch, StuckOnlyWhenAnOperationMadeNoProgressForTheBudget) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  Communicator::Impl::FallbackWatch w;
  EXPECT_FALSE(w.stuck(0, 0, at(0), 100));
  EXPECT_FALSE(w.stuck(5, 5, at(500), 100));   // idle, however long
  EXPECT_FALSE(w.stuck(6, 5, at(510), 100));   // an operation entered: the clock starts
  EXPECT_FALSE(w.stuck(6, 5, at(600), 100));   // 90 ms
  EXPECT_TRUE(w.stuck(6, 5, at(611), 100));    // 101 ms without progress
  EXPECT_FALSE(w.stuck(7, 6, at(612), 100));   // progress: starts again
  EXPECT_FALSE(w.stuck(8, 6, at(700), 100));   // more entered (graph replays queue up): progress too
  EXPECT_FALSE(w.stuck(8, 7, at(790), 100));
  EXPECT_TRUE(w.stuck(8, 7, at(891), 100));
}

}  // namespace
}  // namespace mhccl
