// The host side of the kernels' error records (src/comm/communicator.cpp, kernels/params.h),
// driven here by writing the records as a kernel would: a timeout is never hidden by a route
// report nobody has read, timeouts make the communicator unusable, route reports reach
// check_errors() only and once, and peer_failed() (teardown without waiting) follows timeouts.
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
  ErrorCode check_code(bool report_routes) {
    try {
      im.check(report_routes);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInvalidArgument;  // "no error" for these tests
  }
};

TEST_F(ErrorRecords, RouteReportsReachCheckErrorsOnlyAndOnce) {
  kernel_records(records, kernels::kRouteRecord, kernels::kBadRoute, -1, 1 << 20);
  EXPECT_NO_THROW(im.check(false));  // an op's own check leaves it
  EXPECT_FALSE(im.peer_failed());
  try {
    im.check(true);
    ADD_FAILURE() << "no route report";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidRoute);
    EXPECT_NE(std::string(e.what()).find("1048576"), std::string::npos) << e.what();
  }
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

}  // namespace
}  // namespace mhccl
