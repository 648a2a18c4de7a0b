// The choice of thresholds from measured timings (tools/tune/tune.h).
#include <algorithm>
#include <limits>
#include <set>

#include "tune/tune.h"

namespace mhccl::tune {

namespace {
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
// The fastest measured path at one M (every shape timed there), < 0 where none was.
double fastest_us(const PathTimes& t) {
  double fastest = -1;
  auto take = [&](double v) {
    if (v > 0 && (fastest < 0 || v < fastest)) fastest = v;
  };
  for (const auto& row : t.t) {
    for (double v : row) take(v);
  }
  take(t.two_shot_auto);
  return fastest;
}
}

std::vector<int64_t> swept_rows(int64_t max_rows, bool quick) {
  std::vector<int64_t> ms;
  for (int64_t p = 1; p <= max_rows; p *= 2) {
    ms.push_back(p);
    if (!quick && p >= 2 && p + p / 2 <= max_rows) ms.push_back(p + p / 2);
  }
  if (ms.empty() || ms.back() != max_rows) ms.push_back(max_rows);
  std::sort(ms.begin(), ms.end());
  ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
  return ms;
}

int path_at(const Choice& c, int64_t m) { return m >= c.nccl ? 2 : m >= c.two_shot ? 1 : 0; }

bool streams_at(const Choice& c, int path, int64_t m, int64_t resident) {
  if (c.streaming == 0 || m <= 1) return false;
  if (c.streaming > 0) return m >= c.streaming;
  if (path == 0 || path == 1) return m >= kAutoStreamRows;
  return m > resident;
}

double predicted_us(const Choice& c, int64_t m, const PathTimes& t, int64_t resident) {
  const int p = path_at(c, m);
  const bool streams = streams_at(c, p, m, resident);
  if (p == 1 && c.streaming < 0) return streams && t.two_shot_auto > 0 ? t.two_shot_auto : t.t[1][0];
  return t.t[p][streams ? 1 : 0];
}

Tuned choose(const std::map<int64_t, PathTimes> times[2], const Choice defaults[2], bool allow_nccl, int64_t resident) {
  std::set<int64_t> rows;
  for (int op = 0; op < 2; ++op) {
    for (const auto& [m, t] : times[op]) rows.insert(m);
  }
  std::set<int64_t> streaming = {-1, 0, defaults[0].streaming};
  for (int64_t m : rows) {
    if (m > 1) streaming.insert(m);
  }
  // Per op and streaming threshold: the best (two-shot, NCCL) thresholds and their score, or a
  // negative score where no choice is feasible.
  auto best_for = [&](int op, int64_t s, Choice* out) {
    std::set<int64_t> two = {kNever, defaults[op].two_shot}, nccl = {kNever, defaults[op].nccl};
    for (int64_t m : rows) {
      two.insert(m);
      if (allow_nccl) nccl.insert(m);
    }
    double best = -1;
    for (int64_t n : nccl) {
      for (int64_t ts : two) {
        const Choice c{ts, n, s};
        double score = 0;
        bool ok = true;
        for (const auto& [m, t] : times[op]) {
          const double pred = predicted_us(c, m, t, resident);
          const double dflt = predicted_us(defaults[op], m, t, resident);
          const double fastest = fastest_us(t);
          if (pred <= 0 || (dflt > 0 && pred > dflt * (1 + 1e-12))) {
            ok = false;
            break;
          }
          score += pred / fastest;
        }
        if (ok && (best < 0 || score < best - 1e-9)) {
          best = score;
          *out = c;
        }
      }
    }
    return best;
  };
  Tuned r;
  r.call = defaults[0];
  r.finalize = defaults[1];
  // The defaults' own score first: a choice replaces them only when strictly better.
  for (int op = 0; op < 2; ++op) {
    for (const auto& [m, t] : times[op]) {
      const double fastest = fastest_us(t);
      const double d = predicted_us(defaults[op], m, t, resident);
      r.default_score += d > 0 ? d / fastest : 0;
    }
  }
  r.score = r.default_score;
  for (int64_t s : streaming) {
    Choice c0, c1;
    const double a = best_for(0, s, &c0);
    if (a < 0) continue;
    const double b = best_for(1, s, &c1);
    if (b < 0) continue;
    if (a + b < r.score - 1e-9) {
      r.score = a + b;
      r.call = c0;
      r.finalize = c1;
    }
  }
  return r;
}

}  // namespace mhccl::tune
