// mhccl-bench, the main job: over the GPUs of this machine, checks every op against the CPU
// reference, then times mhccl against NCCL baselines side by side and prints a table.
//   mhccl-bench                 every local GPU as one TP group, then TP=1
//   mhccl-bench --json out.json --tp 2 --ops allreduce,twoshot --quick
//   mhccl-bench --info          the environment report (versions, GPUs, P2P, variables); no GPU needed
//   mhccl-bench --nvtx-cost     the host cost of an op call's NVTX range; no GPU needed
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "common/devices.h"
#include "common/nvtx.h"
#include "launch/cli.h"
#include "launch/launcher.h"
#include "ops/tuning.h"
#include "mhccl/checks.h"
#include "mhccl/error.h"
#include "mhccl/info.h"

using json = nlohmann::json;

namespace mhccl::bench {

bool Options::wants(const std::string& op) const {
  if (ops.empty()) return op != "simulated";  // asked for by name only
  for (const std::string& o : ops) if (o == op) return true;
  return false;
}

std::vector<std::string> Options::worker_args() const {
  std::vector<std::string> a = {"--worker"};
  if (!ops.empty()) {
    std::string s;
    for (const auto& o : ops) s += (s.empty() ? "" : ",") + o;
    a.insert(a.end(), {"--ops", s});
  }
  if (!check) a.push_back("--no-check");
  if (!timing) a.push_back("--check-only");
  if (quick) a.push_back("--quick");
  if (!rows.empty()) {
    std::string s;
    for (const int64_t m : rows) s += (s.empty() ? "" : ",") + std::to_string(m);
    a.insert(a.end(), {"--rows", s});
  }
  a.insert(a.end(), {"--capacity-bytes", std::to_string(ag_capacity), "--calls-per-graph",
                     std::to_string(calls_per_graph), "--repeats", std::to_string(repeats)});
  return a;
}

std::vector<int64_t> Options::table_rows(std::vector<int64_t> own) const {
  if (!rows.empty()) own = rows;
  std::sort(own.begin(), own.end());
  own.erase(std::unique(own.begin(), own.end()), own.end());
  return own;
}

namespace {

std::string fmt(double v, int prec = 2) {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
double num(const json& r, const char* k) { return r.contains(k) && r[k].is_number() ? r[k].get<double>() : -1; }

void print_tables(const std::vector<json>& rows) {
  std::map<int, std::vector<json>> by_tp;
  for (const json& r : rows) {
    if (r.value("simulated", false)) continue;  // printed by the TP=1 worker itself, not a TP group's row
    by_tp[r["tp"].get<int>()].push_back(r);
  }
  for (auto& [tp, rs] : by_tp) {
    bool head = false;
    for (const json& r : rs) {
      if (r["op"] != "allgather") continue;
      if (!head) {
        std::printf("\nLamportAllGather, TP=%d\n  %10s %10s %16s %8s\n", tp, "bytes/rank", "mhccl us", "ncclAllGather us", "speedup");
        head = true;
      }
      const double b = num(r, "baseline_us"), u = num(r, "us_median");
      std::printf("  %10lld %10s %16s %8s\n", r["bytes"].get<long long>(), fmt(u).c_str(), fmt(b).c_str(),
                  b > 0 ? (fmt(b / u) + "x").c_str() : "-");
    }
    head = false;
    for (const json& r : rs) {
      const std::string op = r["op"];
      if (op.rfind("allreduce_mhc", 0) != 0 || r.contains("lamport_floor_us") || r.contains("separate_quant_us")) continue;
      if (!head) {
        std::printf("\nAllReduceMHC, TP=%d, H=%d, hc=%d\n  %-9s %-13s %5s %-9s %9s %14s %8s %9s %12s %8s\n", tp,
                    r["hidden"].get<int>(), r["hc"].get<int>(), "op", "variant", "M", "protocol", "mhccl us",
                    tp > 1 ? "nccl+cons. us" : "GB/s", tp > 1 ? "speedup" : "% copy", "floor us", "floor+epi us", "ratio");
        head = true;
      }
      const double u = num(r, "us_median"), b = num(r, "baseline_us"), f = num(r, "floor_us"), e = num(r, "epilogue_hbm_us");
      const std::string short_op = op.substr(op.find('.') + 1);
      if (tp > 1) {
        std::printf("  %-9s %-13s %5lld %-9s %9s %14s %8s %9s %12s %8s\n", short_op.c_str(),
                    r["variant"].get<std::string>().c_str(), r["m"].get<long long>(),
                    r["protocol"].get<std::string>().c_str(), fmt(u).c_str(), fmt(b).c_str(),
                    b > 0 ? (fmt(b / u) + "x").c_str() : "-", fmt(f).c_str(), f > 0 ? fmt(f + e).c_str() : "-",
                    f > 0 ? fmt(u / (f + e)).c_str() : "-");
      } else {
        const double gbps = num(r, "hbm_gbps");
        double copy = -1;
        for (const json& q : rs) if (q["op"] == "bandwidth") copy = num(q, "copy_gbps");
        std::printf("  %-9s %-13s %5lld %-9s %9s %14s %8s\n", short_op.c_str(), r["variant"].get<std::string>().c_str(),
                    r["m"].get<long long>(), "tp1", fmt(u).c_str(), fmt(gbps, 0).c_str(),
                    copy > 0 ? fmt(100 * gbps / copy, 0).c_str() : "-");
      }
    }
    head = false;
    for (const json& r : rs) {
      if (!r.contains("lamport_floor_us") || r["protocol"] != "one-shot") continue;
      if (!head) {
        std::printf("\nOne-shot vs two-shot vs NCCL all-reduce + consumer, TP=%d, plain\n  %-9s %5s %10s %10s %13s %10s %10s %10s\n",
                    tp, "op", "M", "one-shot", "two-shot", "nccl+cons.", "best/nccl", "lamport fl", "bw floor");
        head = true;
      }
      double two = -1, bw2 = -1;
      for (const json& q : rs) {
        if (q.contains("lamport_floor_us") && q["op"] == r["op"] && q["m"] == r["m"] && q["protocol"] == "two-shot") {
          two = num(q, "us_median");
          bw2 = num(q, "bandwidth_floor_us");
        }
      }
      const double one = num(r, "us_median"), nccl = num(r, "baseline_us");
      const std::string op = r["op"];
      std::printf("  %-9s %5lld %10s %10s %13s %10s %10s %10s\n", op.substr(op.find('.') + 1).c_str(),
                  r["m"].get<long long>(), fmt(one).c_str(), fmt(two).c_str(), fmt(nccl).c_str(),
                  (fmt(nccl / std::min(one, two > 0 ? two : one)) + "x").c_str(),
                  fmt(num(r, "lamport_floor_us")).c_str(), fmt(bw2).c_str());
    }
    head = false;
    for (const json& r : rs) {
      if (!r.contains("separate_quant_us")) continue;
      if (!head) {
        std::printf("\nFP8 layer input, TP=%d: fused vs plain + a separate quantization kernel\n  %-9s %-9s %5s %-9s %9s %9s %9s %12s %9s %8s\n",
                    tp, "op", "variant", "M", "protocol", "fused us", "plain us", "extra us", "plain+kernel", "kernel us",
                    "speedup");
        head = true;
      }
      const std::string op = r["op"];
      const double u = num(r, "us_median"), b = num(r, "baseline_us");
      std::printf("  %-9s %-9s %5lld %-9s %9s %9s %9s %12s %9s %8s\n", op.substr(op.find('.') + 1).c_str(),
                  r["variant"].get<std::string>().c_str(), r["m"].get<long long>(),
                  r["protocol"].get<std::string>().c_str(), fmt(u).c_str(), fmt(num(r, "plain_us")).c_str(),
                  fmt(u - num(r, "plain_us")).c_str(), fmt(b).c_str(), fmt(num(r, "separate_quant_us")).c_str(),
                  (fmt(b / u) + "x").c_str());
    }
    for (const json& r : rs) {
      if (r["op"] == "memory") {
        std::printf("\nTP=%d mailboxes per rank: %.1f MiB (capacity %lld rows, H=%d)\n", tp,
                    num(r, "mailbox_bytes") / 1048576.0, r["m"].get<long long>(), r["hidden"].get<int>());
      }
    }
  }
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "mhccl-bench";
}

std::string machine_json(json& meta) {
  int n = 0;
  cudaGetDeviceCount(&n);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0, runtime = 0, nccl = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  meta["gpus"] = n;
  meta["gpu"] = prop.name;
  meta["sms"] = prop.multiProcessorCount;
  meta["cuda_driver"] = driver;
  meta["cuda_runtime"] = runtime;
  meta["nccl"] = nccl;
  std::ostringstream o;
  o << n << " x " << prop.name << " (" << prop.multiProcessorCount << " SMs), CUDA driver " << driver
    << ", runtime " << runtime << ", NCCL " << nccl;
  return o.str();
}

// --nvtx-cost: the host time of the NVTX range every op call opens (src/common/nvtx.h), as this
// process runs it: without a profiler (the default), or under one (nsys profile --trace=nvtx
// mhccl-bench --nvtx-cost), against the same loop without the range. The calls' own A/B on a
// GPU: eager calls of a build with -DMHCCL_NVTX=OFF against the default build.
int nvtx_cost() {
  using Clock = std::chrono::steady_clock;
#if MHCCL_NVTX
  const bool attached = mhccl::detail::nvtx::attached();
#else
  const bool attached = false;
#endif
  const int64_t n = attached ? 200000 : 20000000;
  volatile int64_t sink = 0;
  auto per_call_ns = [&](bool with_range) {
    const Clock::time_point t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      if (with_range) {
        mhccl::detail::nvtx::Range range(mhccl::detail::nvtx::Kind::kCall, i, [&] {
          return mhccl::detail::nvtx::call_name("call", "one-shot", i);
        });
        sink = sink + i;
      } else {
        sink = sink + i;
      }
    }
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
  };
  per_call_ns(true);  // the first range initializes NVTX (and loads a profiler's injection)
  double with = 1e30, without = 1e30;
  for (int r = 0; r < 5; ++r) {
    with = std::min(with, per_call_ns(true));
    without = std::min(without, per_call_ns(false));
  }
  std::printf("NVTX range of an op call (%s, %s): %.2f ns a call; the same loop without it: %.2f ns "
              "(best of 5 runs of %lld)\n",
              MHCCL_NVTX ? "compiled in" : "compiled out (MHCCL_NVTX=OFF)",
              attached ? "a profiler is attached" : "no profiler attached", with, without, static_cast<long long>(n));
  return 0;
}

}  // namespace
}  // namespace mhccl::bench

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  mhccl::bench::Options o;
  bool worker = false;
  CLI::App app{"mhccl-bench: checks mhccl's ops against the CPU reference on every local GPU, then\n"
               "times them against NCCL baselines (CUDA-graph replays, median of repeats)."};
  app.footer("Exit: 0 every check passed; 1 a check or a run failed; 2 a bad command line, or no CUDA device (the\n"
             "reason printed).");
  app.set_version_flag("--version", std::string("mhccl-bench (mhccl ") + mhccl::tuning::library_version() + ")");
  app.add_option("--tp", o.tps, "TP sizes to run, 1, 2, 4 or 8 (a list: --tp 2,1 or --tp 2 1; default: every local "
                                "GPU as one group, or the first 1, 2, 4 or 8 of them, then 1)")
      ->delimiter(',')
      ->transform(mhccl::launch::decimal_digits())
      ->check(CLI::IsMember({1, 2, 4, 8}));
  app.add_option("--ops", o.ops, "comma list of allgather, allreduce, twoshot, fp8 (default: all), and simulated "
                                 "(by name only: TP = 2 and 4 simulated on one GPU, timed at the TP=1 pass)")
      ->delimiter(',')
      ->check(CLI::IsMember({"allgather", "allreduce", "twoshot", "fp8", "simulated"}));
  app.add_option("--json", o.json_path, "write every row (op, variant, protocol, tp, m, bytes/hidden, hc, us_median, baseline, baseline_us, correct) to this file");
  app.add_flag("--quick", o.quick, "fewer sizes (a smoke run)");
  app.add_option("--rows", o.rows, "comma list of M (rows) for the all-reduce, two-shot and fp8 tables, instead of "
                                   "each table's own (e.g. --rows 1024 to profile one size)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  bool check_only = false, no_check = false;
  CLI::Option* only = app.add_flag("--check-only", check_only, "only the checks against the CPU reference");
  app.add_flag("--no-check", no_check, "skip the checks, only time")->excludes(only);
  // The op's own check (a positive multiple of 16, at most 2^35), before any GPU is looked for.
  app.add_option("--capacity-bytes", o.ag_capacity, "LamportAllGather capacity per rank (default 1 MiB)")
      ->check([](const std::string& v) -> std::string {
        size_t used = 0;
        try {
          const long long bytes = std::stoll(v, &used, 0);  // 0x100000 too, as CLI11 reads it
          if (used != v.size()) return "expected an integer, got '" + v + "'";
          mhccl::check_all_gather_config(bytes);
        } catch (const mhccl::Error& e) {
          return e.what();
        } catch (const std::exception&) {
          return "expected an integer, got '" + v + "'";
        }
        return {};
      });
  app.add_option("--calls-per-graph", o.calls_per_graph, "calls captured per CUDA graph (default 20)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--repeats", o.repeats, "timed repeats; the median is reported (default 11)")
      ->check(CLI::Range(1, 100000));
  bool info = false, nvtx_cost = false;
  app.add_flag("--info", info, "print the environment report (versions, GPUs, P2P matrix, MHCCL_*/NCCL_* variables) and exit");
  app.add_flag("--nvtx-cost", nvtx_cost, "time the host cost of an op call's NVTX range (no GPU needed) and exit");
  app.add_flag("--worker", worker, "internal: run as one rank (set by mhccl-launch)")->group("");
  app.add_option("--rows-out", o.rows_out, "internal: where rank 0 writes its rows")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad option: CLI11's message, exit 2
  }
  if (info) {
    std::fputs(mhccl::environment_report().c_str(), stdout);
    return 0;
  }
  if (nvtx_cost) return mhccl::bench::nvtx_cost();
  o.check = !no_check;
  o.timing = !check_only;
  if (worker) {
    try {
      return mhccl::bench::run_worker(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mhccl-bench worker failed: %s\n", e.what());
      return 3;
    }
  }

  if (!o.json_path.empty() && !mhccl::launch::can_write_file(o.json_path)) {  // before the run, not after it
    std::fprintf(stderr, "mhccl-bench: --json %s: cannot write there\n", o.json_path.c_str());
    return 2;
  }
  const mhccl::detail::DeviceCount devices = mhccl::detail::cuda_device_count();
  const int gpus = devices.count;
  if (gpus == 0) {
    std::fprintf(stderr, "mhccl-bench: no CUDA device (%s): it needs an NVIDIA GPU (sm_90+) with a driver; "
                 "mhccl-bench --info says more\n", devices.why_none.c_str());
    return 2;
  }
  if (o.tps.empty()) {
    const int tp = mhccl::launch::supported_tp_at_most(gpus);
    if (tp != gpus) std::printf("mhccl-bench: %d GPUs; TP=%d on the first %d (TP is 1, 2, 4 or 8)\n", gpus, tp, tp);
    o.tps.push_back(tp);
    if (tp > 1) o.tps.push_back(1);
  }
  for (int tp : o.tps) {  // a TP asked for that cannot run: refused, not skipped into a PASS
    if (tp > gpus) {
      std::fprintf(stderr, "mhccl-bench: --tp %d needs %d GPUs, this machine has %d\n", tp, tp, gpus);
      return 2;
    }
  }
  json meta;
  const std::string machine = mhccl::bench::machine_json(meta);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  const char* commit = std::getenv("MHCCL_COMMIT");
  std::printf("mhccl-bench on %s; %s\n", machine.c_str(), date);
  std::vector<json> rows;
  int rc = 0;
  for (int tp : o.tps) {
    char path[] = "/tmp/mhccl-bench-rows-XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    mhccl::launch::Options lo;
    lo.nprocs = tp;
    lo.prefix_output = false;
    lo.timeout_s = 3600;
    lo.argv = {mhccl::bench::self_exe()};
    for (const std::string& a : o.worker_args()) lo.argv.push_back(a);
    lo.argv.insert(lo.argv.end(), {"--rows-out", path});
    const mhccl::launch::Result r = mhccl::launch::run(lo);
    if (r.exit_code != 0) {
      std::printf("mhccl-bench: TP=%d %s (exit %d)\n", tp, r.exit_code == 1 ? "had FAILED checks" : "failed", r.exit_code);
      rc = 1;
    }
    std::ifstream f(path);
    const json part = json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (part.is_array()) for (const auto& row : part) rows.push_back(row);
    std::remove(path);
  }
  mhccl::bench::print_tables(rows);
  if (!o.json_path.empty()) {
    json doc{{"machine", meta}, {"date", date}, {"command", command},
             {"commit", commit ? commit : "unknown"}, {"rows", rows}};
    if (mhccl::launch::write_file(o.json_path, doc.dump(1) + "\n")) {
      std::printf("\nwrote %zu rows to %s\n", rows.size(), o.json_path.c_str());
    } else {
      std::printf("\nmhccl-bench: could not write %s\n", o.json_path.c_str());
      rc = 2;
    }
  }
  std::printf("%s\n", rc == 0 ? "mhccl-bench: all checks PASSED" : "mhccl-bench: FAILED");
  return rc;
}
