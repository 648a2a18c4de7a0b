// The device table of peer pointers of an NCCL symmetric window, read once at allocation time
// through the NCCL device API (ncclGetPeerPointer resolves a world rank inside the LSA team).
#include <nccl_device.h>

#include "comm/peer_table.h"

namespace mhccl::comm {
namespace {

__global__ void peer_table_kernel(ncclWindow_t window, int tp, void** out) {
  const int r = static_cast<int>(threadIdx.x);
  if (r < tp) out[r] = ncclGetPeerPointer(window, 0, r);
}

}  // namespace

cudaError_t launch_peer_table(ncclWindow_t window, int tp, void** out, cudaStream_t stream) {
  peer_table_kernel<<<1, 32, 0, stream>>>(window, tp, out);
  return cudaGetLastError();
}

}  // namespace mhccl::comm

namespace mhccl::comm {

int lsa_team_size(ncclComm_t comm) { return ncclTeamLsa(comm).nRanks; }

}  // namespace mhccl::comm
