// mhccl-tune: measures the protocol thresholds and launch shapes of AllReduceMHC on this
// machine's GPUs and writes a tuning table (docs/TUNING.md); --verify is the deployment
// self-test (every path and variant against the CPU reference, the ranks' bits alike).
//   mhccl-tune                          every local GPU as one group (one GPU: TP=1, own mailbox)
//   mhccl-tune --quick --out t.json     a short sweep (powers of two to 1024 rows)
//   mhccl-tune --verify                 the self-test; exit 0 PASS, 1 FAIL, 2 no GPU / bad usage
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/devices.h"
#include "launch/cli.h"
#include "launch/launcher.h"
#include "mhccl/checks.h"
#include "mhccl/error.h"
#include "ops/tuning.h"
#include "tune/table.h"
#include "tune/tune.h"
#include "tune/verify.h"

using json = nlohmann::json;

namespace mhccl::tune {

std::vector<std::string> Options::worker_args() const {
  std::vector<std::string> a = {"--worker", "--hidden", std::to_string(hidden), "--hc", std::to_string(hc),
                                "--top-k", std::to_string(top_k), "--max-rows", std::to_string(max_rows),
                                "--repeats", std::to_string(repeats), "--calls-per-graph", std::to_string(calls_per_graph)};
  if (!variants.empty()) {
    std::string s;
    for (const auto& v : variants) s += (s.empty() ? "" : ",") + v;
    a.insert(a.end(), {"--variants", s});
  }
  if (quick) a.push_back("--quick");
  if (allow_nccl) a.push_back("--allow-nccl");
  if (!shapes) a.push_back("--no-shapes");
  if (!compare) a.push_back("--no-compare");
  if (verify) a.push_back("--verify");
  if (!verify_ms.empty()) {
    std::string s;
    for (const int64_t m : verify_ms) s += (s.empty() ? "" : ",") + std::to_string(m);
    a.insert(a.end(), {"--verify-ms", s});
  }
  if (!tuning_file.empty()) a.insert(a.end(), {"--tuning-file", tuning_file});
  return a;
}

namespace {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "mhccl-tune";
}

// Every (variant, op, M): the defaults' path and time against the chosen one's, on the sweep's
// timings and, where measured again (--no-compare not given), on the ops a user builds: one
// loading the entry, one on the built-in defaults. A measured row more than kNoise slower is
// flagged; the last line says how many (the tuned choice should be no slower at any swept M).
void print_summary(const json& entries) {
  std::printf("\nsummary: the chosen paths against the built-in defaults at every swept M, in us. 'sweep d/t': the\n"
              "sweep's timings of the defaults' and the tuned path; 'again d/t': the automatic choice of an op on the\n"
              "defaults and of one loading the entry, timed again, alternated; gain: of 'again' where measured;\n"
              "'*': the path differs\n");
  double worst = 0, best = 0, log_sum = 0, m_worst = 0, m_log_sum = 0;
  int n = 0, measured = 0, slower = 0;
  for (const json& e : entries) {
    const std::string variant = e["key"]["variant"];
    std::printf("  %s: two-shot from %s (finalize %s), streaming_min_rows %s; defaults %s (%s), %s\n", variant.c_str(),
                e["thresholds"]["two_shot_min_rows"].dump().c_str(), e["thresholds"]["two_shot_min_finalize_rows"].dump().c_str(),
                e["thresholds"]["streaming_min_rows"].dump().c_str(), e["defaults"]["two_shot_min_rows"].dump().c_str(),
                e["defaults"]["two_shot_min_finalize_rows"].dump().c_str(), e["defaults"]["streaming_min_rows"].dump().c_str());
    if (e.contains("launch")) {
      std::printf("    launch: publishers %d (call), %d (finalize), reducers %d\n", e["launch"].value("publisher_ctas", 0),
                  e["launch"].value("finalize_publisher_ctas", 0), e["launch"].value("reducer_ctas", 0));
    }
    if (e.contains("guard")) std::printf("    re-measured: %s\n", e["guard"].get<std::string>().c_str());
    std::printf("    %-8s %6s  %-22s %-22s %9s %9s  %9s %9s %7s\n", "op", "M", "default path", "tuned path",
                "sweep d", "sweep t", "again d", "again t", "gain");
    for (const json& g : e["gain"]) {
      const double d = g["default_us"], u = g["tuned_us"];
      const bool has_m = g.contains("measured_default_us");
      const double md = has_m ? g["measured_default_us"].get<double>() : -1;
      const double mu = has_m ? g["measured_tuned_us"].get<double>() : -1;
      const bool flagged = md > 0 && mu > md * (1 + kNoise);
      const double shown = md > 0 && mu > 0 ? 100.0 * (md - mu) / md : d > 0 && u > 0 ? 100.0 * (d - u) / d : 0.0;
      std::printf("    %-8s %6lld%s %-22s %-22s %9.2f %9.2f  %9.2f %9.2f %+6.1f%%%s\n", g["op"].get<std::string>().c_str(),
                  g["m"].get<long long>(), g["default_path"] != g["tuned_path"] ? "*" : " ",
                  g["default_path"].get<std::string>().c_str(), g["tuned_path"].get<std::string>().c_str(), d, u, md, mu,
                  shown, flagged ? "  SLOWER" : "");
      if (d > 0 && u > 0) {
        const double gain = 100.0 * (d - u) / d;
        worst = n == 0 ? gain : std::min(worst, gain);
        best = n == 0 ? gain : std::max(best, gain);
        log_sum += std::log(d / u);
        ++n;
      }
      if (md > 0 && mu > 0) {
        const double gain = 100.0 * (md - mu) / md;
        m_worst = measured == 0 ? gain : std::min(m_worst, gain);
        m_log_sum += std::log(md / mu);
        ++measured;
        slower += flagged;
      }
    }
  }
  if (n > 0) {
    std::printf("  sweep's timings, over %d (variant, op, M): gain over the defaults %+.1f%% (geometric mean), at most "
                "%+.1f%%, least %+.1f%% (never negative by construction)\n",
                n, 100.0 * (1 - std::exp(-log_sum / n)), best, worst);
  }
  if (measured > 0) {
    std::printf("  measured again, over %d (variant, op, M): gain over the defaults %+.1f%% (geometric mean), least "
                "%+.1f%%; slower by more than %.0f%% at %d: %s\n",
                measured, 100.0 * (1 - std::exp(-m_log_sum / measured)), m_worst, 100 * kNoise, slower,
                slower == 0 ? "the tuned choice is no slower than the defaults at any swept M"
                            : "see the rows marked SLOWER (noise, or a choice to revisit)");
  }
}

}  // namespace
}  // namespace mhccl::tune

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  mhccl::tune::Options o;
  bool worker = false;
  int tp = 0;
  std::vector<std::string> variants;
  std::string out = "mhccl-tuning.json";
  CLI::App app{"mhccl-tune: times every AllReduceMHC path that can serve each M on this machine's GPUs (one\n"
               "group of every local GPU; one GPU: TP=1 through its own mailbox) and writes a tuning table of\n"
               "thresholds and launch shapes (docs/TUNING.md). --verify: the deployment self-test."};
  app.footer("Exit: 0 the table written (--verify: every case passed); 1 the sweep failed (--verify: a case failed,\n"
             "the first printed with its reason); 2 a bad command line, no CUDA device (the reason printed), or\n"
             "the table could not be written.");
  app.set_version_flag("--version", std::string("mhccl-tune (mhccl ") + mhccl::tuning::library_version() + ")");
  app.add_option("--tp", tp, "ranks of the group, 1, 2, 4 or 8 (default: every local GPU, or the first 1, 2, 4 or 8 of them)")
      ->transform(mhccl::launch::decimal_digits())
      ->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--hidden", o.hidden, "H (default 5120)");
  app.add_option("--hc", o.hc, "hc (default 4)");
  app.add_option("--top-k", o.top_k, "top_k of finalize (default 6)");
  app.add_option("--variants", variants, "comma list of plain, mxfp8, residual_only, fp8, fp8_ue8m0 (default: all H allows)")
      ->delimiter(',');
  app.add_option("--max-rows,--max-m", o.max_rows, "the largest M swept, the ops' capacity (default 8192; --quick 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_flag("--quick", o.quick, "powers of two to 1024 rows, fewer repeats, fewer launch shapes");
  app.add_flag("--allow-nccl", o.allow_nccl,
               "let the table choose the NCCL path where faster (opt-in: NCCL waits for a dead peer without a budget)");
  bool no_shapes = false;
  app.add_flag("--no-shapes", no_shapes, "do not time the streaming call's publisher and reducer CTAs");
  bool no_compare = false;
  app.add_flag("--no-compare", no_compare,
               "do not time the chosen entry's automatic choice against the defaults' again after the sweep");
  app.add_option("--out", out, "the table to write (default ./mhccl-tuning.json; a table of this schema there keeps its entries of other "
                                "keys, another file is moved to OUT.bak)");
  app.add_option("--repeats", o.repeats, "timed repeats, the median is taken (default 11; --quick 5)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--calls-per-graph", o.calls_per_graph, "calls captured per CUDA graph (default 20; --quick 10)")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--verify", o.verify, "the self-test: every path and variant at a few M against the CPU reference, "
                                     "the ranks' bits against each other; exit 1 with the reason on a failure");
  app.add_option("--verify-ms", o.verify_ms, "--verify: comma list of M (default 1,7,97,300)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--tuning-file", o.tuning_file, "--verify: build the automatic path's op with this table");
  app.add_flag("--worker", worker, "internal: run as one rank (set by mhccl-launch)")->group("");
  app.add_option("--result-out", o.result_out, "internal: where rank 0 writes its result")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.shapes = !no_shapes;
  o.compare = !no_compare;
  if (o.max_rows <= 0) o.max_rows = o.quick ? 1024 : 8192;
  if (o.repeats <= 0) o.repeats = o.quick ? 5 : 11;
  if (o.calls_per_graph <= 0) o.calls_per_graph = o.quick ? 10 : 20;
  for (const std::string& v : variants) {  // each once: the table takes one entry a key
    if (!v.empty() && std::find(o.variants.begin(), o.variants.end(), v) == o.variants.end()) o.variants.push_back(v);
  }
  // The shape itself, as an op's construction checks it (H a positive multiple of 8, hc, top_k,
  // the capacity), before the variants H allows are named.
  try {
    mhccl::AllReduceMHCConfig shape;
    shape.hidden_size = o.hidden;
    shape.hc_mult = o.hc;
    shape.top_k = o.top_k;
    shape.max_num_tokens = o.max_rows;
    mhccl::check_all_reduce_mhc_config(shape, 1);
  } catch (const mhccl::Error& e) {
    std::fprintf(stderr, "mhccl-tune: --hidden %lld --hc %d --top-k %d --max-rows %lld: %s\n", (long long)o.hidden,
                 o.hc, o.top_k, (long long)o.max_rows, e.what());
    return 2;
  }
  const std::vector<std::string> allowed = mhccl::tune::variants_for(o.hidden);
  for (const std::string& v : o.variants) {
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::fprintf(stderr, "mhccl-tune: variant '%s' is not one H=%lld allows (%s)\n", v.c_str(), (long long)o.hidden,
                   [&] { std::string s; for (const auto& a : allowed) s += (s.empty() ? "" : ", ") + a; return s; }().c_str());
      return 2;
    }
  }
  for (int i = 0; i < argc; ++i) o.command += (i ? " " : "") + std::string(argv[i]);
  if (worker) {
    try {
      return mhccl::tune::run_worker(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mhccl-tune worker failed: %s\n", e.what());
      return 3;
    }
  }
  if (!o.verify && !mhccl::launch::can_write_file(out)) {  // before the sweep (minutes), not after it
    std::fprintf(stderr, "mhccl-tune: --out %s: cannot write there\n", out.c_str());
    return 2;
  }
  const mhccl::detail::DeviceCount devices = mhccl::detail::cuda_device_count();
  if (devices.count == 0) {
    std::fprintf(stderr, "mhccl-tune: no CUDA device (%s): it needs an NVIDIA GPU (sm_90+) with a driver\n",
                 devices.why_none.c_str());
    return 2;
  }
  if (tp == 0) {
    tp = mhccl::launch::supported_tp_at_most(devices.count);
    if (tp != devices.count) {
      std::printf("mhccl-tune: %d GPUs; TP=%d on the first %d (TP is 1, 2, 4 or 8)\n", devices.count, tp, tp);
    }
  }
  if (tp < 1 || tp > devices.count) {
    std::fprintf(stderr, "mhccl-tune: --tp %d needs %d GPUs, found %d\n", tp, tp, devices.count);
    return 2;
  }
  // The sweep times the defaults and its own shapes: variables that would move them are cleared
  // (the workers inherit this environment).
  for (const char* v : {"MHCCL_TUNING_FILE", "MHCCL_STREAMING_MIN_ROWS", "MHCCL_STREAM_PUBLISHERS", "MHCCL_STREAM_REDUCERS",
                        "MHCCL_CTAS_PER_ROW"}) {
    if (std::getenv(v) != nullptr) {
      std::printf("mhccl-tune: %s is set; cleared for the run\n", v);
      unsetenv(v);
    }
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  char path[] = "/tmp/mhccl-tune-result-XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  o.result_out = path;
  mhccl::launch::Options lo;
  lo.nprocs = tp;
  lo.prefix_output = tp > 1;
  lo.timeout_s = 3 * 3600;
  lo.argv = {mhccl::tune::self_exe()};
  for (const std::string& a : o.worker_args()) lo.argv.push_back(a);
  lo.argv.insert(lo.argv.end(), {"--result-out", path});
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("mhccl-tune %s on %d GPU(s), %s\n", o.verify ? "--verify" : "", tp, date);
  const mhccl::launch::Result r = mhccl::launch::run(lo);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream f(path);
  const json result = json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::remove(path);
  if (o.verify) {
    if (r.exit_code != 0 || !result.is_object() || !result.value("ok", false)) {
      std::printf("mhccl-tune --verify: FAILED (exit %d%s%s) in %.1f s\n", r.exit_code,
                  result.is_object() ? ": " : "", result.is_object() ? result.value("first_failure", "").c_str() : "",
                  seconds);
      return 1;
    }
    std::printf("mhccl-tune --verify: PASSED (%d cases) in %.1f s\n", result.value("cases", 0), seconds);
    return 0;
  }
  if (r.exit_code != 0 || !result.is_object()) {
    std::printf("mhccl-tune: the sweep failed (exit %d) after %.1f s\n", r.exit_code, seconds);
    return 1;
  }
  const json& entries = result["entries"];
  if (entries.empty()) {
    std::printf("mhccl-tune: nothing measured, no table written (%.1f s)\n", seconds);
    return 0;
  }
  mhccl::tune::print_summary(entries);
  const json table = mhccl::tune::merged_table(out, entries, o.command, date);
  if (!mhccl::launch::write_file(out, table.dump(1) + "\n")) {
    std::fprintf(stderr, "mhccl-tune: could not write the table to %s\n", out.c_str());
    return 2;
  }
  std::printf("\nmhccl-tune: wrote the table %s (%zu entries) in %.1f s; use it with AllReduceMHCConfig::tuning_file, "
              "tuning_file= (Python) or MHCCL_TUNING_FILE=%s\n",
              out.c_str(), entries.size(), seconds, out.c_str());
  return 0;
}
