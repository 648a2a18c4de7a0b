// The deployment self-test (tools/tune/verify.h).
#include "tune/verify.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "common/group.h"
#include "common/mhc_harness.h"
#include "common/text.h"
#include "mhccl/all_reduce_mhc.h"
#include "mhccl/checks.h"
#include "mhccl/error.h"

namespace mhccl::tune {
namespace {

using testing::Variant;

Variant variant_of(const std::string& name) {
  if (name == "plain") return Variant::kPlain;
  if (name == "mxfp8") return Variant::kMxfp8;
  if (name == "residual_only") return Variant::kResidualOnly;
  if (name == "fp8") return Variant::kFp8;
  if (name == "fp8_ue8m0") return Variant::kFp8Ue8m0;
  throw Error(ErrorCode::kInvalidArgument,
              "variant: expected plain, mxfp8, residual_only, fp8 or fp8_ue8m0, got '" + name + "'");
}

// The op a variant's calls need: its quantized output built (plain and residual-only calls run
// on the MXFP8 build, which accepts both, where H allows MXFP8).
AllReduceMHCConfig build_for(Variant v, const VerifyOptions& o, int64_t capacity) {
  AllReduceMHCConfig c;
  c.hidden_size = o.hidden;
  c.hc_mult = o.hc;
  c.top_k = o.top_k;
  c.max_num_tokens = capacity;
  c.residual_only = true;
  if (v == Variant::kFp8 || v == Variant::kFp8Ue8m0) {
    c.residual_only = false;
    testing::build_quant(c, v == Variant::kFp8 ? testing::Quant::kFp8 : testing::Quant::kFp8Ue8m0);
  } else {
    testing::build_quant(c, testing::Quant::kMxfp8);
  }
  return c;
}

struct Path {
  std::string name;
  AllReduceMHC* op;
  Protocol protocol;
};

}  // namespace

std::vector<std::string> variants_for(int64_t hidden) {
  std::vector<std::string> v = {"plain", "residual_only"};
  if (hidden % 32 == 0) v.push_back("mxfp8");
  if (hidden % 128 == 0) {
    v.push_back("fp8");
    v.push_back("fp8_ue8m0");
  }
  return v;
}

void check_verify_options(const VerifyOptions& o, int tp) {
  const std::vector<std::string> names = o.variants.empty() ? variants_for(o.hidden) : o.variants;
  const std::vector<std::string> allowed = variants_for(o.hidden);
  for (const std::string& n : names) {
    variant_of(n);
    if (std::find(allowed.begin(), allowed.end(), n) == allowed.end()) {
      throw Error(ErrorCode::kInvalidArgument, "variant " + n + ": not built at H=" + std::to_string(o.hidden) +
                                                   " (mxfp8 needs a multiple of 32, fp8 of 128)");
    }
  }
  if (o.ms.empty()) throw Error(ErrorCode::kInvalidArgument, "verify: no M given");
  for (const int64_t m : o.ms) {  // before the buffers are sized from them
    if (m < 1 || m > kMaxTokens) {
      throw Error(ErrorCode::kInvalidArgument,
                  "verify: expected every M in 1.." + std::to_string(kMaxTokens) + ", got " + std::to_string(m));
    }
  }
  // The shape (H, hc, top_k), checked as an op would, before the buffers of it.
  AllReduceMHCConfig shape;
  shape.hidden_size = o.hidden;
  shape.hc_mult = static_cast<int>(o.hc);
  shape.top_k = static_cast<int>(o.top_k);
  shape.max_num_tokens = *std::max_element(o.ms.begin(), o.ms.end());
  check_all_reduce_mhc_config(shape, tp);
}

VerifyResult verify(Communicator& comm, cudaStream_t stream, const VerifyOptions& o) {
  check_verify_options(o, comm.tp());
  const std::vector<std::string> names = o.variants.empty() ? variants_for(o.hidden) : o.variants;
  const int64_t cap = *std::max_element(o.ms.begin(), o.ms.end());
  const int tp = comm.tp(), rank = comm.rank(), device = comm.device();
  const bool lamport = comm.peers_reachable();
  testing::Group g(comm, stream);
  VerifyResult res;
  detail::Text report;  // no iostream: the Python extension links this (src/common/text.h)
  auto line = [&](const std::string& s) {
    report << s << "\n";
    if (o.print && rank == 0) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    }
  };
  line("mhccl self-test: TP=" + std::to_string(tp) + (tp == 1 ? " (the own mailbox for the Lamport paths)" : "") +
       ", H=" + std::to_string(o.hidden) + ", hc=" + std::to_string(o.hc) + ", top_k=" + std::to_string(o.top_k) +
       (lamport ? "" : ", peers not load/store reachable: the NCCL fallback only"));
  testing::CallBuffers buf(cap, o.hidden, o.hc, o.top_k);
  uint64_t seed = 0x5e1f7e57;
  for (const std::string& name : names) {
    const Variant v = variant_of(name);
    // The protocols' ops: every row fits the one-shot mailbox and two-shot is built for both
    // ops, streaming on (from 1 row) and off; the automatic path's op as a deployment builds it.
    AllReduceMHCConfig base = build_for(v, o, cap);
    base.two_shot_min_rows = cap + 1;
    base.two_shot_min_finalize_rows = 1;
    base.lamport_self_test = tp == 1;
    AllReduceMHCConfig on = base, off = base, autocfg = build_for(v, o, cap);
    on.streaming_min_rows = 1;
    off.streaming_min_rows = 0;
    autocfg.tuning_file = o.tuning_file;
    std::unique_ptr<AllReduceMHC> op_on, op_off;
    if (lamport) {  // at TP=1 too, but where the NCCL fallback is forced (no mailboxes: refused)
      op_on = std::make_unique<AllReduceMHC>(comm, on);
      op_off = std::make_unique<AllReduceMHC>(comm, off);
    }
    AllReduceMHC op_auto(comm, autocfg);
    std::vector<Path> paths;
    if (op_on) {
      paths.push_back({"one-shot", op_off.get(), Protocol::kOneShot});
      paths.push_back({"one-shot-streaming", op_on.get(), Protocol::kOneShot});
      paths.push_back({"two-shot", op_off.get(), Protocol::kTwoShot});
      paths.push_back({"two-shot-streaming", op_on.get(), Protocol::kTwoShot});
    }
    // NCCL's sum is in rank order at TP=2 only (SPEC.md): its bits are checked there.
    if (tp == 2) paths.push_back({"nccl", op_off.get() ? op_off.get() : &op_auto, Protocol::kNccl});
    const bool auto_checked = tp <= 2 || lamport;
    paths.push_back({tp == 1 ? "auto (direct)" : "auto", &op_auto, Protocol::kAuto});
    for (const bool fin : {false, true}) {
      for (const int64_t m : o.ms) {
        const testing::Problem p = testing::make_problem(seed++, m, o.hidden, o.hc, tp, fin, o.top_k);
        bool have_good = false;
        uint64_t good = 0;
        for (const Path& path : paths) {
          std::string err;
          uint64_t h = 0;
          try {
            testing::upload(p, rank, buf);
            testing::launch(*path.op, p, v, path.protocol, buf, device, stream);
            g.sync();
            const bool broken = !o.break_path.empty() &&
                                (path.name == o.break_path || path.name.rfind(o.break_path + "-", 0) == 0 ||
                                 path.name.rfind(o.break_path + " ", 0) == 0);
            if (broken && rank == tp - 1) {  // TEST ONLY: a wrong byte, as a broken path would give
              char* at = buf.res_out + m * o.hc * o.hidden;  // a byte in the middle, flipped
              char byte = 0;
              MHCCL_TEST_CUDA(cudaMemcpy(&byte, at, 1, cudaMemcpyDeviceToHost));
              byte = static_cast<char>(byte ^ 0x40);
              MHCCL_TEST_CUDA(cudaMemcpy(at, &byte, 1, cudaMemcpyHostToDevice));
            }
            const testing::Outputs got = testing::download(p, v, buf);
            h = got.hash();
            const bool reference_check = path.name.rfind("auto", 0) != 0 || auto_checked;
            if (!(have_good && h == good) && reference_check) {
              err = testing::check(p, v, got);
              if (err.empty() && have_good) err = "bits differ from the other paths' (each within the reference's tolerance)";
              if (err.empty()) {
                have_good = true;
                good = h;
              }
            }
            comm.check_errors();
          } catch (const std::exception& e) {
            err = e.what();
          }
          // Collective from here: every rank takes part whatever its local verdict.
          std::string ranks_err;
          if (!g.same_on_all_ranks(h)) ranks_err = "the ranks' bits differ";
          const bool local_ok = err.empty();
          const bool ok = g.all_ranks(local_ok) && ranks_err.empty();
          const std::string what = std::string(fin ? "finalize" : "call") + " " + name + " M=" + std::to_string(m) + " " +
                                   path.name;
          ++res.cases;
          std::string reason = !local_ok ? err : ranks_err;
          if (!ok && reason.empty()) reason = "failed on another rank (its output says why)";
          if (!local_ok && rank != 0) std::printf("rank %d: %s: %s\n", rank, what.c_str(), err.c_str());
          line(std::string(ok ? "  PASS  " : "  FAIL  ") + what + (ok ? "" : ": " + reason));
          if (!ok) {
            ++res.failures;
            if (res.first_failure.empty()) res.first_failure = what + ": " + reason;
          }
        }
      }
    }
  }
  res.ok = res.failures == 0;
  line(res.ok ? "mhccl self-test: PASS (" + std::to_string(res.cases) + " cases)"
              : "mhccl self-test: FAIL (" + std::to_string(res.failures) + " of " + std::to_string(res.cases) +
                    " cases; first: " + res.first_failure + ")");
  res.report = report.str();
  return res;
}

}  // namespace mhccl::tune
