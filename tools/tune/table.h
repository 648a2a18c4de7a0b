// mhccl-tune's output: the table it writes to --out, merged with a table already there.
// Header-only (nlohmann-json), for mhccl-tune and its CPU tests.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "mhccl/error.h"
#include "ops/tuning.h"

namespace mhccl::tune {

// Whether two entries have one key as the loader compares keys (NCCL by major.minor): the fresh
// entry replaces the old one (an entry of NCCL 2.28.3 beside a fresh one of 2.28.9 is refused).
inline bool same_key(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.contains("key") || !b.contains("key") || !a["key"].is_object() || !b["key"].is_object()) return false;
  auto normal = [](nlohmann::json k) {
    if (k.contains("nccl") && k["nccl"].is_string()) k["nccl"] = tuning::major_minor(k["nccl"].get<std::string>());
    return k;
  };
  return normal(a["key"]) == normal(b["key"]);
}

// The table to write to `path` with the `fresh` entries (an array). A regular file at `path`
// that the loader reads as a table of this schema keeps its entries of other keys (tune each TP
// or shape once, into one file). Any other file there (another schema_version, a table the
// loader refuses, say for one hand-edited entry, something that is no table) is moved to
// `path`.bak, with a line saying why, and the table holds the fresh entries alone. Only a
// regular file is read: /dev/stdout, a pipe or a FIFO is written, never read (reading the
// process's own stdout pipe, or a FIFO with no writer, blocks for good).
inline nlohmann::json merged_table(const std::string& path, const nlohmann::json& fresh, const std::string& command,
                                   const std::string& date) {
  using nlohmann::json;
  json table = {{"schema_version", tuning::kSchemaVersion},
                {"generator", std::string("mhccl-tune ") + tuning::library_version()},
                {"created", date},
                {"command", command},
                {"entries", json::array()}};
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > 0 && !ec) {
    std::string why;
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      why = "it cannot be read";
    } else {
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      try {
        // The loader's own checks: what is kept is what an op would read.
        if (tuning::parse_table(text, path).schema_version != tuning::kSchemaVersion) {
          why = "it holds a table of another schema_version";
        } else {
          const json old = json::parse(text);
          for (const json& e : old["entries"]) {
            bool replaced = false;
            for (const json& n : fresh) replaced = replaced || same_key(e, n);
            if (!replaced) table["entries"].push_back(e);
          }
          std::printf("mhccl-tune: %s exists: kept its %zu entries of other keys\n", path.c_str(),
                      table["entries"].size());
        }
      } catch (const Error& e) {
        why = std::string("it is not a tuning table this mhccl reads (") + e.what() + ")";
      }
    }
    if (!why.empty()) {
      const std::string bak = path + ".bak";
      std::error_code none;
      if (std::filesystem::exists(bak, none)) std::printf("mhccl-tune: %s: replacing the earlier %s\n", path.c_str(), bak.c_str());
      std::filesystem::rename(path, bak, ec);
      const std::string kept = ec ? "it could not be kept as " + bak + " (" + ec.message() + ")" : "moved to " + bak;
      std::printf("mhccl-tune: %s: %s; %s, and the table written holds this run's entries alone\n", path.c_str(),
                  why.c_str(), kept.c_str());
    }
  }
  for (const json& n : fresh) table["entries"].push_back(n);
  return table;
}

}  // namespace mhccl::tune
