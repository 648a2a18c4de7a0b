// A host model of the Lamport protocols' generation and reset logic (docs/PROTOCOL.md), run
// under random interleavings of every rank's stores, polls and resets. Each call k writes tag k;
// the checks: a store never lands on a slot still holding data (not yet reset), a poll only ever
// completes on its own call's tag, and no interleaving deadlocks. With two generations instead
// of three the same model fails, so the test can fail.
#include <algorithm>
#include <cstddef>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/params.h"

namespace mhccl {
namespace {

enum Buffer { kLL = 0, kBT = 1, kReduced = 2 };

struct Model {
  int tp, generations;
  std::vector<int> rows;  // M of each call, the same sequence on every rank
  int two_shot_min;
  bool contributions_reset_by_consumer = true;  // as the code: the consumer, the call's last kernel
  bool reset_current_rows = false;              // negative control: reset with this call's M
  // slot -> tag of the call that wrote it; absent = sentinel.
  std::map<std::tuple<int, int, int, int, int>, int> slots;  // rank, buffer, gen, src, row

  struct Action {
    enum Kind { kStore, kReset, kPoll } kind;
    int rank, buffer, gen, src, row;  // the slot
    int needs_row = -1;               // store waits until this owned row's polls are done
  };
  struct RankState {
    int call = 0;
    int phase = 0;
    std::vector<Action> pending;
    std::map<int, int> polled;  // owned row -> polls done (two-shot owner)
    int calls_ll = 0, calls_bt = 0, prev_ll = 0, prev_bt = 0;
  };
  std::vector<RankState> ranks;
  std::string violation;

  bool two_shot(int k) const { return rows[k] >= two_shot_min; }
  int owned(int m, int r) const { return m > r ? (m - r + tp - 1) / tp : 0; }

  void start_phase(int r) {
    RankState& s = ranks[r];
    s.pending.clear();
    s.polled.clear();
    if (s.call >= static_cast<int>(rows.size())) return;
    const int k = s.call, m = rows[k];
    const bool bt = two_shot(k);
    const int calls = bt ? s.calls_bt : s.calls_ll;
    const int gen = calls % generations, prev = (calls + generations - 1) % generations;
    const int prev_rows = reset_current_rows ? m : (bt ? s.prev_bt : s.prev_ll);
    auto add = [&](Action::Kind kind, int rank, int buf, int g, int src, int row, int needs = -1) {
      s.pending.push_back(Action{kind, rank, buf, g, src, row, needs});
    };
    if (!bt) {
      if (s.phase == 0) {  // publish: every row into every rank's slot [gen][r]
        for (int d = 0; d < tp; ++d) for (int row = 0; row < m; ++row) add(Action::kStore, d, kLL, gen, r, row);
      } else {             // consume: reset k-1's slots, poll all tp slots of every row
        if (calls > 0) for (int src = 0; src < tp; ++src) for (int row = 0; row < prev_rows; ++row)
          add(Action::kReset, r, kLL, prev, src, row);
        for (int src = 0; src < tp; ++src) for (int row = 0; row < m; ++row) add(Action::kPoll, r, kLL, gen, src, row);
      }
    } else {
      if (s.phase == 0) {  // publish: row -> its owner's slot [gen][r][row / tp]
        for (int row = 0; row < m; ++row) add(Action::kStore, row % tp, kBT, gen, r, row / tp);
      } else if (s.phase == 1) {  // owner reduce: reset, poll owned rows, store sums everywhere
        if (calls > 0 && !contributions_reset_by_consumer)
          for (int src = 0; src < tp; ++src) for (int j = 0; j < owned(prev_rows, r); ++j)
            add(Action::kReset, r, kBT, prev, src, j);
        for (int j = 0; j < owned(m, r); ++j) {
          for (int src = 0; src < tp; ++src) add(Action::kPoll, r, kBT, gen, src, j);
          for (int d = 0; d < tp; ++d) add(Action::kStore, d, kReduced, gen, 0, j * tp + r, j);
        }
      } else {  // consume: reset k-1's reduced rows, poll every reduced row
        if (calls > 0) for (int row = 0; row < prev_rows; ++row) add(Action::kReset, r, kReduced, prev, 0, row);
        if (calls > 0 && contributions_reset_by_consumer)
          for (int src = 0; src < tp; ++src) for (int j = 0; j < owned(prev_rows, r); ++j)
            add(Action::kReset, r, kBT, prev, src, j);
        for (int row = 0; row < m; ++row) add(Action::kPoll, r, kReduced, gen, 0, row);
      }
    }
  }

  // Moves rank r past every finished phase (a phase may have nothing to do at all).
  void advance(int r) {
    RankState& s = ranks[r];
    while (s.pending.empty() && s.call < static_cast<int>(rows.size())) {
      const int k = s.call;
      if (s.phase < (two_shot(k) ? 2 : 1)) {
        ++s.phase;
      } else {
        if (two_shot(k)) { ++s.calls_bt; s.prev_bt = rows[k]; }
        else { ++s.calls_ll; s.prev_ll = rows[k]; }
        ++s.call;
        s.phase = 0;
      }
      start_phase(r);
    }
  }

  bool enabled(const RankState& s, const Action& a) const {
    if (a.kind == Action::kPoll) return slots.count({a.rank, a.buffer, a.gen, a.src, a.row}) > 0;
    if (a.kind == Action::kStore && a.needs_row >= 0) {
      auto it = s.polled.find(a.needs_row);
      return it != s.polled.end() && it->second == tp;
    }
    return true;
  }

  // Runs one interleaving; false with `violation` set on a broken invariant or a deadlock.
  bool run(std::mt19937_64& rng) {
    ranks.assign(tp, RankState{});
    slots.clear();
    for (int r = 0; r < tp; ++r) { start_phase(r); advance(r); }
    for (;;) {
      std::vector<std::pair<int, int>> choices;
      bool all_done = true;
      for (int r = 0; r < tp; ++r) {
        RankState& s = ranks[r];
        if (s.call >= static_cast<int>(rows.size())) continue;
        all_done = false;
        for (int i = 0; i < static_cast<int>(s.pending.size()); ++i) {
          if (enabled(s, s.pending[i])) choices.push_back({r, i});
        }
      }
      if (all_done) {
        // Every slot left holds the last call of its protocol (the one no later call resets):
        // anything else was never reset (a store over it would come three calls later).
        int last_ll = -1, last_bt = -1;
        for (int k = 0; k < static_cast<int>(rows.size()); ++k) (two_shot(k) ? last_bt : last_ll) = k;
        for (const auto& [key, tag] : slots) {
          const int buffer = std::get<1>(key);
          if (tag != (buffer == kLL ? last_ll : last_bt)) {
            violation = "slot of call " + std::to_string(tag) + " never reset";
            return false;
          }
        }
        return true;
      }
      if (choices.empty()) {
        violation = "deadlock";
        return false;
      }
      const auto [r, i] = choices[rng() % choices.size()];
      RankState& s = ranks[r];
      const Action a = s.pending[i];
      s.pending.erase(s.pending.begin() + i);
      const auto key = std::make_tuple(a.rank, a.buffer, a.gen, a.src, a.row);
      const int k = s.call;
      if (a.kind == Action::kStore) {
        if (slots.count(key)) {
          violation = "rank " + std::to_string(r) + " call " + std::to_string(k) +
                      " stored over unreset data of call " + std::to_string(slots[key]);
          return false;
        }
        slots[key] = k;
      } else if (a.kind == Action::kReset) {
        slots.erase(key);
      } else {
        if (slots[key] != k) {
          violation = "rank " + std::to_string(r) + " call " + std::to_string(k) +
                      " read data of call " + std::to_string(slots[key]);
          return false;
        }
        if (a.buffer == kBT) s.polled[a.row] += 1;
      }
      advance(r);
    }
  }
};

std::string run_many(int tp, int generations, int schedules, uint64_t seed, bool reset_current_rows = false,
                     bool contributions_reset_by_consumer = true) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < schedules; ++i) {
    Model m;
    m.tp = tp;
    m.generations = generations;
    m.two_shot_min = 4;
    m.reset_current_rows = reset_current_rows;
    m.contributions_reset_by_consumer = contributions_reset_by_consumer;
    for (int k = 0; k < 24; ++k) m.rows.push_back(1 + static_cast<int>(rng() % 6));
    if (!m.run(rng)) return m.violation;
  }
  return "";
}

TEST(ProtocolModel, ThreeGenerationsHoldUnderRandomInterleavings) {
  ASSERT_EQ(kernels::kGenerations, 3);
  for (int tp : {2, 4, 8}) {
    EXPECT_EQ(run_many(tp, kernels::kGenerations, tp == 8 ? 60 : 300, 7 + tp), "") << "tp=" << tp;
  }
}

TEST(ProtocolModel, TwoGenerationsFail) {
  // The negative control: resetting the previous call's slots needs a third generation, since
  // a peer one call ahead already stores into the next one.
  EXPECT_NE(run_many(2, 2, 300, 11), "");
}

// The same model fails where a call resets with its own M instead of the previous call's (the
// state's prev_rows): the end-state check then finds slots never reset.
TEST(ProtocolModel, ResetWithThisCallsRowsFails) {
  EXPECT_NE(run_many(2, 3, 300, 13, /*reset_current_rows=*/true), "");
}
// The code resets the two-shot contributions in the consumer (PROTOCOL.md I4); resetting them in
// the owners' phase, as the model once did, holds too.
TEST(ProtocolModel, OwnerResettingContributionsHoldsToo) {
  for (int tp : {2, 4}) EXPECT_EQ(run_many(tp, 3, 200, 17 + tp, false, false), "") << tp;
}
// --- The NCCL fallback's pairing (PROTOCOL.md I19) ---------------------------------------------
// A model of the fallback's calls: the ranks run one program of calls over a communicator's ops
// (two all-reduce ops of one configuration and an all-gather), each rank with its own
// perturbations (a step rejected on it alone, a step rejected on every rank, another M at a
// step, two unlike neighbouring steps swapped); a rank's NCCL sequence is its calls that were not
// rejected, each carrying the identity the kernels compute (the same constexpr functions). NCCL
// pairs the ranks' calls by their place. The promise checked: at every place before the first
// whose identities differ (where every rank records kDivergence), the ranks have made the same
// sequence of calls as the library sees them (each call's op, kind, variant and M, or that it
// was rejected), so no call returns another call's data without an error; a rank left with
// calls past the shortest sequence waits (the watchdog's kPeerTimeout). (Sequences that agree so
// far may still pair different steps of the program, where perturbations made one rank's calls
// look like another's: the caller's data then differs, not the calls.) Not modelled: a rank making
// a call its peers never make with the same arguments, which no identity finds (I19).
struct FallbackStep {
  int op;          // 0, 1: AllReduceMHC ops (same configuration); 2: the all-gather
  uint32_t kind;   // kernels::OpKind
  uint32_t variant;
  uint64_t m;
};
struct FallbackCall {
  kernels::CallIdentity id;
  int step;
  size_t history;  // the rank's calls so far (rejected ones too), this one included
};
using FallbackEvent = std::tuple<int, uint32_t, uint32_t, uint64_t, bool>;  // op, kind, variant, M, rejected

// "" when the promise holds for one random program and perturbation; else what broke it.
// `with_serial`, `with_rejected` false: the identity without the op's serial number, or without
// the rejected count (the negative controls).
std::string fallback_pairing_once(int tp, uint64_t seed, bool with_serial, bool with_rejected = true) {
  std::mt19937_64 rng(seed);
  const int steps = 12;
  std::vector<FallbackStep> program;
  for (int i = 0; i < steps; ++i) {
    const int op = static_cast<int>(rng() % 3);
    const uint32_t kind = op == 2 ? kernels::kOpAllGather
                                  : (rng() % 2 ? kernels::kOpAllReduceCall : kernels::kOpAllReduceFinalize);
    program.push_back({op, kind, op == 2 ? 0u : static_cast<uint32_t>(rng() % 4), 1 + rng() % 3});
  }
  // Every rank's sequence of NCCL calls, with its perturbations.
  std::vector<std::vector<FallbackCall>> seq(tp);
  std::vector<std::vector<FallbackEvent>> events(tp);
  const int everywhere = static_cast<int>(rng() % (steps + 1));  // a step rejected on every rank (steps: none)
  for (int r = 0; r < tp; ++r) {
    std::vector<int> order(steps);
    for (int i = 0; i < steps; ++i) order[i] = i;
    std::vector<bool> rejected(steps, false);
    std::vector<uint64_t> m(steps);
    for (int i = 0; i < steps; ++i) m[i] = program[i].m;
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) {  // 0-2 perturbations on this rank
      const int at = static_cast<int>(rng() % steps);
      switch (rng() % 3) {
        case 0: rejected[at] = true; break;
        case 1: m[at] = program[at].m + 1 + rng() % 2; break;
        default: {
          // Two steps of the same op, kind, variant and M swapped are the same calls with the
          // data swapped (the caller's to get right, not a divergence): only unlike steps swap.
          const FallbackStep &a = program[order[at]], &b = program[order[(at + 1) % steps]];
          if (at + 1 < steps && (a.op != b.op || a.kind != b.kind || a.variant != b.variant || a.m != b.m)) {
            std::swap(order[at], order[at + 1]);
          }
        }
      }
    }
    uint32_t count = 0;  // this rank's rejected calls
    for (int i : order) {
      const FallbackStep& st = program[i];
      const bool rejects = i == everywhere || rejected[i];
      // A rejected call is only counted: its arguments never reach a peer.
      events[r].push_back(rejects ? FallbackEvent{-1, 0u, 0u, 0u, true} : FallbackEvent{st.op, st.kind, st.variant, m[i], false});
      if (rejects) {
        ++count;
        continue;
      }
      kernels::CallIdentity id = kernels::make_call_identity(st.kind, kernels::kProtoNccl, st.variant, m[i]);
      // Serials as Communicator::Impl::ops_agreed gives them: the communicator's agreement is 1.
      if (with_serial) id = kernels::with_op_serial(id, static_cast<uint32_t>(2 + st.op));
      seq[r].push_back({kernels::with_call_state(id, 0, with_rejected ? count : 0), i, events[r].size()});
    }
  }
  size_t places = seq[0].size();
  for (const auto& q : seq) places = std::min(places, q.size());
  for (size_t p = 0; p < places; ++p) {
    bool differ = false, other_history = false;
    const auto history_end = [&](int r) { return events[r].begin() + static_cast<std::ptrdiff_t>(seq[r][p].history); };
    for (int r = 1; r < tp; ++r) {
      differ |= !kernels::identity_equal(seq[r][p].id, seq[0][p].id);
      other_history |= !std::equal(events[r].begin(), history_end(r), events[0].begin(), history_end(0));
    }
    if (differ) return "";  // every rank records kDivergence here; nothing before was wrong
    if (other_history) {
      return "seed " + std::to_string(seed) + ", place " + std::to_string(p) + ": rank 0's step " +
             std::to_string(seq[0][p].step) + " paired after another sequence of calls, identities equal";
    }
  }
  return "";
}

TEST(FallbackPairingModel, EveryShiftedPairingIsFoundAtItsFirstPlace) {
  for (int tp : {2, 3, 4, 8}) {
    for (uint64_t seed = 0; seed < 20000; ++seed) {
      const std::string why = fallback_pairing_once(tp, seed * 8 + tp, true);
      ASSERT_EQ(why, "") << "tp=" << tp;
    }
  }
}

// The negative controls: without the op's serial number, two ops of one configuration called in
// swapped order on one rank pair with no identity differing; without the rejected count, a call
// rejected on one rank shifts the pairing unseen.
TEST(FallbackPairingModel, WithoutTheOpSerialOrTheRejectedCountShiftsPassUnseen) {
  int no_serial = 0, no_count = 0;
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    no_serial += !fallback_pairing_once(2, seed * 8 + 2, false).empty();
    no_count += !fallback_pairing_once(2, seed * 8 + 2, true, false).empty();
  }
  EXPECT_GT(no_serial, 0);
  EXPECT_GT(no_count, 0);
}

}  // namespace
}  // namespace mhccl
