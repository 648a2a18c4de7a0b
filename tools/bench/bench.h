// mhccl-bench internals: options shared by the CLI (parent) and the per-rank workers.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mhccl::bench {

struct Options {
  std::vector<int> tps;          // TP sizes to run; empty: every local GPU, then 1
  std::vector<std::string> ops;  // allgather, allreduce, twoshot (empty: all)
  bool check = true;
  bool timing = true;
  bool quick = false;
  int64_t ag_capacity = 1 << 20;
  int calls_per_graph = 20;
  int launches_per_repeat = 5;
  int repeats = 11;
  int warmup = 3;
  int ctas_per_row = 0;
  std::vector<int64_t> rows;  // --rows: the M of the all-reduce, two-shot and fp8 tables (empty: each table's own)
  std::string json_path;
  std::string rows_out;  // worker: where rank 0 writes its rows (JSON)

  bool wants(const std::string& op) const;
  std::vector<std::string> worker_args() const;  // the options a worker needs, as arguments
  // The M a table times: `rows` where given (sorted, each once), else the table's own list.
  std::vector<int64_t> table_rows(std::vector<int64_t> own) const;
};

// Runs this process as one rank of a TP group (rank environment from mhccl-launch); returns the
// exit code: 0, or 1 when a check failed.
int run_worker(const Options& opts);

// --ops simulated (TP=1 pass only, never by default): AllReduceMHC's Lamport paths with TP = 2
// and 4 ranks simulated on this one GPU (tools/bench/simulated.cpp); rows into `rows`. Returns
// the number of cases in which a rank recorded an error.
int time_simulated_ranks(const Options& opts, std::vector<nlohmann::json>& rows);

}  // namespace mhccl::bench
