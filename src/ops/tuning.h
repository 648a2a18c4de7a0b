// Tuning tables (docs/TUNING.md): the protocol thresholds and launch shapes an AllReduceMHC uses,
// keyed by machine and group (GPU, SM count, P2P topology, NCCL version, TP, H, hc, variant).
// The built-in defaults are such a table too (src/ops/tuning_builtin.json, compiled in), so
// there is one mechanism. Pure C++ (no CUDA call): the CPU tests drive every function here.
//
// Precedence of each resolved value, highest first:
//   1. the MHCCL_* launch-shape variables of benchmark sweeps (MHCCL_STREAMING_MIN_ROWS,
//      MHCCL_STREAM_PUBLISHERS, MHCCL_STREAM_REDUCERS), as before tuning tables existed;
//   2. an explicit AllReduceMHCConfig value (not its "default" sentinel: 0 for the two-shot and
//      NCCL thresholds, -1 for streaming_min_rows);
//   3. the matching entry of the caller's table (AllReduceMHCConfig::tuning_file, else
//      MHCCL_TUNING_FILE);
//   4. the matching entry of the built-in table.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mhccl/all_reduce_mhc.h"

namespace mhccl::tuning {

constexpr int kSchemaVersion = 1;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();  // a threshold never reached

// What an op is and where it runs: the key an entry must match.
struct Key {
  std::string gpu;      // cudaDeviceProp::name of this rank's device, e.g. "NVIDIA H200"
  int64_t sms = 0;      // its multiprocessors
  std::string p2p;      // "p2p" (peers load/store reachable), "none" (the NCCL fallback), "self"
                        // (TP=1 with lamport_self_test: the own mailbox), "direct" (TP=1)
  std::string nccl;     // the NCCL library loaded, "2.28.9"
  int64_t tp = 1;
  int64_t hidden = 5120;
  int64_t hc = 4;
  std::string variant;  // "plain", "mxfp8", "residual_only", "fp8", "fp8_ue8m0" (variant_key)
  int64_t top_k = 6;
  std::string mhccl;    // this library's version, "0.1.0"
};
// "2.28" of "2.28.9" (or of "2.28"): how versions of NCCL and mhccl are compared by matching
// and by the check for two entries of one key.
std::string major_minor(const std::string& v);

std::string key_text(const Key& k);
// This library's version (Key::mhccl).
const char* library_version();
// The variant an op's table entry is looked up for: the quantized output it was built for, else
// residual_only where built so, else plain.
std::string variant_key(const AllReduceMHCConfig& c);
// The p2p string of a group (Key::p2p).
std::string p2p_key(int tp, bool reachable, bool lamport_self_test);

// Values an entry sets; absent ones fall through to the next source of the precedence.
struct Settings {
  std::optional<int64_t> two_shot_min_rows, two_shot_min_finalize_rows;  // kNever for "never"
  std::optional<int64_t> nccl_min_rows, nccl_min_finalize_rows;          // kNever for "never"
  std::optional<int64_t> streaming_min_rows;                             // -1, 0 or rows
  std::optional<int64_t> publisher_ctas, finalize_publisher_ctas, reducer_ctas;
};

struct Entry {
  // The key pattern: an absent field ("*" in the file) matches any value.
  std::optional<std::string> gpu, p2p, nccl, variant;
  std::optional<int64_t> sms, tp, hidden, hc, top_k;
  std::optional<std::string> mhccl;  // the mhccl that measured it (staleness, not the key)
  std::string provenance;            // "measured" or "extrapolated"
  std::string source;                // free text: machine, date, command
  Settings settings;
  size_t index = 0;                  // position in "entries"
  int specificity() const;           // key fields that are not "*"
};

struct Table {
  std::string path;        // the file ("built-in" for the compiled-in table)
  int schema_version = 0;  // another than kSchemaVersion: stale, `entries` left empty
  std::string generator;
  std::vector<Entry> entries;
};

// Parses a table. A malformed one throws Error(kInvalidArgument) naming `path` and the place:
// "line 3, column 7" for a JSON syntax error, "entries[2].thresholds.two_shot_min_rows" for a
// value of the wrong type or range. A table of another schema_version is not an error (Table's
// schema_version says so; match() reports it stale).
Table parse_table(const std::string& text, const std::string& path);
// Reads and parses `path`; a file that cannot be read is Error(kInvalidArgument) naming it.
Table load_table(const std::string& path);
// The built-in defaults (src/ops/tuning_builtin.json).
const Table& builtin_table();

// The entry for `key`: every field of its pattern equal to the key's (strings exactly), the
// most specific such entry (ties: the first in the file). None (entry == nullptr) when the
// table is stale (another schema_version), or no entry matches; an entry that matches all but
// its NCCL major.minor (or its mhccl major.minor) is stale and never used. `why` says which.
struct Match {
  const Entry* entry = nullptr;
  std::string why;  // when entry is null
};
Match match(const Table& table, const Key& key);

// The built-in default of two_shot_min_rows (finalize: two_shot_min_finalize_rows) at tp: the
// built-in table's entry for that TP.
int64_t default_two_shot_min_rows(int tp, bool finalize);

// The launch-shape variables (level 1 of the precedence), as read from the environment.
struct EnvOverrides {
  std::optional<int64_t> ctas_per_row, streaming_min_rows, publisher_ctas, reducer_ctas;
};

// A configuration with every default and table value resolved.
struct Resolved {
  AllReduceMHCConfig cfg;  // thresholds resolved: kNever for never
  int ctas_per_row = 0;
  int publisher_ctas[2] = {0, 0};  // call, finalize
  int reducer_ctas = 0;
  // Where the values came from, one line: "tuning table PATH entries[3] (measured) for KEY", or
  // "built-in defaults (TP=2: measured)" with, where a table was given, why no entry of it applied.
  std::string source;
  bool table_used = false;
};
// `table`: the caller's table (nullptr: none given).
Resolved resolve(const AllReduceMHCConfig& config, const Key& key, const EnvOverrides& env, const Table* table);

// The configuration agreement's fields of an AllReduceMHC (AllReduceMHC's constructor agrees on
// exactly these): the resolved thresholds and launch shapes among them, so ranks whose tables
// differ raise on every rank, naming the field.
std::vector<std::pair<const char*, int64_t>> agreement_fields(const Resolved& r, bool force_nccl_fallback);

}  // namespace mhccl::tuning
