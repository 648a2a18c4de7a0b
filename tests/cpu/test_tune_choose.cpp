// mhccl-tune's model of what a choice runs at M (tools/tune/choose.cpp): which measured time it
// predicts for each path and streaming setting, and the choice of thresholds from them. Pure host
// code: the timings here are made up, the rules are the library's (kernels::consumer_streams).
#include <limits>
#include <map>

#include <gtest/gtest.h>

#include "kernels/launch.h"
#include "kernels/params.h"
#include "tune/tune.h"

namespace mhccl::tune {
namespace {

TEST(TuneModel, AutomaticStreamingAsTheLibraryRunsIt) {
  static_assert(kAutoStreamRows == kernels::kPollStreamingMinRows, "the model's rule is the library's");
  PathTimes t;
  t.t[0][0] = 10;  // one-shot, CTA per row
  t.t[0][1] = 9;   // one-shot, streaming
  t.t[1][0] = 8;   // two-shot, CTA-per-row consumer
  t.t[1][1] = 12;  // two-shot, one launch with roles (streaming_min_rows set)
  t.two_shot_auto = 5;
  const int64_t resident = 132;
  const Choice auto_two{1, std::numeric_limits<int64_t>::max(), -1}, never{1, std::numeric_limits<int64_t>::max(), 0},
      asked{1, std::numeric_limits<int64_t>::max(), 2}, auto_one{std::numeric_limits<int64_t>::max(),
                                                                 std::numeric_limits<int64_t>::max(), -1};
  // Two-shot, automatic: the CTA-per-row consumer below kAutoStreamRows, the three-kernel shape
  // with the streaming consumer from it (the roles' launch only when streaming_min_rows is set).
  EXPECT_EQ(predicted_us(auto_two, kAutoStreamRows - 1, t, resident), 8);
  EXPECT_EQ(predicted_us(auto_two, kAutoStreamRows, t, resident), 5);
  EXPECT_EQ(predicted_us(never, kAutoStreamRows, t, resident), 8);
  EXPECT_EQ(predicted_us(asked, kAutoStreamRows, t, resident), 12);
  // Not measured (a sweep below kAutoStreamRows): the CTA-per-row time.
  PathTimes u = t;
  u.two_shot_auto = -1;
  EXPECT_EQ(predicted_us(auto_two, kAutoStreamRows, u, resident), 8);
  // One-shot, automatic: streaming from kAutoStreamRows.
  EXPECT_EQ(predicted_us(auto_one, kAutoStreamRows - 1, t, resident), 10);
  EXPECT_EQ(predicted_us(auto_one, kAutoStreamRows, t, resident), 9);
  EXPECT_TRUE(streams_at(auto_two, 1, kAutoStreamRows, resident));
  EXPECT_FALSE(streams_at(auto_two, 1, kAutoStreamRows - 1, resident));
}

// With the automatic two-shot the fastest path from kAutoStreamRows, the choice keeps the
// automatic streaming (not the roles' launch, slower) and moves those M onto the two-shot.
TEST(TuneModel, ChoiceUsesTheAutomaticTwoShot) {
  std::map<int64_t, PathTimes> times[2];
  for (int op = 0; op < 2; ++op) {
    for (const int64_t m : {int64_t{512}, kAutoStreamRows, int64_t{2048}}) {
      PathTimes& t = times[op][m];
      t.t[0][0] = 2.0 * m;
      t.t[0][1] = m >= kAutoStreamRows ? 1.5 * m : 2.5 * m;
      t.t[1][0] = 2.2 * m;  // the CTA-per-row consumer: slower than the one-shot
      t.t[1][1] = 1.9 * m;
      if (m >= kAutoStreamRows) t.two_shot_auto = 1.0 * m;
    }
  }
  const int64_t never = std::numeric_limits<int64_t>::max();
  const Choice defaults[2] = {{never, never, -1}, {never, never, -1}};
  const Tuned r = choose(times, defaults, false, 132);
  for (const Choice& c : {r.call, r.finalize}) {
    EXPECT_EQ(c.streaming, -1);
    // Below kAutoStreamRows the one-shot (2.0 a row) beats the two-shot (2.2); from it the
    // automatic two-shot (1.0) beats the streaming one-shot (1.5) and the roles' launch (1.9).
    EXPECT_EQ(c.two_shot, kAutoStreamRows);
  }
  EXPECT_LT(r.score, r.default_score);
}

}  // namespace
}  // namespace mhccl::tune
