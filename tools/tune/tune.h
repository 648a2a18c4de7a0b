// mhccl-tune internals: the options shared by the CLI (parent) and the per-rank workers, and
// the choice of thresholds from measured timings (pure: the CPU tests drive it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/params.h"  // kPollStreamingMinRows

namespace mhccl::tune {

struct Options {
  int64_t hidden = 5120;
  int hc = 4;
  int top_k = 6;
  std::vector<std::string> variants;  // empty: every variant H allows
  int64_t max_rows = 0;               // 0: 8192 (--quick: 1024); --max-rows, --max-m
  bool quick = false;
  bool allow_nccl = false;  // let the table turn the NCCL path on (it waits for a dead peer without a budget)
  bool shapes = true;       // time the streaming call's publisher and reducer CTAs
  bool compare = true;      // time the chosen entry's automatic choice against the defaults' again
  int repeats = 0;          // 0: 11 (--quick: 5)
  int calls_per_graph = 0;  // 0: 20 (--quick: 10)
  bool verify = false;
  std::vector<int64_t> verify_ms;  // empty: 1, 7, 97, 300
  std::string tuning_file;         // --verify: the automatic path's table
  std::string result_out;          // worker: where rank 0 writes its result (JSON)
  std::string command;             // the parent's command line (recorded in the table)

  std::vector<std::string> worker_args() const;
};

// The rows swept: powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, ...), up
// to max_rows (and max_rows itself); --quick: powers of two only.
std::vector<int64_t> swept_rows(int64_t max_rows, bool quick);

// The measured time of one path at one M, us (< 0: not measured).
// path: "one-shot", "two-shot", "nccl"; streaming on or off.
struct PathTimes {
  double t[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};  // [one-shot, two-shot, nccl][streaming off, on]
  // The two-shot's automatic shape (streaming_min_rows -1, from kAutoStreamRows rows): publish,
  // the owners' reduce looping on its resident CTAs, the streaming consumer with no roles;
  // neither "off" (the CTA-per-row consumer) nor "on" (one launch with roles). < 0: not measured.
  double two_shot_auto = -1;
};

// From this many rows the automatic choice streams the one-shot and the two-shot's consumer.
inline constexpr int64_t kAutoStreamRows = kernels::kPollStreamingMinRows;

// A choice of the thresholds of one op kind (call or finalize) and the streaming threshold.
struct Choice {
  int64_t two_shot = 0;  // kNever for never
  int64_t nccl = 0;
  int64_t streaming = -1;
};

// The path a choice takes at M: 0 one-shot, 1 two-shot, 2 nccl; and whether it streams
// (the library's rule: streaming_min_rows 0 never, > 0 from it, -1 automatic: one-shot and the
// two-shot's consumer from kAutoStreamRows rows, the NCCL path's direct consumer beyond
// `resident` rows). predicted_us: the time of that path at M; for the two-shot's automatic
// shape, PathTimes::two_shot_auto (where it was not measured, the CTA-per-row time, "off").
int path_at(const Choice& c, int64_t m);
bool streams_at(const Choice& c, int path, int64_t m, int64_t resident);
double predicted_us(const Choice& c, int64_t m, const PathTimes& t, int64_t resident);

// The best thresholds for call and finalize with one streaming threshold between them: over
// candidates from the swept rows, the least sum over M of time / best time at that M, among the
// choices no slower than `defaults` at any swept M (the defaults are a candidate, so there is
// one). `times[op][m]`: op 0 call, 1 finalize.
struct Tuned {
  Choice call, finalize;
  double score = 0, default_score = 0;
};
Tuned choose(const std::map<int64_t, PathTimes> times[2], const Choice defaults[2], bool allow_nccl, int64_t resident);

// How much slower than the defaults' a re-measured row of an entry may be before it counts (two
// ops timed alternately on one GPU differ by up to about 2%): the summary marks such a row SLOWER,
// and the tuner measures a more conservative entry instead (worker.cpp).
inline constexpr double kNoise = 0.03;

// Runs this process as one rank (rank environment from mhccl-launch); returns the exit code.
int run_worker(const Options& opts);

}  // namespace mhccl::tune
