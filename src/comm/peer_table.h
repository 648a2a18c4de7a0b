#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace mhccl::comm {

// out[r] = rank r's address of the window's byte 0, for r < tp (tp <= 32).
cudaError_t launch_peer_table(ncclWindow_t window, int tp, void** out, cudaStream_t stream);

// Ranks of the communicator's load/store-accessible (LSA) team: every rank reachable by
// NVLink/P2P loads and stores when it equals the communicator's size.
int lsa_team_size(ncclComm_t comm);

}  // namespace mhccl::comm
