// Bootstrapping a TP group without MPI: which rank this process is, and the NCCL unique id
// handed from rank 0 to the others through a file.
#pragma once

#include <string>

#include <nccl.h>

namespace mhccl {

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;           // the CUDA device this rank uses by default
  std::string unique_id_file;   // MHCCL_UNIQUE_ID_FILE
  std::string source = "none";  // "mhccl-launch", "torchrun", "mpirun" or "none"
};

// From MHCCL_RANK / MHCCL_WORLD_SIZE / MHCCL_LOCAL_RANK (mhccl-launch), torchrun's RANK /
// WORLD_SIZE / LOCAL_RANK, or Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, in that
// order: the first whose rank and size are both set; none set: a single rank. Throws
// Error(kInvalidArgument) on a value that is not decimal digits (at most 2^20), a rank not below
// the size, or, when no scheme is set whole, a rank without its size (or a size other than 1
// without its rank).
RankEnvironment rank_environment();

// Rank 0 makes an NCCL unique id and writes it to env.unique_id_file (atomically: write, then
// rename); the other ranks wait for that file up to timeout_ms (a process start, CUDA's and
// NCCL's initialisation included: longer than a call's wait budget). The path must be fresh for
// each job (mhccl-launch makes one); a single rank needs no file. Throws Error(kPeerTimeout)
// naming rank 0 when the file does not come within timeout_ms, Error(kInvalidArgument) when rank
// 0 cannot write it.
ncclUniqueId share_unique_id(const RankEnvironment& env, int timeout_ms = 120000);

}  // namespace mhccl
