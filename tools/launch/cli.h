// Command-line helpers and defaults the tools share (CLI11).
#pragma once

#include <algorithm>
#include <string>

#include <CLI/CLI.hpp>

namespace mhccl::launch {

// A whole number in decimal digits, before CLI11 converts it (a transform: add it before the
// option's range or set check). CLI11 2.1 reads "010" as octal (8) and takes "0x3" and, for a
// set check, lets an empty value through as 0; here leading zeros are dropped and anything but
// digits is refused, naming the value.
inline CLI::Validator decimal_digits() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
          return "expected a whole number in decimal digits, got '" + v + "'";
        }
        v.erase(0, std::min(v.find_first_not_of('0'), v.size() - 1));
        return {};
      },
      "", "DECIMAL");
}

// The largest TP the ops support (1, 2, 4 or 8) on `gpus` local GPUs: a tool's default group
// (every local GPU would be a TP of 3, 5, 6 or 7 on such a machine, which no op builds).
inline int supported_tp_at_most(int gpus) { return gpus >= 8 ? 8 : gpus >= 4 ? 4 : gpus >= 2 ? 2 : 1; }

}  // namespace mhccl::launch
