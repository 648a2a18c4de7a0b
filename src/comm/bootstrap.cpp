#include "mhccl/bootstrap.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/check.h"
#include "mhccl/communicator.h"

namespace mhccl {
namespace {

// Whether `name` is set (and not empty); if so, its value in *out: decimal digits only (no sign,
// no space, no 0x), at most 2^20.
bool read_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  long x = 0;
  for (const char* c = v; *c != '\0' && x <= (1 << 20); ++c) {
    if (*c < '0' || *c > '9') { x = -1; break; }
    x = 10 * x + (*c - '0');
  }
  if (x < 0 || x > (1 << 20)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": expected a rank count or index, got '" + v + "'");
  }
  *out = static_cast<int>(x);
  return true;
}

}  // namespace

RankEnvironment rank_environment() {
  RankEnvironment env;
  struct Scheme { const char* rank; const char* size; const char* local; const char* name; };
  const Scheme schemes[] = {
      {"MHCCL_RANK", "MHCCL_WORLD_SIZE", "MHCCL_LOCAL_RANK", "mhccl-launch"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
  };
  // The first scheme with both its rank and its size set. A scheme with one of them only (a job
  // script exporting WORLD_SIZE for PyTorch, then starting the ranks with mpirun) is passed
  // over; only when no scheme is whole is it an error, since this process would otherwise run
  // as a group of one, reducing nothing. (A size of 1 alone is a group of one.)
  const Scheme* half = nullptr;
  for (const Scheme& s : schemes) {
    int rank = 0, size = 0;
    const bool has_rank = read_int(s.rank, &rank), has_size = read_int(s.size, &size);
    if (has_rank != has_size && half == nullptr && !(has_size && size == 1)) half = &s;
    if (!has_rank || !has_size) continue;
    if (size < 1 || rank >= size) {
      throw Error(ErrorCode::kInvalidArgument, std::string(s.rank) + "=" + std::to_string(rank) +
                                                   " is not below " + s.size + "=" + std::to_string(size));
    }
    env.rank = rank;
    env.world_size = size;
    env.local_rank = rank;
    read_int(s.local, &env.local_rank);
    env.source = s.name;
    half = nullptr;
    break;
  }
  if (half != nullptr) {
    const bool has_rank = std::getenv(half->rank) != nullptr && *std::getenv(half->rank) != '\0';
    throw Error(ErrorCode::kInvalidArgument, std::string(has_rank ? half->rank : half->size) + " is set but " +
                                                 (has_rank ? half->size : half->rank) + " is not (" + half->name +
                                                 "'s rank environment needs both; no other launcher's is set whole)");
  }
  if (const char* f = std::getenv("MHCCL_UNIQUE_ID_FILE")) env.unique_id_file = f;
  return env;
}

ncclUniqueId share_unique_id(const RankEnvironment& env, int timeout_ms) {
  if (env.world_size == 1) return Communicator::make_unique_id();
  if (env.unique_id_file.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "MHCCL_UNIQUE_ID_FILE: expected a path (fresh for this job, visible to every "
                "rank) through which rank 0 hands out the NCCL unique id, got none");
  }
  ncclUniqueId id;
  const std::string& path = env.unique_id_file;
  if (env.rank == 0) {
    id = Communicator::make_unique_id();
    const std::string tmp = path + ".tmp";
    // stdio, not iostreams (see src/ops/checks.cpp on the library's C++ runtime).
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    const bool written = f != nullptr && std::fwrite(id.internal, 1, sizeof id.internal, f) == sizeof id.internal;
    if (f != nullptr && std::fclose(f) != 0) f = nullptr;
    if (!written || f == nullptr) {
      throw Error(ErrorCode::kInvalidArgument, "MHCCL_UNIQUE_ID_FILE: cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error(ErrorCode::kInvalidArgument, "MHCCL_UNIQUE_ID_FILE: cannot rename to " + path);
    }
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool got = std::fread(id.internal, 1, sizeof id.internal, f) == sizeof id.internal;
      std::fclose(f);
      if (got) return id;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // A peer that never arrived (rank 0 died, or never started): kPeerTimeout naming it, as
      // every other wait on a peer that gives up.
      throw Error(ErrorCode::kPeerTimeout,
                  "MHCCL_UNIQUE_ID_FILE: rank 0 wrote no id to " + path + " within " + std::to_string(timeout_ms) +
                      " ms (rank 0 died, never started, or was given another path)",
                  ErrorContext{0, -1, "share_unique_id"});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace mhccl
