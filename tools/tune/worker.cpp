// One rank of mhccl-tune: the sweep (every path that can serve each M, CUDA-graph timed, then
// the thresholds and launch shapes chosen from the timings), or --verify (tools/tune/verify.h).
// Rank 0 writes its result (the table's entries and the summary, JSON) for the parent.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/fill_random.h"
#include "common/group.h"
#include "common/mhc_harness.h"
#include "mhccl/all_reduce_mhc.h"
#include "mhccl/bootstrap.h"
#include "mhccl/communicator.h"
#include "mhccl/error.h"
#include "ops/tuning.h"
#include "tune/tune.h"
#include "tune/verify.h"

namespace mhccl::tune {
namespace {

using json = nlohmann::json;
using testing::CallBuffers;
using testing::Variant;
constexpr int64_t kNever = tuning::kNever;

Variant variant_of(const std::string& n) {
  return n == "mxfp8" ? Variant::kMxfp8 : n == "residual_only" ? Variant::kResidualOnly
         : n == "fp8" ? Variant::kFp8 : n == "fp8_ue8m0" ? Variant::kFp8Ue8m0 : Variant::kPlain;
}

// Random inputs of up to `rows` rows, filled on the device (as mhccl-bench's).
struct InputSets {
  std::vector<std::unique_ptr<CallBuffers>> sets;
  InputSets(int n, int64_t rows, int64_t h, int hc, int top_k, cudaStream_t s) {
    for (int i = 0; i < n; ++i) {
      sets.push_back(std::make_unique<CallBuffers>(rows, h, hc, top_k));
      CallBuffers& b = *sets.back();
      const uint64_t seed = 2000 + i;
      const size_t mh = static_cast<size_t>(rows * h);
      MHCCL_TEST_CUDA(testing::fill_random_bf16(b.x, mh, seed, 0.7f, s));
      MHCCL_TEST_CUDA(testing::fill_random_bf16(b.gemm2, mh * top_k, seed + 1, 1.0f, s));
      MHCCL_TEST_CUDA(testing::fill_random_f32(b.weights, rows * top_k, seed + 2, 0.0f, 0.3f, s));
      MHCCL_TEST_CUDA(testing::fill_random_routes(b.routes, rows, top_k, rows * top_k, seed + 3, s));
      MHCCL_TEST_CUDA(testing::fill_random_bf16(b.shared, mh, seed + 4, 0.5f, s));
      MHCCL_TEST_CUDA(testing::fill_random_bf16(b.residual, mh * hc, seed + 5, 1.0f, s));
      MHCCL_TEST_CUDA(testing::fill_random_f32(b.post, rows * hc, seed + 6, 0.0f, 2.0f, s));
      MHCCL_TEST_CUDA(testing::fill_random_f32(b.comb, rows * hc * hc, seed + 7, 0.0f, 0.5f, s));
      MHCCL_TEST_CUDA(testing::fill_random_f32(b.pre, rows * hc, seed + 8, 0.0f, 1.0f, s));
      MHCCL_TEST_CUDA(testing::fill_random_bf16(b.norm, h, seed + 9, 0.3f, s));
    }
    MHCCL_TEST_CUDA(cudaStreamSynchronize(s));
  }
  CallBuffers& operator[](int i) { return *sets[i % sets.size()]; }
};

testing::Problem shape_only(int64_t m, int64_t h, int hc, int tp, bool fin, int top_k, int64_t capacity) {
  testing::Problem p;
  p.m = m;
  p.h = h;
  p.hc = hc;
  p.tp = tp;
  p.top_k = top_k;
  p.finalize = fin;
  p.gemm2_rows = capacity * top_k;
  return p;
}

std::string rows_text(int64_t v) { return v == kNever ? "never" : std::to_string(v); }
json rows_json(int64_t v) { return v == kNever ? json("never") : json(v); }
const char* kPathNames[3] = {"one-shot", "two-shot", "nccl"};

struct Run {
  Options o;
  Communicator& comm;
  cudaStream_t stream;
  testing::Group g;
  testing::GroupTiming timing;
  int tp, rank;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  Run(const Options& opts, Communicator& c, cudaStream_t s) : o(opts), comm(c), stream(s), g(c, s), tp(c.tp()), rank(c.rank()) {}

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  template <class... A> void say(const char* fmt, A... a) {
    if (rank == 0) {
      std::printf(fmt, a...);
      std::fflush(stdout);
    }
  }

  AllReduceMHCConfig config(const std::string& variant, int64_t cap, int64_t streaming) const {
    AllReduceMHCConfig c;
    c.hidden_size = o.hidden;
    c.hc_mult = o.hc;
    c.top_k = o.top_k;
    c.max_num_tokens = cap;
    if (variant == "fp8" || variant == "fp8_ue8m0") {
      testing::build_quant(c, variant == "fp8" ? testing::Quant::kFp8 : testing::Quant::kFp8Ue8m0);
    } else {
      c.residual_only = true;
      testing::build_quant(c, testing::Quant::kMxfp8);
    }
    c.two_shot_min_rows = cap + 1;     // the one-shot mailbox holds every row ...
    c.two_shot_min_finalize_rows = 1;  // ... and two-shot is built
    c.lamport_self_test = tp == 1;
    c.streaming_min_rows = streaming;
    return c;
  }

  // An op as a user builds it for `variant` (its table key is that variant), whose automatic
  // choice takes the Lamport paths by the thresholds (TP=1: through the own mailbox).
  AllReduceMHCConfig user_config(const std::string& variant, int64_t cap) const {
    AllReduceMHCConfig c;
    c.hidden_size = o.hidden;
    c.hc_mult = o.hc;
    c.top_k = o.top_k;
    c.max_num_tokens = cap;
    if (variant == "fp8" || variant == "fp8_ue8m0") {
      testing::build_quant(c, variant == "fp8" ? testing::Quant::kFp8 : testing::Quant::kFp8Ue8m0);
    } else if (variant == "mxfp8") {
      testing::build_quant(c, testing::Quant::kMxfp8);
    } else if (variant == "residual_only") {
      c.residual_only = true;
    }
    c.lamport_self_test = tp == 1;
    c.lamport_self_test_auto = tp == 1;
    return c;
  }

  double time_op(AllReduceMHC& op, InputSets& sets, const std::string& variant, bool fin, int64_t m, Protocol proto,
                 int64_t cap) {
    const testing::Problem p = shape_only(m, o.hidden, o.hc, tp, fin, o.top_k, cap);
    const Variant v = variant_of(variant);
    return g.time_calls([&](int i) { testing::launch(op, p, v, proto, sets[i], comm.device(), stream); }, timing);
  }
};

// The launch shapes of the streaming call: publishers (call, finalize) and two-shot's reducers,
// timed on `variant` at the largest swept M (and 1024), through the variables the library reads
// at construction (set alike on every rank). Returns {call, finalize, reducers}. Each variant
// has its own: the best finalize publishers for plain (64 of 132 SMs on one H200) made mxfp8's
// finalize 5-8% slower from M = 1024 (its consumers quantize: fewer SMs left for them hurt more).
std::vector<int> tune_shapes(Run& r, InputSets& sets, int64_t cap, const std::string& variant, json& timings) {
  const tuning::Resolved dflt = tuning::resolve(AllReduceMHCConfig{}, tuning::Key{"", 0, "", "", r.tp}, {}, nullptr);
  std::vector<int> best = {dflt.publisher_ctas[0], dflt.publisher_ctas[1], dflt.reducer_ctas};
  std::vector<int64_t> ms = {cap};
  if (!r.o.quick && cap > 1024) ms.insert(ms.begin(), 1024);
  struct Knob {
    const char* name;
    const char* var;
    bool fin;
    Protocol proto;
    std::vector<int> values;
  };
  const std::vector<Knob> knobs = {
      {"publisher_ctas", "MHCCL_STREAM_PUBLISHERS", false, Protocol::kOneShot,
       r.o.quick ? std::vector<int>{8, 16, 32} : std::vector<int>{8, 12, 16, 24, 32, 48}},
      {"finalize_publisher_ctas", "MHCCL_STREAM_PUBLISHERS", true, Protocol::kOneShot,
       r.o.quick ? std::vector<int>{24, 40, 56} : std::vector<int>{16, 24, 32, 40, 48, 64}},
      {"reducer_ctas", "MHCCL_STREAM_REDUCERS", false, Protocol::kTwoShot,
       r.o.quick ? std::vector<int>{8, 16, 32} : std::vector<int>{8, 12, 16, 24, 32}},
  };
  for (size_t k = 0; k < knobs.size(); ++k) {
    const Knob& kn = knobs[k];
    std::vector<int> values = kn.values;
    if (std::find(values.begin(), values.end(), best[k]) == values.end()) values.push_back(best[k]);
    double best_sum = -1, default_sum = -1;
    for (const int v : values) {
      setenv(kn.var, std::to_string(v).c_str(), 1);
      double sum = 0;
      {
        AllReduceMHC op(r.comm, r.config(variant, cap, 1));
        for (const int64_t m : ms) {
          const double us = r.time_op(op, sets, variant, kn.fin, m, kn.proto, cap);
          sum += us;
          timings.push_back(json{{"op", kn.fin ? "finalize" : "call"}, {"variant", variant}, {"m", m},
                                 {"path", std::string(kPathNames[kn.proto == Protocol::kTwoShot ? 1 : 0])},
                                 {"streaming", true}, {kn.name, v}, {"us", us}});
        }
      }
      unsetenv(kn.var);
      r.say("    %-24s %3d: %9.2f us (sum over M)\n", kn.name, v, sum);
      if (v == dflt.publisher_ctas[0] && k == 0) default_sum = sum;
      if (v == dflt.publisher_ctas[1] && k == 1) default_sum = sum;
      if (v == dflt.reducer_ctas && k == 2) default_sum = sum;
      if (best_sum < 0 || sum < best_sum) {
        best_sum = sum;
        best[k] = v;
      }
    }
    r.say("    %s: %d (%.1f%% below the default's)\n", kn.name, best[k],
          default_sum > 0 ? 100.0 * (default_sum - best_sum) / default_sum : 0.0);
  }
  return best;
}

// An entry's "thresholds" object of a call and a finalize choice (one streaming threshold, the call's).
json thresholds_json(const Choice& call, const Choice& finalize) {
  return {{"two_shot_min_rows", rows_json(call.two_shot)},
          {"two_shot_min_finalize_rows", rows_json(finalize.two_shot)},
          {"nccl_min_rows", rows_json(call.nccl)},
          {"nccl_min_finalize_rows", rows_json(finalize.nccl)},
          {"streaming_min_rows", call.streaming}};
}

int run_tune(Run& r) {
  const Options& o = r.o;
  const int64_t cap = o.max_rows;
  const std::vector<int64_t> ms = swept_rows(cap, o.quick);
  const bool nccl = r.tp > 1;
  cudaDeviceProp prop{};
  MHCCL_TEST_CUDA(cudaGetDeviceProperties(&prop, r.comm.device()));
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  const std::string nccl_text = std::to_string(nccl_version / 10000) + "." + std::to_string(nccl_version / 100 % 100) +
                                "." + std::to_string(nccl_version % 100);
  if (r.tp > 1 && !r.comm.peers_reachable()) {
    r.say("mhccl-tune: peers are not load/store reachable: every call runs the NCCL fallback; nothing to tune\n");
    return 0;
  }
  const std::vector<std::string> variants = o.variants.empty() ? variants_for(o.hidden) : o.variants;
  r.say("mhccl-tune: TP=%d%s, H=%lld hc=%d top_k=%d, %zu variants, M = 1 .. %lld (%zu sizes), paths: one-shot and "
        "two-shot, streaming off and on%s; CUDA graphs of %d calls, median of %d\n",
        r.tp, r.tp == 1 ? " (the own mailbox)" : "", (long long)o.hidden, o.hc, o.top_k, variants.size(),
        (long long)cap, ms.size(), nccl ? ", NCCL + consumer" : "", r.timing.calls_per_graph, r.timing.repeats);
  InputSets sets(o.quick ? 2 : 3, cap, o.hidden, o.hc, o.top_k, r.stream);
  json entries = json::array(), summary = json::array();
  tuning::Key key;
  key.gpu = prop.name;
  key.sms = prop.multiProcessorCount;
  key.p2p = tuning::p2p_key(r.tp, r.comm.peers_reachable(), true);
  key.nccl = nccl_text;
  key.tp = r.tp;
  key.hidden = o.hidden;
  key.hc = o.hc;
  key.top_k = o.top_k;
  for (const std::string& variant : variants) {
    key.variant = variant;
    const tuning::Resolved dflt = tuning::resolve(AllReduceMHCConfig{}, key, {}, nullptr);
    std::map<int64_t, PathTimes> times[2];
    json timings = json::array();
    for (const int streaming : {0, 1}) {
      AllReduceMHC op(r.comm, r.config(variant, cap, streaming));
      for (const bool fin : {false, true}) {
        for (const int64_t m : ms) {
          PathTimes& t = times[fin][m];
          for (int p = 0; p < (nccl ? 3 : 2); ++p) {
            const Protocol proto = p == 0 ? Protocol::kOneShot : p == 1 ? Protocol::kTwoShot : Protocol::kNccl;
            const double us = r.time_op(op, sets, variant, fin, m, proto, cap);
            t.t[p][streaming] = us;
            timings.push_back(json{{"op", fin ? "finalize" : "call"}, {"m", m}, {"path", kPathNames[p]},
                                   {"streaming", streaming == 1}, {"us", us}});
          }
        }
        r.say("  [%6.1fs] %-13s %-8s streaming %-3s: %s\n", r.elapsed(), variant.c_str(), fin ? "finalize" : "call",
              streaming ? "on" : "off", [&] {
                std::string s;
                for (const int64_t m : ms) {
                  char b[64];
                  std::snprintf(b, sizeof b, "%s%lld:%.1f/%.1f", s.empty() ? "" : " ", (long long)m,
                                times[fin][m].t[0][streaming], times[fin][m].t[1][streaming]);
                  s += b;
                }
                return s + " (M:one-shot/two-shot us)";
              }().c_str());
      }
    }
    // The two-shot's automatic shape from kAutoStreamRows rows (publish, owners looping, the
    // streaming consumer with no roles): neither of the two above, and what the defaults run there.
    if (cap >= kAutoStreamRows) {
      AllReduceMHC op(r.comm, r.config(variant, cap, -1));
      for (const bool fin : {false, true}) {
        for (const int64_t m : ms) {
          if (m < kAutoStreamRows) continue;
          const double us = r.time_op(op, sets, variant, fin, m, Protocol::kTwoShot, cap);
          times[fin][m].two_shot_auto = us;
          timings.push_back(json{{"op", fin ? "finalize" : "call"}, {"m", m}, {"path", "two-shot"},
                                 {"streaming", true}, {"shape", "automatic"}, {"us", us}});
        }
      }
    }
    const Choice defaults[2] = {{dflt.cfg.two_shot_min_rows, dflt.cfg.nccl_min_rows, dflt.cfg.streaming_min_rows},
                                {dflt.cfg.two_shot_min_finalize_rows, dflt.cfg.nccl_min_finalize_rows,
                                 dflt.cfg.streaming_min_rows}};
    const int64_t resident = prop.multiProcessorCount;
    Tuned tuned = choose(times, defaults, o.allow_nccl && nccl, resident);
    json shape_timings = json::array();
    std::vector<int> shapes;
    if (o.shapes) {
      r.say("  [%6.1fs] launch shapes of the streaming call (%s, M = %lld):\n", r.elapsed(), variant.c_str(),
            (long long)cap);
      shapes = tune_shapes(r, sets, cap, variant, shape_timings);
    }
    json thresholds = thresholds_json(tuned.call, tuned.finalize);
    json key_json = {{"gpu", key.gpu}, {"sms", key.sms}, {"p2p", key.p2p}, {"nccl", key.nccl}, {"tp", key.tp},
                     {"hidden", key.hidden}, {"hc", key.hc}, {"variant", variant}, {"top_k", key.top_k}};
    json launch = json::object();
    if (!shapes.empty()) {
      launch = {{"publisher_ctas", shapes[0]}, {"finalize_publisher_ctas", shapes[1]}, {"reducer_ctas", shapes[2]}};
    }
    // The entry against the defaults, measured again: the automatic choice of an op that loads the
    // entry from a table (as a user's op does) and of one on the built-in defaults, alternated at
    // each M. The choice above is no slower on the sweep's timings by construction; this says
    // whether it is so on the op a user runs, and keeps it so: where the entry is more than
    // kNoise slower at some M, it is measured again without its launch shapes, then with the
    // defaults' thresholds, and the first that is not (or else the least slow) is written.
    using Measured = std::array<std::map<int64_t, std::pair<double, double>>, 2>;  // [op] M -> (defaults, tuned) us
    auto measure = [&](const json& th, const json& ln) {
      Measured out;
      const std::string table_path = "/tmp/mhccl-tune-compare-" + std::to_string(getpid()) + ".json";
      json probe = {{"key", key_json}, {"provenance", "measured"}, {"thresholds", th}};
      if (!ln.empty()) probe["launch"] = ln;
      std::ofstream(table_path) << json{{"schema_version", tuning::kSchemaVersion}, {"entries", json::array({probe})}}.dump()
                                << "\n";
      AllReduceMHCConfig dc = r.user_config(variant, cap), tc = dc;
      tc.tuning_file = table_path;
      AllReduceMHC with_defaults(r.comm, dc), with_table(r.comm, tc);
      std::remove(table_path.c_str());
      if (with_table.tuning_source().find("tuning table") == std::string::npos) {
        r.say("  warning: the comparison's op did not take the entry: %s\n", with_table.tuning_source().c_str());
      }
      for (const bool fin : {false, true}) {
        for (const int64_t m : ms) {
          const double d = r.time_op(with_defaults, sets, variant, fin, m, Protocol::kAuto, cap);
          const double u = r.time_op(with_table, sets, variant, fin, m, Protocol::kAuto, cap);
          out[fin][m] = {d, u};
        }
      }
      return out;
    };
    struct Worst {
      double excess = 0;  // tuned / defaults - 1 where largest
      int op = 0;
      int64_t m = 0;
    };
    auto worst_of = [](const Measured& mm) {
      Worst w;
      for (int op = 0; op < 2; ++op) {
        for (const auto& [m, du] : mm[op]) {
          if (du.first > 0 && du.second / du.first - 1 > w.excess) w = {du.second / du.first - 1, op, m};
        }
      }
      return w;
    };
    Measured measured;
    std::string guard;  // what the re-measurement changed, if anything
    if (o.compare) {
      measured = measure(thresholds, launch);
      Worst w = worst_of(measured);
      r.say("  [%6.1fs] %-13s measured again: the entry's automatic choice against the defaults' at %zu M%s\n",
            r.elapsed(), variant.c_str(), ms.size(), w.excess > kNoise ? "" : ": no slower at any");
      auto retry = [&](const char* what, const json& th, const json& ln) {
        r.say("  [%6.1fs] %-13s %.1f%% slower than the defaults at %s M = %lld: measured again %s\n", r.elapsed(),
              variant.c_str(), 100 * w.excess, w.op ? "finalize" : "call", (long long)w.m, what);
        Measured again = measure(th, ln);
        const Worst wa = worst_of(again);
        if (wa.excess >= w.excess) return false;
        measured = again;
        w = wa;
        return true;
      };
      if (w.excess > kNoise && !launch.empty() && retry("without the launch shapes", thresholds, json::object())) {
        launch = json::object();
        guard = "launch shapes dropped (slower than the defaults' on the re-measurement)";
      }
      const json default_thresholds = thresholds_json(defaults[0], defaults[1]);
      if (w.excess > kNoise && thresholds != default_thresholds &&
          retry("with the defaults' thresholds", default_thresholds, launch)) {
        thresholds = default_thresholds;
        tuned.call = defaults[0];
        tuned.finalize = defaults[1];
        guard += std::string(guard.empty() ? "" : "; ") + "the defaults' thresholds kept (the tuned ones measured slower)";
      }
      if (!guard.empty()) r.say("  [%6.1fs] %-13s %s\n", r.elapsed(), variant.c_str(), guard.c_str());
    }
    // The gain, from the same measurements: the tuned choice's path at each M against the defaults'.
    json gain = json::array();
    for (int op = 0; op < 2; ++op) {
      const Choice& c = op ? tuned.finalize : tuned.call;
      for (const auto& [m, t] : times[op]) {
        const double d = predicted_us(defaults[op], m, t, resident), u = predicted_us(c, m, t, resident);
        auto path = [&](const Choice& x) {
          const int p = path_at(x, m);
          const bool streams = streams_at(x, p, m, resident);
          return std::string(kPathNames[p]) + (!streams ? "" : p == 1 && x.streaming < 0 ? " streaming consumer" : " streaming");
        };
        json row = {{"op", op ? "finalize" : "call"}, {"m", m}, {"default_path", path(defaults[op])},
                    {"default_us", d}, {"tuned_path", path(c)}, {"tuned_us", u}};
        if (const auto it = measured[op].find(m); it != measured[op].end()) {
          row["measured_default_us"] = it->second.first;
          row["measured_tuned_us"] = it->second.second;
        }
        gain.push_back(row);
      }
    }
    json entry = {
        {"key", key_json},
        {"mhccl", tuning::library_version()},
        {"provenance", "measured"},
        {"source", "mhccl-tune " + std::string(o.quick ? "--quick " : "") + "on " + std::to_string(r.tp) + " x " +
                       key.gpu + ", NCCL " + nccl_text + (r.tp == 1 ? ", through the own mailbox (lamport_self_test)" : "")},
        {"thresholds", thresholds},
        {"defaults", {{"two_shot_min_rows", rows_json(defaults[0].two_shot)},
                      {"two_shot_min_finalize_rows", rows_json(defaults[1].two_shot)},
                      {"streaming_min_rows", defaults[0].streaming}}},
        {"score", {{"tuned", tuned.score}, {"defaults", tuned.default_score},
                   {"what", "sum over op and M of time / the fastest measured path's time"}}},
        {"timings", timings},
        {"gain", gain}};
    if (!launch.empty()) entry["launch"] = launch;
    if (!shape_timings.empty()) entry["launch_timings"] = shape_timings;
    if (!guard.empty()) entry["guard"] = guard;
    entries.push_back(entry);
    r.say("  [%6.1fs] %s: two-shot from %s (finalize %s), NCCL from %s (finalize %s), streaming_min_rows %lld "
          "(defaults: %s / %s, %lld)\n",
          r.elapsed(), variant.c_str(), rows_text(tuned.call.two_shot).c_str(), rows_text(tuned.finalize.two_shot).c_str(),
          rows_text(tuned.call.nccl).c_str(), rows_text(tuned.finalize.nccl).c_str(), (long long)tuned.call.streaming,
          rows_text(defaults[0].two_shot).c_str(), rows_text(defaults[1].two_shot).c_str(),
          (long long)defaults[0].streaming);
  }
  if (r.rank == 0 && !o.result_out.empty()) {
    std::ofstream(o.result_out) << json{{"entries", entries}, {"seconds", r.elapsed()}}.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

int run_worker(const Options& opts) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const RankEnvironment env = rank_environment();
  int count = 0;
  MHCCL_TEST_CUDA(cudaGetDeviceCount(&count));
  const int device = env.local_rank % count;
  MHCCL_TEST_CUDA(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  MHCCL_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int rc = 0;
  {
    Communicator comm(share_unique_id(env), env.rank, env.world_size, device);
    if (opts.verify) {
      VerifyOptions v;
      v.hidden = opts.hidden;
      v.hc = opts.hc;
      v.top_k = opts.top_k;
      v.variants = opts.variants;
      if (!opts.verify_ms.empty()) v.ms = opts.verify_ms;
      v.tuning_file = opts.tuning_file;
      // TEST ONLY: a path broken on purpose, so that --verify can be seen to fail (docs/TUNING.md).
      if (const char* b = std::getenv("MHCCL_TEST_BREAK_PATH")) v.break_path = b;
      if (!v.break_path.empty() && comm.rank() == 0) {
        std::printf("mhccl-tune: MHCCL_TEST_BREAK_PATH=%s: TEST ONLY, that path's output is corrupted on purpose\n",
                    v.break_path.c_str());
      }
      const VerifyResult r = verify(comm, stream, v);
      rc = r.ok ? 0 : 1;
      if (comm.rank() == 0 && !opts.result_out.empty()) {
        std::ofstream(opts.result_out) << json{{"ok", r.ok}, {"cases", r.cases}, {"failures", r.failures},
                                               {"first_failure", r.first_failure}}.dump() << "\n";
      }
    } else {
      Run run(opts, comm, stream);
      run.timing.calls_per_graph = opts.calls_per_graph;
      run.timing.repeats = opts.repeats;
      rc = run_tune(run);
    }
    testing::Group(comm, stream).barrier();
  }
  cudaStreamDestroy(stream);
  return rc;
}

}  // namespace mhccl::tune
