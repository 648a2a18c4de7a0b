// LamportAllGather host side (include/mhccl/all_gather.h).
#include "mhccl/all_gather.h"

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/debug.h"
#include "common/nvtx.h"
#include "common/text.h"
#include "kernels/launch.h"
#include "mhccl/checks.h"

namespace mhccl {

struct LamportAllGather::Impl {
  std::shared_ptr<Communicator::Impl> comm;
  int64_t capacity = 0;
  std::unique_ptr<SymmetricBuffer> mailbox;  // [gen][source rank][capacity bytes]
  kernels::LamportState* state = nullptr;
  void* staging = nullptr;  // contiguous, aligned copy of an input that is neither
  void* fallback_ids = nullptr;  // NCCL fallback: the call identities (kernels::fallback_ids_bytes)
  uint32_t op_serial = 0;        // Communicator::Impl::ops_agreed after this op's agreement
  int packs_per_cta = 0;    // launch shape; 0: default (MHCCL_ALLGATHER_PACKS_PER_CTA overrides)

  ~Impl() {
    if (comm) comm->release({state, staging, fallback_ids});
  }
};

LamportAllGather::LamportAllGather(Communicator& comm, int64_t rank_capacity_bytes)
    : impl_(std::make_unique<Impl>()) {
  detail::nvtx::Range range(detail::nvtx::Kind::kConstruction, rank_capacity_bytes, [&] {
    return "mhccl.LamportAllGather capacity=" + std::to_string(rank_capacity_bytes) + " bytes";
  });
  Impl& im = *impl_;
  im.comm = comm.impl();
  im.comm->check_for_construction("LamportAllGather");  // fatal errors only; route reports stay for check_errors()
  // Checked here, thrown after the agreement (on every rank alike: none leaves the collective).
  std::exception_ptr local_error;
  try {
    check_all_gather_config(rank_capacity_bytes);
    detail::DeviceGuard guard(im.comm->device);
    MHCCL_CUDA(kernels::preload_all_gather_kernels());  // before the agreement: a local error every rank learns of
    // The staging copy, and the mailbox where the peers are reachable (as below).
    const Communicator::Impl& c = *im.comm;
    const uint64_t mailbox =
        c.tp > 1 && c.reachable
            ? Communicator::Impl::symmetric_window_bytes(kernels::all_gather_mailbox_bytes(c.tp, rank_capacity_bytes / 16))
            : 0;
    c.require_device_memory("LamportAllGather with rank_capacity_bytes " + std::to_string(rank_capacity_bytes),
                            mailbox + static_cast<uint64_t>(rank_capacity_bytes),
                            "lower rank_capacity_bytes, or free device memory before building the op");
    // Benchmark sweeps only; must be the same on every rank (it sets the launch shape).
    long long v = 0;
    if (detail::env_int("MHCCL_ALLGATHER_PACKS_PER_CTA", 0, 1 << 20, &v)) im.packs_per_cta = static_cast<int>(v);
  } catch (...) {  // ours or not (std::bad_alloc): every rank learns of it at the agreement
    local_error = std::current_exception();
  }
  im.comm->agree("LamportAllGather",
                 {{"rank_capacity_bytes", rank_capacity_bytes}, {"MHCCL_ALLGATHER_PACKS_PER_CTA", im.packs_per_cta}},
                 local_error);
  im.op_serial = im.comm->ops_agreed;
  im.capacity = rank_capacity_bytes;
  detail::DeviceGuard guard(im.comm->device);
  try {  // after the agreement, a failure here leaves this rank out of step with its peers: unusable
    if (im.comm->tp > 1 && im.comm->reachable) {
      im.mailbox = comm.alloc_symmetric(
          static_cast<size_t>(kernels::all_gather_mailbox_bytes(im.comm->tp, rank_capacity_bytes / 16)),
          kernels::kWordSentinel);
      MHCCL_CUDA(cudaMalloc(&im.state, sizeof(kernels::LamportState)));
      MHCCL_CUDA(cudaMemsetAsync(im.state, 0, sizeof(kernels::LamportState), im.comm->setup_stream));
      im.comm->setup_wait("LamportAllGather construction");
    } else if (im.comm->tp > 1) {  // the NCCL fallback: its identity buffer, the call count zeroed
      Communicator::Impl::ready_fallback_ids(im.fallback_ids, im.comm->setup_stream);
      im.comm->setup_wait("LamportAllGather construction");
    }
    MHCCL_CUDA(cudaMalloc(&im.staging, static_cast<size_t>(rank_capacity_bytes)));
  } catch (...) {
    im.comm->apart_after_agreement("LamportAllGather", std::current_exception());
    throw;
  }
  if (detail::debug_info()) {
    const Communicator::Impl& c = *im.comm;
    detail::Text t;
    t << "capacity " << rank_capacity_bytes << " bytes a rank; "
      << (c.tp == 1 ? "TP=1: a device copy" : c.reachable ? "Lamport all-gather" : "the NCCL fallback (ncclAllGather)")
      << "; mailbox "
      << (im.mailbox ? detail::bytes_text(im.mailbox->bytes()) + " (" + std::to_string(kernels::kGenerations) +
                           " generations x " + std::to_string(c.tp) + " ranks x capacity, with call headers)"
                     : std::string("none"))
      << ", staging copy "
      << detail::bytes_text(static_cast<uint64_t>(rank_capacity_bytes)) << "\n";
    t << "grid: one kernel of at most " << kernels::kAllGatherMaxCtas << " CTAs, packs a CTA "
      << (im.packs_per_cta > 0 ? std::to_string(im.packs_per_cta) + " (MHCCL_ALLGATHER_PACKS_PER_CTA)" : "by default")
      << "\n";
    detail::debug_print("rank " + std::to_string(c.rank) + "/" + std::to_string(c.tp) + " cuda:" +
                            std::to_string(c.device) + " LamportAllGather",
                        t.str());
  }
}

LamportAllGather::~LamportAllGather() = default;

bool LamportAllGather::accepts(const DLTensor& in) const {
  return all_gather_accepts(impl_->capacity, in);
}

void LamportAllGather::call(const DLTensor& in, const DLTensor& out, cudaStream_t stream) {
  Impl& im = *impl_;
  Communicator::Impl& c = *im.comm;
  c.guarded_call("LamportAllGather", stream, [&](bool& launched) {
    c.check();
    const bool needs_copy = check_all_gather_call(im.capacity, c.tp, c.device, in, out);
    const int64_t rows = in.ndim > 0 ? in.shape[0] : 1;
    detail::nvtx::Range range(detail::nvtx::Kind::kAllGather, rows, [&] {
      return detail::nvtx::call_name("all_gather", c.tp == 1 ? "direct" : c.reachable ? "lamport" : "nccl", rows) +
             " bytes=" + std::to_string(tensor_bytes(in));
    });
    // A strided input is copied with its dimensions merged (coalesce_dims): the copy takes 8.
    kernels::StridedCopy sc = {};
    if (needs_copy && !is_contiguous(in)) {
      sc.ndim = coalesce_dims(in, sc.shape, sc.strides, 8);
      if (sc.ndim < 0) {
        throw Error(ErrorCode::kInvalidArgument,
                    "input: a non-contiguous input is copied with at most 8 dimensions after merging those "
                    "that can be merged (and dropping those of size 1); " + describe_shape(in) +
                        " keeps more");
      }
    }
    detail::DeviceGuard guard(c.device);
    const int64_t bytes = tensor_bytes(in);
    const void* src = static_cast<const char*>(in.data) + in.byte_offset;
    if (needs_copy) {
      if (is_contiguous(in)) {
        MHCCL_CUDA(cudaMemcpyAsync(im.staging, src, static_cast<size_t>(bytes),
                                   cudaMemcpyDeviceToDevice, stream));
      } else {
        sc.src = src;
        sc.dst = im.staging;
        sc.elem_bytes = in.dtype.bits * in.dtype.lanes / 8;
        MHCCL_CUDA(kernels::launch_strided_copy(sc, stream));
      }
      src = im.staging;
    }
    void* dst = static_cast<char*>(out.data) + out.byte_offset;
    if (c.tp > 1 && !c.reachable) {  // NCCL fallback: every byte as sent, as on the Lamport path
      // The call's identity is exchanged and checked with it (PROTOCOL.md I19), between the
      // watchdog's progress counts (NCCL's wait has no budget of its own).
      const kernels::CallIdentity id = kernels::with_op_serial(
          kernels::with_layout(kernels::make_call_identity(kernels::kOpAllGather, kernels::kProtoNccl, 0,
                                                           static_cast<uint64_t>(bytes / 16)),
                               all_gather_layout_digest(in)),
          im.op_serial);
      c.fallback_call("LamportAllGather", c.sink(kernels::kOpAllGather), id, im.fallback_ids,
                      [&] { return ncclAllGather(src, dst, static_cast<size_t>(bytes), ncclUint8, c.comm, stream); },
                      stream, "ncclAllGather of the NCCL fallback", launched);
      return;
    }
    kernels::AllGatherParams p = {};
    p.in = src;
    p.out = dst;
    p.tp = c.tp;
    p.rank = c.rank;
    p.packs = bytes / 16;
    p.capacity_packs = im.capacity / 16;
    p.state = im.state;
    p.err = c.sink(kernels::kOpAllGather);
    // This rank's identity of the call (PROTOCOL.md, I19): the size in packs and the digest of
    // the input's dtype and shape (the kernel adds the generation and the rejected count).
    p.id = kernels::with_layout(
        kernels::make_call_identity(kernels::kOpAllGather, kernels::kProtoAllGather, 0, static_cast<uint64_t>(p.packs)),
        all_gather_layout_digest(in));
    p.packs_per_cta = im.packs_per_cta;
    if (c.tp > 1) {
      for (int k = 0; k < c.tp; ++k) p.mailboxes[k] = im.mailbox->peer((c.rank + k) % c.tp);
    }
    MHCCL_CUDA(kernels::launch_all_gather(p, stream, true));
    if (c.tp > 1) launched = true;
  });
}

int64_t LamportAllGather::rank_capacity_bytes() const { return impl_->capacity; }

size_t LamportAllGather::mailbox_bytes() const {
  return (impl_->mailbox ? impl_->mailbox->bytes() : 0) +
         (impl_->fallback_ids ? static_cast<size_t>(kernels::fallback_ids_bytes()) : 0);
}

}  // namespace mhccl
