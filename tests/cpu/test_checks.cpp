// Every argument error of SPEC.md raises mhccl::Error with a message naming the argument, what
// was expected and what was given — before anything could be launched (no GPU here).
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "kernels/launch.h"
#include "common/tensor_desc.h"
#include "mhccl/bootstrap.h"
#include "mhccl/checks.h"
#include "mhccl/error.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"

namespace mhccl {
namespace {

using testing::Desc;
using testing::kBF16;
using testing::kF32;
using testing::kI32;
using testing::kI64;
using testing::kU8;

void* addr(uintptr_t a) { return reinterpret_cast<void*>(a); }

// A valid call of M rows for config {H=64, hc=4, C=16, top_k=3}, with every tensor described.
struct CallFixture {
  AllReduceMHCConfig cfg;
  int64_t m = 5;
  Desc x, residual, post, comb, pre, norm_weight, residual_out, layer_input, values, scales;
  Desc gemm2, weights, routes, shared;

  CallFixture() {
    cfg.hidden_size = 64;
    cfg.hc_mult = 4;
    cfg.max_num_tokens = 16;
    cfg.top_k = 3;
    cfg.quantize_layer_input = true;
    cfg.residual_only = true;
    const int64_t h = 64, hc = 4;
    x = Desc(addr(0x10000), kBF16, {m, h});
    residual = Desc(addr(0x20000), kBF16, {m, hc, h});
    post = Desc(addr(0x30000), kF32, {m, hc});
    comb = Desc(addr(0x40000), kF32, {m, hc, hc});
    pre = Desc(addr(0x50000), kF32, {m, hc});
    norm_weight = Desc(addr(0x60000), kBF16, {h});
    residual_out = Desc(addr(0x70000), kBF16, {m, hc, h});
    layer_input = Desc(addr(0x80000), kBF16, {m, h});
    values = Desc(addr(0x90000), kU8, {m, h});
    scales = Desc(addr(0xA0000), kU8, {mxfp8_scale_bytes(m, h)});
    gemm2 = Desc(addr(0xB0000), kBF16, {11, h});
    weights = Desc(addr(0xC0000), kF32, {m, 3});
    routes = Desc(addr(0xD0000), kI32, {m, 3});
    shared = Desc(addr(0xE0000), kBF16, {m, h});
  }
  MHCEpilogueArgs epilogue() {
    MHCEpilogueArgs e;
    e.residual = residual.get();
    e.post = post.get();
    e.comb = comb.get();
    e.pre = pre.get();
    e.norm_weight = norm_weight.get();
    e.residual_out = residual_out.get();
    e.layer_input = layer_input.get();
    e.mxfp8_values = values.get();
    e.mxfp8_scales = scales.get();
    return e;
  }
  AllReduceMHCCallArgs call() {
    AllReduceMHCCallArgs a;
    a.x = x.get();
    a.epilogue = epilogue();
    return a;
  }
  AllReduceMHCFinalizeArgs finalize() {
    AllReduceMHCFinalizeArgs a;
    a.gemm2_permuted = gemm2.get();
    a.expert_weights = weights.get();
    a.expanded_idx_to_permuted_idx = routes.get();
    a.shared_output = shared.get();
    a.epilogue = epilogue();
    return a;
  }
};

// Runs `f`, expects mhccl::Error of `code` whose message contains every `parts`.
void expect_error(const std::function<void()>& f, ErrorCode code, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

class Checks : public ::testing::Test {
 protected:
  CallFixture f;
  void call_error(const std::function<void(AllReduceMHCCallArgs&)>& mutate, ErrorCode code,
                  std::vector<std::string> parts) {
    AllReduceMHCCallArgs a = f.call();
    mutate(a);
    expect_error([&] { check_all_reduce_mhc_call(f.cfg, 0, a); }, code, std::move(parts));
  }
  void finalize_error(const std::function<void(AllReduceMHCFinalizeArgs&)>& mutate, ErrorCode code,
                      std::vector<std::string> parts) {
    AllReduceMHCFinalizeArgs a = f.finalize();
    mutate(a);
    expect_error([&] { check_all_reduce_mhc_finalize(f.cfg, 0, a); }, code, std::move(parts));
  }
};

TEST_F(Checks, ValidCallsPass) {
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, f.call()), 5);
  EXPECT_EQ(check_all_reduce_mhc_finalize(f.cfg, 0, f.finalize()), 5);
  AllReduceMHCCallArgs a = f.call();  // plain: no MXFP8
  a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr;
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr;  // residual-only
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  Desc post3(addr(0x30000), kF32, {5, 4, 1});  // post may be [M, hc, 1]
  a.epilogue.post = post3.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  Desc one_row(addr(0x10000), kBF16, {1, 64});  // the stride of a size-1 dim is free
  one_row.with_strides({9999, 1});
  EXPECT_TRUE(is_contiguous(one_row.t));
}

TEST_F(Checks, XDtype) {
  Desc bad(addr(0x10000), kF32, {5, 64});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"x:", "bfloat16", "float32"});
}
TEST_F(Checks, XShape) {
  Desc bad(addr(0x10000), kBF16, {5, 32});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"x:", "[M, 64]", "[5, 32]"});
}
TEST_F(Checks, XMissing) {
  call_error([&](auto& a) { a.x = nullptr; }, ErrorCode::kInvalidArgument, {"x:", "got none"});
}
TEST_F(Checks, MZero) {
  Desc bad(addr(0x10000), kBF16, {0, 64});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"M", "[1, 16]", "M=0"});
}
TEST_F(Checks, MAboveCapacity) {
  Desc bad(addr(0x10000), kBF16, {17, 64});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"max_num_tokens", "M=17"});
}
TEST_F(Checks, NonContiguous) {
  Desc bad(addr(0x10000), kBF16, {5, 64});
  bad.with_strides({128, 1});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"x:", "contiguous"});
}
TEST_F(Checks, MisalignedPointer) {
  Desc bad(addr(0x10008), kBF16, {5, 64});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"x:", "16-byte aligned", "0x10008"});
}
TEST_F(Checks, MisalignedByteOffset) {
  Desc bad2(addr(0x70000), kBF16, {5, 4, 64});
  bad2.t.byte_offset = 2;
  call_error([&](auto& a) { a.epilogue.residual_out = bad2.get(); }, ErrorCode::kInvalidArgument,
             {"residual_out", "16-byte aligned"});
}
TEST_F(Checks, DeviceMismatch) {
  Desc bad(addr(0x20000), kBF16, {5, 4, 64}, /*device=*/1);
  call_error([&](auto& a) { a.epilogue.residual = bad.get(); }, ErrorCode::kInvalidArgument,
             {"residual", "cuda:0", "cuda:1"});
}
TEST_F(Checks, HostTensor) {
  Desc bad(addr(0x20000), kBF16, {5, 4, 64});
  bad.t.device = DLDevice{kDLCPU, 0};
  call_error([&](auto& a) { a.epilogue.residual = bad.get(); }, ErrorCode::kInvalidArgument,
             {"residual", "CUDA tensor"});
}
TEST_F(Checks, ResidualShape) {
  Desc bad(addr(0x20000), kBF16, {5, 2, 64});
  call_error([&](auto& a) { a.epilogue.residual = bad.get(); }, ErrorCode::kInvalidArgument,
             {"residual", "[5, 4, 64]", "[5, 2, 64]"});
}
TEST_F(Checks, ResidualDtype) {
  Desc bad(addr(0x20000), kF32, {5, 4, 64});
  call_error([&](auto& a) { a.epilogue.residual = bad.get(); }, ErrorCode::kInvalidArgument,
             {"residual", "bfloat16", "float32"});
}
TEST_F(Checks, PostShape) {
  Desc bad(addr(0x30000), kF32, {5, 3});
  call_error([&](auto& a) { a.epilogue.post = bad.get(); }, ErrorCode::kInvalidArgument,
             {"post", "[5, 4] or [5, 4, 1]", "[5, 3]"});
}
TEST_F(Checks, PostDtype) {
  Desc bad(addr(0x30000), kBF16, {5, 4});
  call_error([&](auto& a) { a.epilogue.post = bad.get(); }, ErrorCode::kInvalidArgument, {"post", "float32"});
}
TEST_F(Checks, CombShape) {
  Desc bad(addr(0x40000), kF32, {5, 4, 2});
  call_error([&](auto& a) { a.epilogue.comb = bad.get(); }, ErrorCode::kInvalidArgument,
             {"comb", "[5, 4, 4]"});
}
TEST_F(Checks, CombMisaligned) {
  Desc bad(addr(0x40002), kF32, {5, 4, 4});
  call_error([&](auto& a) { a.epilogue.comb = bad.get(); }, ErrorCode::kInvalidArgument,
             {"comb", "4-byte aligned"});
}
TEST_F(Checks, PreShape) {
  Desc bad(addr(0x50000), kF32, {5, 4, 4});
  call_error([&](auto& a) { a.epilogue.pre = bad.get(); }, ErrorCode::kInvalidArgument, {"pre", "[5, 4]"});
}
TEST_F(Checks, NormWeightShape) {
  Desc bad(addr(0x60000), kBF16, {65});
  call_error([&](auto& a) { a.epilogue.norm_weight = bad.get(); }, ErrorCode::kInvalidArgument,
             {"norm_weight", "[64]", "[65]"});
}
TEST_F(Checks, PreWithoutNormWeight) {
  call_error([&](auto& a) { a.epilogue.norm_weight = nullptr; }, ErrorCode::kInvalidArgument,
             {"pre and norm_weight", "pre without norm_weight"});
}
TEST_F(Checks, NormWeightWithoutPre) {
  call_error([&](auto& a) { a.epilogue.pre = nullptr; }, ErrorCode::kInvalidArgument,
             {"pre and norm_weight", "norm_weight without pre"});
}
TEST_F(Checks, ResidualOnlyNotBuilt) {
  f.cfg.residual_only = false;
  call_error([&](auto& a) {
    a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr;
    a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr;
  }, ErrorCode::kUnsupported, {"residual_only=true"});
}
TEST_F(Checks, Mxfp8NotBuilt) {
  f.cfg.quantize_layer_input = false;
  call_error([&](auto&) {}, ErrorCode::kUnsupported, {"mxfp8_out", "quantize_layer_input=true"});
}
TEST_F(Checks, Mxfp8WithResidualOnly) {
  call_error([&](auto& a) {
    a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr;
  }, ErrorCode::kInvalidArgument, {"mxfp8_out", "residual-only"});
}
TEST_F(Checks, Mxfp8HalfGiven) {
  call_error([&](auto& a) { a.epilogue.mxfp8_scales = nullptr; }, ErrorCode::kInvalidArgument,
             {"mxfp8_out", "only values"});
}
TEST_F(Checks, Mxfp8ScalesWrongSize) {
  Desc bad(addr(0xA0000), kU8, {mxfp8_scale_bytes(5, 64) - 16});
  call_error([&](auto& a) { a.epilogue.mxfp8_scales = bad.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 scales", "512 bytes", "496"});
}
TEST_F(Checks, Mxfp8ValuesWrongShape) {
  Desc bad(addr(0x90000), kU8, {5, 32});
  call_error([&](auto& a) { a.epilogue.mxfp8_values = bad.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 values", "[5, 64]"});
}
TEST_F(Checks, Mxfp8ValuesWrongDtype) {
  Desc bad(addr(0x90000), kBF16, {5, 64});
  call_error([&](auto& a) { a.epilogue.mxfp8_values = bad.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 values", "float8_e4m3fn", "bfloat16"});
}
TEST_F(Checks, Mxfp8OtherFp8FormatsRejected) {
  // DLPack 1.1 codes: e5m2 = 12 and e4m3fnuz = 11 are not E4M3FN; e8m0fnu = 14 is the scale type.
  Desc e5m2(addr(0x90000), DLDataType{12, 8, 1}, {5, 64});
  call_error([&](auto& a) { a.epilogue.mxfp8_values = e5m2.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 values", "float8_e4m3fn", "got float8_e5m2"});
  Desc scales_e4m3(addr(0xA0000), DLDataType{10, 8, 1}, {mxfp8_scale_bytes(5, 64)});
  call_error([&](auto& a) { a.epilogue.mxfp8_scales = scales_e4m3.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 scales", "float8_e8m0fnu"});
  Desc values_e4m3(addr(0x90000), DLDataType{10, 8, 1}, {5, 64});
  Desc scales_e8m0(addr(0xA0000), DLDataType{14, 8, 1}, {mxfp8_scale_bytes(5, 64)});
  AllReduceMHCCallArgs a = f.call();
  a.epilogue.mxfp8_values = values_e4m3.get();
  a.epilogue.mxfp8_scales = scales_e8m0.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);  // torch's natural MXFP8 dtypes pass
}
TEST(DtypeNames, EveryDlpackCodeByName) {
  // What torch exports (bool 6, complex 5, the 8-bit floats 10-14) named as torch names them, so
  // that a refusal says which dtype was given; an unknown code by number.
  EXPECT_EQ(describe_dtype(DLDataType{6, 8, 1}), "bool");
  EXPECT_EQ(describe_dtype(DLDataType{kDLComplex, 64, 1}), "complex64");
  EXPECT_EQ(describe_dtype(DLDataType{kDLBfloat, 16, 1}), "bfloat16");
  EXPECT_EQ(describe_dtype(DLDataType{kDLFloat, 32, 4}), "float32x4");
  EXPECT_EQ(describe_dtype(DLDataType{12, 8, 1}), "float8_e5m2");
  EXPECT_EQ(describe_dtype(DLDataType{11, 8, 1}), "float8_e4m3fnuz");
  EXPECT_EQ(describe_dtype(DLDataType{14, 8, 1}), "float8_e8m0fnu");
  EXPECT_EQ(describe_dtype(DLDataType{17, 4, 1}), "float4_e2m1fn");
  EXPECT_EQ(describe_dtype(DLDataType{10, 16, 1}), "float8_e4m3fn(bits 16)");
  EXPECT_EQ(describe_dtype(DLDataType{99, 8, 1}), "code99_8");
}
TEST_F(Checks, NegativeAndOverflowingDimensions) {
  Desc neg(addr(0xA0000), kU8, {-1, -512});  // numel 512, but not a tensor
  call_error([&](auto& a) { a.epilogue.mxfp8_scales = neg.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 scales", "non-negative", "[-1, -512]"});
  Desc huge(addr(0x20000), kBF16, {int64_t{1} << 40, int64_t{1} << 30, 4});
  call_error([&](auto& a) { a.epilogue.residual = huge.get(); }, ErrorCode::kInvalidArgument,
             {"residual", "2^48"});
  Desc no_shape(addr(0x10000), kBF16, {5, 64});
  no_shape.t.shape = nullptr;
  call_error([&](auto& a) { a.x = no_shape.get(); }, ErrorCode::kInvalidArgument, {"x:", "no shape"});
}
TEST_F(Checks, StridesAreNamedInTheMessage) {
  Desc bad(addr(0x10000), kBF16, {5, 64});
  bad.with_strides({128, 1});
  call_error([&](auto& a) { a.x = bad.get(); }, ErrorCode::kInvalidArgument, {"x:", "strides [128, 1]"});
}
TEST_F(Checks, LayerInputMissing) {
  call_error([&](auto& a) { a.epilogue.layer_input = nullptr; }, ErrorCode::kInvalidArgument,
             {"layer_input", "got none"});
}
TEST_F(Checks, LayerInputGivenToResidualOnly) {
  call_error([&](auto& a) {
    a.epilogue.pre = a.epilogue.norm_weight = nullptr;
    a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr;
  }, ErrorCode::kInvalidArgument, {"layer_input", "residual-only"});
}
TEST_F(Checks, EpsNegativeOrNaN) {
  call_error([&](auto& a) { a.epilogue.eps = -1.0f; }, ErrorCode::kInvalidArgument, {"eps"});
  call_error([&](auto& a) { a.epilogue.eps = NAN; }, ErrorCode::kInvalidArgument, {"eps"});
  // A tiny negative eps is named as it is (std::to_string printed -0.000000).
  call_error([&](auto& a) { a.epilogue.eps = -1e-45f; }, ErrorCode::kInvalidArgument, {"eps", "got -1.4"});
  call_error([&](auto& a) { a.epilogue.eps = -3e-7f; }, ErrorCode::kInvalidArgument, {"eps", "got -3.0000001"});
}
TEST_F(Checks, FinalizeIndexDtype) {
  Desc bad(addr(0xD0000), kI64, {5, 3});
  finalize_error([&](auto& a) { a.expanded_idx_to_permuted_idx = bad.get(); },
                 ErrorCode::kInvalidArgument, {"expanded_idx_to_permuted_idx", "int32", "int64"});
}
TEST_F(Checks, FinalizeTopKMismatch) {
  Desc bad(addr(0xC0000), kF32, {5, 4});
  finalize_error([&](auto& a) { a.expert_weights = bad.get(); }, ErrorCode::kInvalidArgument,
                 {"expert_weights", "top_k=3", "[5, 4]"});
}
TEST_F(Checks, FinalizeWeightsDtype) {
  Desc bad(addr(0xC0000), kBF16, {5, 3});
  finalize_error([&](auto& a) { a.expert_weights = bad.get(); }, ErrorCode::kInvalidArgument,
                 {"expert_weights", "float32"});
}
TEST_F(Checks, FinalizeGemm2Shape) {
  Desc bad(addr(0xB0000), kBF16, {11, 32});
  finalize_error([&](auto& a) { a.gemm2_permuted = bad.get(); }, ErrorCode::kInvalidArgument,
                 {"gemm2_permuted", "[rows, 64]"});
}
// A rank that holds no route: gemm2_permuted of 0 rows, sliced from a wider buffer (strides
// [2H, 1], data null, as torch.empty(0, 2 * H)[:, :H]): no element, contiguous as PyTorch says.
TEST_F(Checks, FinalizeGemm2OfNoRowsWithAnyStrides) {
  Desc none(nullptr, kBF16, {0, 64});
  none.with_strides({128, 1});
  AllReduceMHCFinalizeArgs a = f.finalize();
  a.gemm2_permuted = none.get();
  EXPECT_EQ(check_all_reduce_mhc_finalize(f.cfg, 0, a), 5);
}
TEST_F(Checks, FinalizeSharedRowsDisagree) {
  Desc bad(addr(0xE0000), kBF16, {6, 64});  // M from shared_output: residual then mismatches
  finalize_error([&](auto& a) { a.shared_output = bad.get(); }, ErrorCode::kInvalidArgument,
                 {"[6, 3]", "[5, 3]"});
}

// Outputs in memory of their own: an output overlapping an input or another output is refused
// (wrong bits otherwise); residual_out being residual itself (the same bytes) is the in-place
// update the API allows.
TEST_F(Checks, OverlappingOutputsRefusedInPlaceResidualAllowed) {
  const int64_t m = 5, hc = 4, h = 64;
  AllReduceMHCCallArgs in_place = f.call();
  in_place.epilogue.residual_out = in_place.epilogue.residual;
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, in_place), 5);
  AllReduceMHCFinalizeArgs fin_in_place = f.finalize();
  fin_in_place.epilogue.residual_out = fin_in_place.epilogue.residual;
  EXPECT_EQ(check_all_reduce_mhc_finalize(f.cfg, 0, fin_in_place), 5);
  // residual_out one row past residual (shifted): overlaps it, not the same bytes.
  Desc shifted(addr(0x20000 + hc * h * 2), kBF16, {m, hc, h});
  call_error([&](auto& a) { a.epilogue.residual_out = shifted.get(); }, ErrorCode::kInvalidArgument,
             {"residual_out", "overlapping residual"});
  Desc on_x(addr(0x10000), kBF16, {m, h});  // layer_input = x
  call_error([&](auto& a) { a.epilogue.layer_input = on_x.get(); }, ErrorCode::kInvalidArgument,
             {"layer_input", "overlapping x"});
  Desc in_out(addr(0x70000 + 1024), kBF16, {m, h});  // layer_input inside residual_out
  call_error([&](auto& a) { a.epilogue.layer_input = in_out.get(); }, ErrorCode::kInvalidArgument,
             {"residual_out and layer_input", "separate memory"});
  Desc scales_on_values(addr(0x90000 + 64), kU8, {mxfp8_scale_bytes(m, h)});  // one buffer for both
  call_error([&](auto& a) { a.epilogue.mxfp8_scales = scales_on_values.get(); }, ErrorCode::kInvalidArgument,
             {"mxfp8 values and mxfp8 scales", "separate memory"});
  Desc on_norm(addr(0x60000), kBF16, {m, h});  // layer_input over the norm weight
  call_error([&](auto& a) { a.epilogue.layer_input = on_norm.get(); }, ErrorCode::kInvalidArgument,
             {"layer_input", "overlapping norm_weight"});
  Desc on_gemm2(addr(0xB0000 + 128), kBF16, {m, h});
  finalize_error([&](auto& a) { a.epilogue.layer_input = on_gemm2.get(); }, ErrorCode::kInvalidArgument,
                 {"layer_input", "overlapping gemm2_permuted"});
  Desc on_shared(addr(0xE0000), kBF16, {m, hc, h});
  finalize_error([&](auto& a) { a.epilogue.residual_out = on_shared.get(); }, ErrorCode::kInvalidArgument,
                 {"residual_out", "overlapping shared_output"});
  // An output whose bytes would wrap past the top of the address space (only a hand-built
  // DLTensor has one) covered "nothing" to the overlap test: refused, whatever lies below it.
  Desc wrapping(addr(~uintptr_t{0} - 0xFF), kBF16, {m, hc, h});  // 16-byte aligned, 256 bytes below 2^64
  call_error([&](auto& a) { a.epilogue.residual_out = wrapping.get(); }, ErrorCode::kInvalidArgument,
             {"residual_out", "inside the address space", "wrap"});
  Desc wrapping_strided(addr(~uintptr_t{0} - 0xFF), kBF16, {m, h});
  wrapping_strided.with_strides({h, 1});
  call_error([&](auto& a) { a.epilogue.layer_input = wrapping_strided.get(); }, ErrorCode::kInvalidArgument,
             {"layer_input", "inside the address space", "wrap"});
  // Adjacent (touching, not overlapping) is fine: layer_input right after residual_out's last byte.
  Desc adjacent(addr(0x70000 + m * hc * h * 2), kBF16, {m, h});
  AllReduceMHCCallArgs a = f.call();
  a.epilogue.layer_input = adjacent.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
}

TEST(ConfigChecks, Limits) {
  auto cfg = [] {
    AllReduceMHCConfig c;
    c.hidden_size = 5120;
    c.hc_mult = 4;
    c.max_num_tokens = 64;
    c.top_k = 6;
    return c;
  };
  EXPECT_NO_THROW(check_all_reduce_mhc_config(cfg(), 2));
  auto c = cfg();
  c.hidden_size = 5124;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"hidden_size", "multiple of 8", "5124"});
  c = cfg();
  c.hidden_size = 5128;
  c.quantize_layer_input = true;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"hidden_size", "multiple of 32", "5128"});
  c = cfg();
  c.hidden_size = 40960;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kUnsupported, {"hidden_size", "32768"});
  c = cfg();
  c.hc_mult = 3;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kUnsupported, {"hc_mult", "got 3"});
  c = cfg();
  c.top_k = 17;  // the kernels' limit, as hc, tp and H: kUnsupported (README's error table)
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kUnsupported, {"top_k", "1..16", "17"});
  c.top_k = 0;  // no route at all: not a top_k
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument, {"top_k", "1..16", "got 0"});
  c = cfg();
  c.max_num_tokens = 0;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument, {"max_num_tokens", "got 0"});
  c.max_num_tokens = int64_t{1} << 53;  // would wrap the mailbox sizes
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"max_num_tokens", "16777216"});
  expect_error([&] { check_all_reduce_mhc_config(cfg(), 3); }, ErrorCode::kUnsupported, {"tp", "got 3"});
  c = cfg();
  c.two_shot_min_rows = -1;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument, {"two_shot_min_rows"});
  c = cfg();
  c.nccl_min_finalize_rows = -5;
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"nccl_min_rows", "got 0 / -5"});
}

TEST(ConfigChecks, Fp8Options) {
  AllReduceMHCConfig c;
  c.hidden_size = 5120;
  c.max_num_tokens = 64;
  c.quantize_layer_input_fp8 = true;
  EXPECT_NO_THROW(check_all_reduce_mhc_config(c, 2));
  c.fp8_ue8m0_scales = true;
  EXPECT_NO_THROW(check_all_reduce_mhc_config(c, 1));
  for (const int64_t h : {7168, 4096, 128}) {
    c.hidden_size = h;
    EXPECT_NO_THROW(check_all_reduce_mhc_config(c, 2)) << h;
  }
  c.hidden_size = 5120 + 32;  // a multiple of 32, not of 128
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"hidden_size", "quantize_layer_input_fp8", "multiple of 128", "5152"});
  c.hidden_size = 5120;
  c.quantize_layer_input = true;  // both quantized variants
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"quantize_layer_input and quantize_layer_input_fp8", "got both"});
  c.quantize_layer_input_fp8 = false;  // MXFP8 with the FP8 variant's scale option
  expect_error([&] { check_all_reduce_mhc_config(c, 2); }, ErrorCode::kInvalidArgument,
               {"fp8_ue8m0_scales", "quantize_layer_input_fp8=true"});
}

// A valid call of M=5 rows with FP8 outputs for {H=256, hc=4, C=16, top_k=3}, built with the FP8
// variant (and residual_only).
struct Fp8Fixture : CallFixture {
  Desc fvalues, fscales;
  Fp8Fixture() {
    cfg.hidden_size = 256;
    cfg.quantize_layer_input = false;
    cfg.quantize_layer_input_fp8 = true;
    const int64_t h = 256, hc = 4;
    x = Desc(addr(0x10000), kBF16, {m, h});
    residual = Desc(addr(0x20000), kBF16, {m, hc, h});
    norm_weight = Desc(addr(0x60000), kBF16, {h});
    residual_out = Desc(addr(0x70000), kBF16, {m, hc, h});
    layer_input = Desc(addr(0x80000), kBF16, {m, h});
    gemm2 = Desc(addr(0xB0000), kBF16, {11, h});
    shared = Desc(addr(0xE0000), kBF16, {m, h});
    fvalues = Desc(addr(0xF0000), kU8, {m, h});
    fscales = Desc(addr(0xF8000), kF32, {2, 8});  // [G, Mp]: Mp = 8 at M = 5
  }
  AllReduceMHCCallArgs fp8_call() {
    AllReduceMHCCallArgs a = call();
    a.epilogue.mxfp8_values = a.epilogue.mxfp8_scales = nullptr;
    a.epilogue.fp8_values = fvalues.get();
    a.epilogue.fp8_scales = fscales.get();
    return a;
  }
};

class Fp8Checks : public ::testing::Test {
 protected:
  Fp8Fixture f;
  void call_error(const std::function<void(AllReduceMHCCallArgs&)>& mutate, ErrorCode code,
                  std::vector<std::string> parts) {
    AllReduceMHCCallArgs a = f.fp8_call();
    mutate(a);
    expect_error([&] { check_all_reduce_mhc_call(f.cfg, 0, a); }, code, std::move(parts));
  }
};

TEST_F(Fp8Checks, ValidCallsPass) {
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, f.fp8_call()), 5);
  AllReduceMHCFinalizeArgs fin = f.finalize();
  fin.epilogue = f.fp8_call().epilogue;
  EXPECT_EQ(check_all_reduce_mhc_finalize(f.cfg, 0, fin), 5);
  AllReduceMHCCallArgs a = f.fp8_call();
  Desc flat(addr(0xF8000), kF32, {16});  // any contiguous shape of Mp * G floats
  a.epilogue.fp8_scales = flat.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  Desc view(addr(0xF8000), kF32, {5, 2});  // DeepGEMM's / vLLM's MN-major view [M, G], strides [1, Mp]
  view.with_strides({1, 8});
  a.epilogue.fp8_scales = view.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  Desc e4m3(addr(0xF0000), DLDataType{10, 8, 1}, {5, 256});  // torch.float8_e4m3fn values
  a.epilogue.fp8_values = e4m3.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
  a.epilogue.fp8_values = a.epilogue.fp8_scales = nullptr;  // plain call on an FP8 build
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), 5);
}
// A variant the op was not built with: kUnsupported, as for the MXFP8 outputs.
TEST_F(Fp8Checks, NotBuilt) {
  f.cfg.quantize_layer_input_fp8 = false;
  call_error([&](auto&) {}, ErrorCode::kUnsupported, {"fp8 outputs", "quantize_layer_input_fp8=true"});
}
TEST_F(Fp8Checks, TogetherWithMxfp8Outputs) {
  call_error([&](auto& a) {
    a.epilogue.mxfp8_values = f.values.get();
    a.epilogue.mxfp8_scales = f.scales.get();
  }, ErrorCode::kInvalidArgument, {"fp8 outputs", "mxfp8", "both"});
  call_error([&](auto& a) { a.epilogue.mxfp8_values = f.values.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 outputs", "both"});
}
TEST_F(Fp8Checks, WithResidualOnly) {
  call_error([&](auto& a) {
    a.epilogue.pre = a.epilogue.norm_weight = a.epilogue.layer_input = nullptr;
  }, ErrorCode::kInvalidArgument, {"fp8 outputs", "residual-only"});
}
TEST_F(Fp8Checks, HalfGiven) {
  call_error([&](auto& a) { a.epilogue.fp8_scales = nullptr; }, ErrorCode::kInvalidArgument,
             {"fp8 outputs", "only values"});
  call_error([&](auto& a) { a.epilogue.fp8_values = nullptr; }, ErrorCode::kInvalidArgument,
             {"fp8 outputs", "only scales"});
}
TEST_F(Fp8Checks, ValuesShapeAndDtype) {
  Desc shape(addr(0xF0000), kU8, {5, 128});
  call_error([&](auto& a) { a.epilogue.fp8_values = shape.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 values", "[5, 256]", "[5, 128]"});
  Desc e5m2(addr(0xF0000), DLDataType{12, 8, 1}, {5, 256});
  call_error([&](auto& a) { a.epilogue.fp8_values = e5m2.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 values", "float8_e4m3fn"});
  Desc misaligned(addr(0xF0008), kU8, {5, 256});
  call_error([&](auto& a) { a.epilogue.fp8_values = misaligned.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 values", "16-byte aligned"});
}
TEST_F(Fp8Checks, ScalesSizeDtypeLayoutAlignment) {
  Desc small(addr(0xF8000), kF32, {2, 5});  // M * G floats: without the padding rows
  call_error([&](auto& a) { a.epilogue.fp8_scales = small.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "64 bytes", "fp8_group_scale_bytes(5, 256)", "[2, 5]"});
  Desc bytes(addr(0xF8000), kU8, {64});
  call_error([&](auto& a) { a.epilogue.fp8_scales = bytes.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "float32", "uint8"});
  Desc row_major(addr(0xF8000), kF32, {5, 2});  // [M, G] row-major is not the layout
  call_error([&](auto& a) { a.epilogue.fp8_scales = row_major.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "MN-major view [5, 2]", "strides [1, 8]"});
  // Nor the padded row-major [Mp, G] (Mp * G floats: the count fits), whose element [r, g] is
  // not scale(r, g) either.
  Desc padded_row_major(addr(0xF8000), kF32, {8, 2});
  call_error([&](auto& a) { a.epilogue.fp8_scales = padded_row_major.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "[G, Mp] = [2, 8]", "row-major shape [8, 2]", "would not be scale(r, g)"});
  Desc not_aligned_view(addr(0xF8000), kF32, {5, 2});  // columns of M, not Mp, floats
  not_aligned_view.with_strides({1, 5});
  call_error([&](auto& a) { a.epilogue.fp8_scales = not_aligned_view.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "strides [1, 8]", "column stride 5", "tma_aligned_scales=True"});
  Desc strided(addr(0xF8000), kF32, {2, 8});
  strided.with_strides({16, 1});
  call_error([&](auto& a) { a.epilogue.fp8_scales = strided.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "contiguous"});
  Desc misaligned(addr(0xF8004), kF32, {2, 8});
  call_error([&](auto& a) { a.epilogue.fp8_scales = misaligned.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "16-byte aligned", "0xf8004"});
  Desc other_device(addr(0xF8000), kF32, {2, 8}, 1);
  call_error([&](auto& a) { a.epilogue.fp8_scales = other_device.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "cuda:0", "cuda:1"});
  Desc neg(addr(0xF8000), kF32, {-2, -8});
  call_error([&](auto& a) { a.epilogue.fp8_scales = neg.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "non-negative"});
  Desc null_data(nullptr, kF32, {2, 8});
  call_error([&](auto& a) { a.epilogue.fp8_scales = null_data.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "data pointer"});
}
// At M % 4 == 0 a row-major [M, G] tensor holds exactly Mp * G floats, but its element [r, g]
// is not scale(r, g) (at g * Mp + r): refused, not taken for the flat buffer.
// The tensors of an FP8 call of m rows at width h, at fake addresses apart, for the layout tests.
struct Fp8CallOfM {
  Desc x, residual, post, comb, pre, norm_weight, residual_out, layer_input, values;
  Fp8CallOfM(int64_t m, int64_t h, int64_t hc = 4)
      : x(addr(0x10000), kBF16, {m, h}), residual(addr(0x20000), kBF16, {m, hc, h}),
        post(addr(0x30000), kF32, {m, hc}), comb(addr(0x40000), kF32, {m, hc, hc}),
        pre(addr(0x50000), kF32, {m, hc}), norm_weight(addr(0x60000), kBF16, {h}),
        residual_out(addr(0x70000), kBF16, {m, hc, h}), layer_input(addr(0x80000), kBF16, {m, h}),
        values(addr(0xF0000), kU8, {m, h}) {}
  AllReduceMHCCallArgs args(Fp8Fixture& f, const Desc& scales) {
    AllReduceMHCCallArgs a = f.fp8_call();
    a.x = x.get();
    a.epilogue.residual = residual.get();
    a.epilogue.post = post.get();
    a.epilogue.comb = comb.get();
    a.epilogue.pre = pre.get();
    a.epilogue.norm_weight = norm_weight.get();
    a.epilogue.residual_out = residual_out.get();
    a.epilogue.layer_input = layer_input.get();
    a.epilogue.fp8_values = values.get();
    a.epilogue.fp8_scales = scales.get();
    return a;
  }
};
TEST(Fp8ScalesLayout, RowMajorMGRefusedWhereItsCountFits) {
  Fp8Fixture f;
  Fp8CallOfM c(4, 256);
  Desc flat(addr(0xF8000), kF32, {8});
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, flat)), 4);
  Desc g_mp(addr(0xF8000), kF32, {2, 4});  // [G, Mp] row-major: the layout's own storage order
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, g_mp)), 4);
  Desc view(addr(0xF8000), kF32, {4, 2});
  view.with_strides({1, 4});
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, view)), 4);
  Desc row_major(addr(0xF8000), kF32, {4, 2});
  expect_error([&] { check_all_reduce_mhc_call(f.cfg, 0, c.args(f, row_major)); }, ErrorCode::kInvalidArgument,
               {"fp8 scales", "MN-major view [4, 2]", "strides [1, 4]", "row-major shape [4, 2]"});
}
// The same row-major memory with a dimension of size 1 around it ([1, M, G], [M, G, 1]): refused
// too (an adversarial review, 2026-12-05, found them taken for the flat buffer); a flat buffer
// with such a dimension ([1, Mp * G]) is still the flat buffer.
TEST(Fp8ScalesLayout, RowMajorMGWithUnitDimensionsRefused) {
  Fp8Fixture f;
  Fp8CallOfM c(4, 256);
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 4, 2}, std::vector<int64_t>{4, 2, 1},
                                            std::vector<int64_t>{1, 4, 1, 2}}) {
    Desc row_major(addr(0xF8000), kF32, shape);
    expect_error([&] { check_all_reduce_mhc_call(f.cfg, 0, c.args(f, row_major)); }, ErrorCode::kInvalidArgument,
                 {"fp8 scales", "row-major shape", "would not be scale(r, g)"});
  }
  Desc flat(addr(0xF8000), kF32, {1, 8});
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, flat)), 4);
  Desc g_mp(addr(0xF8000), kF32, {1, 2, 4});  // [G, Mp] with a unit dimension: the storage order
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, g_mp)), 4);
}
// At M == G == Mp (M = 40 at H = 5120, or M = 4 at H = 512) [M, G] is also [G, Mp], the
// layout's storage order: the same shape, taken as [G, Mp], not refused.
TEST(Fp8ScalesLayout, MEqualToGroupsIsTheStorageShape) {
  Fp8Fixture f;
  f.cfg.hidden_size = 512;
  Fp8CallOfM c(4, 512);
  Desc g_mp(addr(0xF8000), kF32, {4, 4});
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, c.args(f, g_mp)), 4);
}
// vLLM's per_token_group_quant_fp8(column_major_scales=True, tma_aligned_scales=True) allocates
// empty_strided((M, G), (1, Mp)): at M % 4 != 0 its storage ends at the last column's row M - 1,
// (G - 1) * Mp + M floats. The view's extent is what a call writes (fp8_scale_floats), and what
// the overlap check compares: a tensor right after it is apart. The flat buffer: Mp * G.
TEST_F(Fp8Checks, ViewWritesItsExtentOnly) {
  const int64_t m = 5, h = 256, mp = 8, groups = 2;
  Desc view(addr(0xF8000), kF32, {m, groups});
  view.with_strides({1, mp});
  EXPECT_EQ(fp8_scale_floats(view.t, m, h), (groups - 1) * mp + m);
  EXPECT_EQ(fp8_scale_floats(f.fscales.t, m, h), mp * groups);  // [G, Mp]
  Desc flat(addr(0xF8000), kF32, {mp * groups});
  EXPECT_EQ(fp8_scale_floats(flat.t, m, h), mp * groups);
  Desc one_row(addr(0xF8000), kF32, {1, groups});  // M = 1: the row's stride does not matter
  one_row.with_strides({7, 4});
  EXPECT_EQ(fp8_scale_floats(one_row.t, 1, h), 4 + 1);
  // G = 1 (H = 128): a compact [M, 1] is the view whether its strides are given or null.
  Desc column(addr(0xF8000), kF32, {m, 1}), column_strided(addr(0xF8000), kF32, {m, 1});
  column_strided.with_strides({1, 1});
  EXPECT_EQ(fp8_scale_floats(column.t, m, 128), m);
  EXPECT_EQ(fp8_scale_floats(column_strided.t, m, 128), m);
  AllReduceMHCCallArgs a = f.fp8_call();
  a.epilogue.fp8_scales = view.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), m);
  // post (FP32, 4-byte aligned) right after the view's 13 floats, inside the Mp * G = 16 of a
  // flat buffer: apart from the view; one float earlier it overlaps the view's last scale.
  Desc post_after(addr(0xF8000 + 4 * ((groups - 1) * mp + m)), kF32, {m, 4});
  a.epilogue.post = post_after.get();
  EXPECT_EQ(check_all_reduce_mhc_call(f.cfg, 0, a), m);
  Desc post_inside(addr(0xF8000 + 4 * ((groups - 1) * mp + m) - 4), kF32, {m, 4});
  a.epilogue.post = post_inside.get();
  expect_error([&] { check_all_reduce_mhc_call(f.cfg, 0, a); }, ErrorCode::kInvalidArgument,
               {"fp8 scales", "apart from every input", "post"});
}
TEST_F(Fp8Checks, ScalesOfOtherM) {
  // M = 4: Mp = 4, 2 * 4 floats; the M = 5 call needs Mp = 8.
  Desc m4(addr(0xF8000), kF32, {2, 4});
  call_error([&](auto& a) { a.epilogue.fp8_scales = m4.get(); }, ErrorCode::kInvalidArgument,
             {"fp8 scales", "64 bytes"});
}

// The FP8 variant's tiling: a group of 128 elements (16 packs, 16 lanes) never straddles the
// CTAs of a row (packs_per_cta a multiple of 16), at every M class, hc and H of the FP8 build,
// and the threads a CTA are those of the default tiling (the streaming grid agreed for it holds).
TEST(LaunchChoice, Fp8TilingKeepsGroupsInOneCta) {
  for (const int64_t h : {int64_t{5120}, int64_t{7168}, int64_t{4096}, int64_t{128}, int64_t{2048}, int64_t{32768}}) {
    const int np = static_cast<int>(h / 8);
    for (const int hc : {1, 2, 4, 8}) {
      for (const int64_t m : {1, 2, 3, 7, 19, 32, 64, 96, 97, 129, 1024}) {
        for (const int ctas : {0, 1, 2, 3, 5, 8}) {
          const kernels::RowTiling t = kernels::row_tiling(np, m, hc, ctas, kernels::kFp8GroupPacks);
          const kernels::RowTiling d = kernels::row_tiling(np, m, hc, ctas);
          EXPECT_EQ(t.packs_per_cta % 16, 0) << "H=" << h << " hc=" << hc << " M=" << m;
          EXPECT_EQ(t.ctas_per_row, d.ctas_per_row);
          EXPECT_EQ(t.threads, d.threads) << "H=" << h << " hc=" << hc << " M=" << m << " ctas=" << ctas;
          EXPECT_GE(static_cast<int64_t>(t.packs_per_cta) * t.ctas_per_row, np);
          EXPECT_LE(t.threads, kernels::max_threads_per_cta(hc));
        }
      }
    }
  }
}

TEST(AllGatherChecks, CapacityAndAccepts) {
  EXPECT_NO_THROW(check_all_gather_config(4096));
  expect_error([] { check_all_gather_config(4100); }, ErrorCode::kInvalidArgument,
               {"rank_capacity_bytes", "multiple of 16", "4100"});
  expect_error([] { check_all_gather_config(0); }, ErrorCode::kInvalidArgument, {"rank_capacity_bytes"});
  Desc in(addr(0x1000), kBF16, {4, 8});  // 64 bytes
  EXPECT_TRUE(all_gather_accepts(64, in.t));
  EXPECT_FALSE(all_gather_accepts(48, in.t));
  Desc odd(addr(0x1000), kBF16, {3, 3});  // 18 bytes
  EXPECT_FALSE(all_gather_accepts(4096, odd.t));
  Desc empty(addr(0x1000), kBF16, {0, 8});
  EXPECT_FALSE(all_gather_accepts(4096, empty.t));
}

// The element offsets of t in row-major element order (what a strided copy reads).
std::vector<int64_t> element_offsets(int ndim, const int64_t* shape, const int64_t* strides) {
  std::vector<int64_t> offs{0};
  for (int d = 0; d < ndim; ++d) {
    std::vector<int64_t> next;
    for (int64_t o : offs) {
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(o + i * strides[d]);
    }
    offs.swap(next);
  }
  return offs;
}
// A non-contiguous input of more than 8 dimensions is copied with its dimensions merged (the
// strided copy takes 8): the same elements in the same order; refused where more than 8 remain.
TEST(AllGatherChecks, CoalescedDimsKeepTheElementOrder) {
  // x[..., ::2] of a compact [2, 3, 2, 2, 2, 2, 2, 2, 2, 4] with size-1 dims of odd strides
  // put between: 10 dims above size 1, merging into one of stride 2, and a second case with
  // one dim transposed (two runs).
  const std::vector<int64_t> shape{2, 1, 3, 2, 2, 2, 1, 2, 2, 2, 2, 2};
  // The innermost 2 at stride 2 (every other element of 4), each outer dim the inner extent.
  const std::vector<int64_t> fixed{1536, 7, 512, 256, 128, 64, 5, 32, 16, 8, 4, 2};
  Desc t(addr(0x1000), kBF16, shape);
  t.with_strides(fixed);
  int64_t sh[16], st[16];
  int n = coalesce_dims(t.t, sh, st, 8);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(st[0], 2);
  EXPECT_EQ(element_offsets(n, sh, st), element_offsets(t.t.ndim, t.t.shape, t.t.strides));
  std::vector<int64_t> swapped_shape = shape, swapped = fixed;  // dims 3 and 4 transposed
  std::swap(swapped[3], swapped[4]);
  Desc u(addr(0x1000), kBF16, swapped_shape);
  u.with_strides(swapped);
  n = coalesce_dims(u.t, sh, st, 8);
  ASSERT_GE(n, 2);
  ASSERT_LE(n, 8);
  EXPECT_EQ(element_offsets(n, sh, st), element_offsets(u.t.ndim, u.t.shape, u.t.strides));
  // Nine dimensions of 2 that no merge joins (every stride 3x the inner extent): refused.
  std::vector<int64_t> nine(9, 2), gaps(9);
  int64_t g = 1;
  for (int i = 8; i >= 0; --i, g *= 6) gaps[i] = g;
  Desc apart(addr(0x1000), kBF16, nine);
  apart.with_strides(gaps);
  EXPECT_EQ(coalesce_dims(apart.t, sh, st, 8), -1);
  EXPECT_EQ(coalesce_dims(apart.t, sh, st, 9), 9);
  Desc seventeen(addr(0x1000), kBF16, std::vector<int64_t>(17, 1));
  EXPECT_EQ(coalesce_dims(seventeen.t, sh, st, 8), -1);  // beyond DLTensors' 16 dims
  // Compact (no strides): one dimension.
  Desc compact(addr(0x1000), kBF16, nine);
  EXPECT_EQ(coalesce_dims(compact.t, sh, st, 8), 1);
  EXPECT_EQ(sh[0], 512);
  EXPECT_EQ(st[0], 1);
}

// The output may not overlap the input (wrong bits otherwise): in-place (the input being this
// rank's rows of the output) refused too; adjacent tensors are apart; a strided input's span.
TEST(AllGatherChecks, OutputApartFromInput) {
  Desc in(addr(0x10000), kBF16, {4, 8});  // 64 bytes
  Desc shifted(addr(0x10010), kBF16, {16, 8});
  expect_error([&] { check_all_gather_call(4096, 4, 0, in.t, shifted.t); }, ErrorCode::kInvalidArgument,
               {"output", "overlapping the input", "0x10010"});
  Desc own_rows(addr(0x10000 - 64), kBF16, {16, 8});  // rank 1's rows of the output are `in`
  expect_error([&] { check_all_gather_call(4096, 4, 0, in.t, own_rows.t); }, ErrorCode::kInvalidArgument,
               {"output", "in-place"});
  Desc after(addr(0x10040), kBF16, {16, 8});
  EXPECT_FALSE(check_all_gather_call(4096, 4, 0, in.t, after.t));
  Desc before(addr(0x10000 - 256), kBF16, {16, 8});
  EXPECT_FALSE(check_all_gather_call(4096, 4, 0, in.t, before.t));
  Desc strided(addr(0x20000), kBF16, {4, 8});  // every other row of a [8, 8]: bytes [0, 3 * 32 + 16)
  strided.with_strides({16, 1});
  Desc on_last_row(addr(0x20000 + 3 * 32), kBF16, {16, 8});
  expect_error([&] { check_all_gather_call(4096, 4, 0, strided.t, on_last_row.t); },
               ErrorCode::kInvalidArgument, {"output", "overlapping"});
  Desc after_strided(addr(0x20000 + 3 * 32 + 16), kBF16, {16, 8});
  EXPECT_TRUE(check_all_gather_call(4096, 4, 0, strided.t, after_strided.t));  // copied first
  // Strides whose reach overflows int64 (only a hand-built DLTensor has them): refused.
  Desc far(addr(0x20000), kBF16, {4, 8});
  far.with_strides({int64_t{1} << 62, 1});
  expect_error([&] { check_all_gather_call(4096, 4, 0, far.t, after_strided.t); }, ErrorCode::kInvalidArgument,
               {"input", "2^62"});
}

// Found by an adversarial review (0dd9eb6): shapes read before their dimensions were checked,
// element sizes whose product with the element count wrapped, null data pointers.
TEST_F(Checks, FinalizeTensorsWithoutShapeOrWithTooManyDims) {
  int64_t two[2] = {5, 3};
  for (const char* which : {"gemm2_permuted", "expert_weights", "expanded_idx_to_permuted_idx"}) {
    for (int ndim : {2, 3, 100000}) {
      AllReduceMHCFinalizeArgs a = f.finalize();
      Desc d = std::string(which) == "gemm2_permuted" ? f.gemm2 : std::string(which) == "expert_weights" ? f.weights : f.routes;
      d.t.ndim = ndim;
      d.t.shape = ndim == 100000 ? two : nullptr;
      if (std::string(which) == "gemm2_permuted") a.gemm2_permuted = d.get();
      else if (std::string(which) == "expert_weights") a.expert_weights = d.get();
      else a.expanded_idx_to_permuted_idx = d.get();
      expect_error([&] { check_all_reduce_mhc_finalize(f.cfg, 0, a); }, ErrorCode::kInvalidArgument,
                   {which, "0 to 16 dimensions"});
    }
  }
}
TEST_F(Checks, NullDataPointer) {
  Desc x(nullptr, kBF16, {5, 64});
  call_error([&](auto& a) { a.x = x.get(); }, ErrorCode::kInvalidArgument, {"x:", "null"});
  Desc out(nullptr, kBF16, {5, 4, 64});
  call_error([&](auto& a) { a.epilogue.residual_out = out.get(); }, ErrorCode::kInvalidArgument,
             {"residual_out", "null"});
}

TEST(AllGatherChecks, WideElementsAndHugeProductsAreRefused) {
  // 3.4e13 elements of 544,048 bytes: the byte count wrapped to 432 and was accepted.
  Desc in(addr(0x1000), DLDataType{kDLFloat, 128, 34003}, {49063, 661, 1045507});
  Desc out(addr(0x2000), DLDataType{kDLFloat, 128, 34003}, {392504, 661, 1045507});
  EXPECT_FALSE(all_gather_accepts(1 << 20, in.t));
  expect_error([&] { check_all_gather_call(1 << 20, 8, 0, in.t, out.t); }, ErrorCode::kInvalidArgument,
               {"input"});
  Desc wide(addr(0x1000), DLDataType{kDLFloat, 128, 34003}, {1});
  expect_error([&] { check_all_gather_call(1 << 20, 8, 0, wide.t, wide.t); }, ErrorCode::kInvalidArgument,
               {"input", "at most 64 bytes"});
  // A product of 2^64 + 16 bytes of uint8: accepts() said true, the call refused it.
  Desc wrap(addr(0x1000), kU8, {4043312912, 4562284561});
  EXPECT_FALSE(all_gather_accepts(int64_t{1} << 33, wrap.t));
  // A scalar: accepts() said true, the call refused it.
  Desc scalar(addr(0x1000), DLDataType{kDLFloat, 32, 4}, {});
  EXPECT_FALSE(all_gather_accepts(4096, scalar.t));
  // Null data, and capacities whose mailbox sizes would wrap.
  Desc null_in(nullptr, kF32, {4, 4}), good_out(addr(0x2000), kF32, {8, 4});
  expect_error([&] { check_all_gather_call(4096, 2, 0, null_in.t, good_out.t); }, ErrorCode::kInvalidArgument,
               {"input", "null"});
  expect_error([] { check_all_gather_config((int64_t{1} << 62) + 16); }, ErrorCode::kInvalidArgument,
               {"rank_capacity_bytes", "2^35"});
  EXPECT_NO_THROW(check_all_gather_config(int64_t{1} << 35));
}

TEST(AllGatherChecks, CallErrors) {
  Desc in(addr(0x1000), kF32, {4, 4});  // 64 bytes
  Desc out(addr(0x2000), kF32, {8, 4});
  EXPECT_FALSE(check_all_gather_call(4096, 2, 0, in.t, out.t));
  Desc big(addr(0x1000), kF32, {2048, 4});
  expect_error([&] { check_all_gather_call(4096, 2, 0, big.t, out.t); }, ErrorCode::kInvalidArgument,
               {"input", "from 16 to 4096", "32768 bytes"});
  // Negative dimensions and sizes that would wrap are not accepted.
  Desc neg_in(addr(0x1000), kU8, {-1, -16}), neg_out(addr(0x2000), kU8, {-2, -16});
  EXPECT_FALSE(all_gather_accepts(4096, neg_in.t));
  expect_error([&] { check_all_gather_call(4096, 2, 0, neg_in.t, neg_out.t); }, ErrorCode::kInvalidArgument,
               {"input", "non-negative"});
  Desc wrap(addr(0x1000), kU8, {(int64_t{1} << 62) + 4, 4});
  EXPECT_FALSE(all_gather_accepts(4096, wrap.t));
  Desc fp4(addr(0x1000), DLDataType{kDLFloat, 4, 1}, {32});  // 16 bytes of 4-bit elements
  expect_error([&] { check_all_gather_call(4096, 2, 0, fp4.t, out.t); }, ErrorCode::kInvalidArgument,
               {"input", "whole-byte"});
  Desc out_dtype(addr(0x2000), kI32, {8, 4});
  expect_error([&] { check_all_gather_call(4096, 2, 0, in.t, out_dtype.t); }, ErrorCode::kInvalidArgument,
               {"output", "float32", "int32"});
  Desc out_shape(addr(0x2000), kF32, {4, 4});
  expect_error([&] { check_all_gather_call(4096, 2, 0, in.t, out_shape.t); }, ErrorCode::kInvalidArgument,
               {"output", "[8, 4]", "[4, 4]"});
  Desc out_mis(addr(0x2004), kF32, {8, 4});
  expect_error([&] { check_all_gather_call(4096, 2, 0, in.t, out_mis.t); }, ErrorCode::kInvalidArgument,
               {"output", "16-byte aligned"});
  Desc out_dev(addr(0x2000), kF32, {8, 4}, 1);
  expect_error([&] { check_all_gather_call(4096, 2, 0, in.t, out_dev.t); }, ErrorCode::kInvalidArgument,
               {"output", "cuda:0"});
  // A misaligned or strided input is accepted, to be copied first.
  Desc in_mis(addr(0x1004), kF32, {4, 4});
  EXPECT_TRUE(check_all_gather_call(4096, 2, 0, in_mis.t, out.t));
  Desc in_strided(addr(0x1000), kF32, {4, 4});
  in_strided.with_strides({8, 1});
  EXPECT_TRUE(check_all_gather_call(4096, 2, 0, in_strided.t, out.t));
}

}  // namespace
}  // namespace mhccl

namespace mhccl {
namespace {

// The launch-shape overrides of the environment (MHCCL_STREAMING_MIN_ROWS, ...): a bad value
// is refused with the variable's name, never read as 0 or clamped.
TEST(EnvOverrides, IntegersInRangeOnly) {
  constexpr const char* kName = "MHCCL_TEST_ENV_INT";
  long long v = 7;
  ::unsetenv(kName);
  EXPECT_FALSE(detail::env_int(kName, -1, 100, &v));
  EXPECT_EQ(v, 7);
  ::setenv(kName, "", 1);
  EXPECT_FALSE(detail::env_int(kName, -1, 100, &v));
  ::setenv(kName, "-1", 1);
  EXPECT_TRUE(detail::env_int(kName, -1, 100, &v));
  EXPECT_EQ(v, -1);
  ::setenv(kName, "100", 1);
  EXPECT_TRUE(detail::env_int(kName, -1, 100, &v));
  EXPECT_EQ(v, 100);
  for (const char* bad : {"-2", "101", "abc", "12x", "1e3", " 5"}) {
    ::setenv(kName, bad, 1);
    try {
      detail::env_int(kName, -1, 100, &v);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(kName), std::string::npos) << e.what();
    }
  }
  ::unsetenv(kName);
}

// The rank environment (bootstrap.h): a scheme with its rank but not its size (or the reverse)
// ran as a group of one (rank 0 of 1: every process reducing nothing), and " 1" or "+2" were
// read as numbers. Each is refused naming the variable, unless another scheme is set whole (a
// job script exporting WORLD_SIZE for PyTorch, its ranks started by mpirun: that scheme serves).
TEST(RankEnvironment, HalfSetOrMalformedIsRefused) {
  const char* vars[] = {"MHCCL_RANK", "MHCCL_WORLD_SIZE", "MHCCL_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
    ::unsetenv(v);
  }
  // "" when rank_environment() throws kInvalidArgument with `says` in its message, else what it did.
  auto refused = [](const std::string& says) {
    try {
      const RankEnvironment env = rank_environment();
      return "accepted: rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) return std::string("code ") + e.what();
      return std::string(e.what()).find(says) != std::string::npos ? std::string() : std::string(e.what());
    }
  };
  EXPECT_EQ(rank_environment().world_size, 1);
  ::setenv("MHCCL_RANK", "1", 1);
  EXPECT_EQ(refused("MHCCL_RANK is set but MHCCL_WORLD_SIZE is not"), "");
  ::setenv("MHCCL_WORLD_SIZE", "", 1);  // empty: not set
  EXPECT_EQ(refused("MHCCL_RANK is set but MHCCL_WORLD_SIZE is not"), "");
  ::unsetenv("MHCCL_RANK");
  ::unsetenv("MHCCL_WORLD_SIZE");
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_EQ(refused("WORLD_SIZE is set but RANK is not"), "");
  // Another scheme set whole serves; WORLD_SIZE=1 alone is a group of one.
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(rank_environment().source, "mpirun");
  EXPECT_EQ(rank_environment().rank, 1);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("WORLD_SIZE", "1", 1);
  EXPECT_EQ(rank_environment().world_size, 1);
  ::unsetenv("WORLD_SIZE");
  for (const char* bad : {" 1", "+1", "1 ", "0x1", "-0", "1048577", "99999999999999999999"}) {
    ::setenv("MHCCL_RANK", bad, 1);
    ::setenv("MHCCL_WORLD_SIZE", "2", 1);
    EXPECT_EQ(refused("MHCCL_RANK: expected a rank count or index"), "") << "MHCCL_RANK='" << bad << "'";
  }
  ::setenv("MHCCL_RANK", "1", 1);
  ::setenv("MHCCL_WORLD_SIZE", "2", 1);
  const RankEnvironment env = rank_environment();
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.source, "mhccl-launch");
  for (const char* v : vars) ::unsetenv(v);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace
}  // namespace mhccl

namespace mhccl {
namespace {

// The launch choice of the consumer (kernels::consumer_streams, host code): which calls run as
// the streaming grid. A function of the params only, so every rank decides alike (I7).
TEST(LaunchChoice, StreamingConsumerRules) {
  using kernels::ConsumerInput;
  kernels::ConsumerParams p = {};
  p.tiling = kernels::RowTiling{1, 640, 640};
  p.streaming_ctas = 132;
  p.streaming_min_rows = -1;
  auto streams = [&](int64_t m, ConsumerInput in) {
    p.m = m;
    return kernels::consumer_streams(p, in);
  };
  // Direct (TP=1 call and finalize, NCCL fallback): automatic when M exceeds the grid.
  EXPECT_FALSE(streams(132, ConsumerInput::kDirect));
  EXPECT_TRUE(streams(133, ConsumerInput::kDirect));
  EXPECT_FALSE(streams(132, ConsumerInput::kFinalize));
  p.fin.top_k = 6;
  EXPECT_TRUE(streams(133, ConsumerInput::kFinalize));
  p.fin.top_k = 10;  // routes beyond the staged group of 8: only when asked
  EXPECT_FALSE(streams(4096, ConsumerInput::kFinalize));
  p.streaming_min_rows = 2;
  EXPECT_TRUE(streams(2, ConsumerInput::kFinalize));
  p.streaming_min_rows = -1;
  // One-shot with its publishing CTAs: automatic from kPollStreamingMinRows.
  p.publisher_ctas = 16;
  EXPECT_FALSE(streams(kernels::kPollStreamingMinRows - 1, ConsumerInput::kPoll));
  EXPECT_TRUE(streams(kernels::kPollStreamingMinRows, ConsumerInput::kPoll));
  p.publish_first = true;  // a single launch never streams
  EXPECT_FALSE(streams(4096, ConsumerInput::kPoll));
  p.publish_first = false;
  // Two-shot (contributions given): automatic only as the consumer after its publish and owners'
  // kernels (no roles), from kPollStreamingMinRows; with roles only when asked, like the others.
  int dummy = 0;
  p.contributions = &dummy;
  p.publisher_ctas = 0;
  EXPECT_FALSE(streams(kernels::kPollStreamingMinRows - 1, ConsumerInput::kPoll));
  EXPECT_TRUE(streams(kernels::kPollStreamingMinRows, ConsumerInput::kPoll));
  p.publisher_ctas = 16;
  p.reducer_ctas = 16;
  EXPECT_FALSE(streams(8192, ConsumerInput::kPoll));
  p.streaming_min_rows = 2;
  EXPECT_TRUE(streams(2, ConsumerInput::kPoll));
  EXPECT_FALSE(streams(1, ConsumerInput::kPoll));  // a single row never streams
  // The role CTAs must leave consumers in the grid; rows wider than a CTA and a grid that
  // cannot run (0) never stream; 0 rows asked: never.
  p.streaming_ctas = 32;
  EXPECT_FALSE(streams(100, ConsumerInput::kPoll));
  p.streaming_ctas = 33;
  EXPECT_TRUE(streams(100, ConsumerInput::kPoll));
  p.tiling.ctas_per_row = 2;
  EXPECT_FALSE(streams(100, ConsumerInput::kPoll));
  p.tiling.ctas_per_row = 1;
  p.streaming_ctas = 0;
  p.publisher_ctas = p.reducer_ctas = 0;
  EXPECT_FALSE(streams(100, ConsumerInput::kDirect));
  p.streaming_ctas = 132;
  p.streaming_min_rows = 0;
  EXPECT_FALSE(streams(100000, ConsumerInput::kDirect));
}

}  // namespace
}  // namespace mhccl
