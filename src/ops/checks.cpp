// Host-side argument checks (include/mhccl/checks.h). Pure C++: no CUDA call, no dereference.
#include "mhccl/checks.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <cstdio>
#include <vector>

#include "common/hash.h"
#include "kernels/params.h"
#include "mhccl/error.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"

namespace mhccl {
namespace {

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, msg); }
[[noreturn]] void unsupported(const std::string& msg) { throw Error(ErrorCode::kUnsupported, msg); }

// DLPack >= 1.1 type codes of the 8-bit float formats MXFP8 uses, and of bool (for messages;
// the DLPack 0.6 header lacks them; the values are DLPack's).
constexpr uint8_t kDLFloat8E4M3FN = 10;
constexpr uint8_t kDLFloat8E8M0FNU = 14;
constexpr uint8_t kDLBool = 6;

enum class Kind { kBF16, kF32, kI32, kE4M3Bytes, kUE8M0Bytes };

bool dtype_is(const DLDataType& t, Kind k) {
  if (t.lanes != 1) return false;
  const bool raw_byte = t.bits == 8 && (t.code == kDLInt || t.code == kDLUInt);
  switch (k) {
    case Kind::kBF16: return t.code == kDLBfloat && t.bits == 16;
    case Kind::kF32: return t.code == kDLFloat && t.bits == 32;
    case Kind::kI32: return t.code == kDLInt && t.bits == 32;
    case Kind::kE4M3Bytes: return raw_byte || (t.bits == 8 && t.code == kDLFloat8E4M3FN);
    case Kind::kUE8M0Bytes: return raw_byte || (t.bits == 8 && t.code == kDLFloat8E8M0FNU);
  }
  return false;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBF16: return "bfloat16";
    case Kind::kF32: return "float32";
    case Kind::kI32: return "int32";
    case Kind::kE4M3Bytes: return "float8_e4m3fn (or uint8/int8)";
    case Kind::kUE8M0Bytes: return "float8_e8m0fnu (or uint8/int8)";
  }
  return "?";
}

int align_of(Kind k) { return (k == Kind::kF32 || k == Kind::kI32) ? 4 : 16; }

// Messages are built with std::to_string and snprintf, never iostreams: the library is loaded
// into other runtimes' processes (Python with PyTorch), and its error paths must not depend on
// the host process's C++ locale state.
std::string join_dims(const int64_t* d, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string hex_address(uintptr_t a) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

std::string shape_str(std::initializer_list<int64_t> s) {
  return join_dims(s.begin(), static_cast<int>(s.size()));
}

uintptr_t data_address(const DLTensor& t) {
  return reinterpret_cast<uintptr_t>(t.data) + static_cast<uintptr_t>(t.byte_offset);
}

// Elements of a well-formed tensor (see check_dims).
int64_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

std::string strides_str(const DLTensor& t) {
  if (t.strides == nullptr) return "none (compact)";
  return join_dims(t.strides, t.ndim);
}

// Sizes before anything else: a shape array, no negative dimension, at most 2^48 elements.
void check_dims(const DLTensor& t, const char* name) {
  if (t.ndim < 0 || t.ndim > 16 || (t.ndim > 0 && t.shape == nullptr)) {
    invalid(std::string(name) + ": expected a tensor of 0 to 16 dimensions with a shape array, got ndim " +
            std::to_string(t.ndim) + (t.shape == nullptr ? " and no shape" : ""));
  }
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      invalid(std::string(name) + ": expected non-negative dimensions, got shape " + describe_shape(t));
    }
    if (t.shape[i] > 0 && n > (int64_t{1} << 48) / t.shape[i]) {
      invalid(std::string(name) + ": expected at most 2^48 elements, got shape " + describe_shape(t));
    }
    n *= t.shape[i];
  }
}

// Dtype, device, contiguity and alignment of a present tensor.
void check_storage(const DLTensor& t, const char* name, Kind kind, int device) {
  check_dims(t, name);
  if (!dtype_is(t.dtype, kind)) {
    invalid(std::string(name) + ": expected dtype " + kind_name(kind) + ", got " +
            describe_dtype(t.dtype));
  }
  if (t.device.device_type != kDLCUDA || t.device.device_id != device) {
    invalid(std::string(name) + ": expected a CUDA tensor on device cuda:" + std::to_string(device) +
            ", got " + (t.device.device_type == kDLCUDA ? "cuda:" : "device type ") +
            std::to_string(t.device.device_type == kDLCUDA ? t.device.device_id : int(t.device.device_type)));
  }
  if (!is_contiguous(t)) {
    invalid(std::string(name) + ": expected a contiguous (row-major) tensor, got shape " +
            describe_shape(t) + " with strides " + strides_str(t));
  }
  if (numel(t) > 0 && t.data == nullptr) {
    invalid(std::string(name) + ": expected a data pointer, got null for shape " + describe_shape(t));
  }
  const int align = align_of(kind);
  if (numel(t) > 0 && data_address(t) % align != 0) {
    invalid(std::string(name) + ": expected a " + std::to_string(align) + "-byte aligned data pointer, got " +
            hex_address(data_address(t)));
  }
}

bool shape_is(const DLTensor& t, std::initializer_list<int64_t> s) {
  if (t.ndim != static_cast<int>(s.size())) return false;
  int i = 0;
  for (int64_t d : s) if (t.shape[i++] != d) return false;
  return true;
}

void check_tensor(const DLTensor* t, const char* name, Kind kind,
                  std::initializer_list<int64_t> shape, int device) {
  if (t == nullptr) invalid(std::string(name) + ": expected a tensor, got none");
  check_dims(*t, name);
  if (!shape_is(*t, shape)) {
    invalid(std::string(name) + ": expected shape " + shape_str(shape) + ", got " +
            describe_shape(*t));
  }
  check_storage(*t, name, kind, device);
}

// M of the call from its leading tensor ([M, H] BF16), checked against [1, C].
int64_t leading_rows(const DLTensor* t, const char* name, const AllReduceMHCConfig& c) {
  if (t == nullptr) invalid(std::string(name) + ": expected a tensor, got none");
  check_dims(*t, name);
  if (t->ndim != 2 || t->shape[1] != c.hidden_size) {
    invalid(std::string(name) + ": expected shape [M, " + std::to_string(c.hidden_size) +
            "], got " + describe_shape(*t));
  }
  const int64_t m = t->shape[0];
  if (m < 1 || m > c.max_num_tokens) {
    invalid(std::string(name) + ": expected M (rows) in [1, " + std::to_string(c.max_num_tokens) +
            "] (max_num_tokens), got M=" + std::to_string(m));
  }
  return m;
}

// Whether s is the MN-major view [M, G] with strides [1, Mp] (the stride of a dimension of size
// 1 does not matter).
bool is_fp8_scales_view(const DLTensor& s, int64_t m, int64_t groups, int64_t mp) {
  if (s.ndim != 2 || s.shape[0] != m || s.shape[1] != groups) return false;
  // Null strides are compact ones: [groups, 1] (a compact [M, 1] is the view at G = 1).
  const int64_t row_stride = s.strides == nullptr ? groups : s.strides[0];
  const int64_t column_stride = s.strides == nullptr ? 1 : s.strides[1];
  return (m == 1 || row_stride == 1) && (groups == 1 || column_stride == mp);
}

// The FP32 scales of the FP8 variant, 16-byte aligned (the layout's columns are): a contiguous
// tensor of Mp * G floats (fp8_group_scale_bytes(M, H) bytes), or the MN-major view [M, G] with
// strides [1, Mp] (DeepGEMM's and vLLM's scale tensor; fp8_scale_floats says what is written).
void check_fp8_scales(const DLTensor& s, int64_t m, int64_t h, int device) {
  const char* name = "fp8 scales";
  check_dims(s, name);
  const int64_t mp = fp8_group_scale_rows(m), groups = h / kFp8GroupElems;
  const int64_t want = fp8_group_scale_bytes(m, h);
  if (!dtype_is(s.dtype, Kind::kF32)) {
    invalid(std::string(name) + ": expected dtype float32, got " + describe_dtype(s.dtype));
  }
  if (!is_fp8_scales_view(s, m, groups, mp)) {
    // A row-major [M, G] tensor, or the padded [Mp, G] (at M % 4 != 0), holds Mp * G floats
    // where M % 4 == 0 (or always, padded), but scale(r, g) sits at g * Mp + r, not at r * G + g:
    // refused, so a reader of scales[r, g] never gets the wrong group's scale. Where the shape
    // is also [G, Mp] (rows == G == Mp, e.g. M = 40 at H = 5120), the layout's own storage
    // order, the two cannot be told apart: taken as [G, Mp].
    const bool m_by_g = s.ndim == 2 && s.shape[0] == m && s.shape[1] == groups && m > 1 && groups > 1;
    // Row-major rows by groups, also with dimensions of size 1 around them ([1, M, G], [M, G, 1]:
    // contiguous, the same memory order as [M, G]).
    std::vector<int64_t> sized;
    for (int d = 0; d < s.ndim; ++d) {
      if (s.shape[d] != 1) sized.push_back(s.shape[d]);
    }
    const bool rows_by_g = sized.size() == 2 && (sized[0] == m || sized[0] == mp) && sized[1] == groups &&
                           sized[0] > 1 && groups > 1 && !(sized[0] == groups && groups == mp);
    if (rows_by_g && is_contiguous(s)) {
      invalid(std::string(name) + ": expected the flat buffer of " + std::to_string(mp * groups) +
              " floats, [G, Mp] = " + shape_str({groups, mp}) + ", or the MN-major view " + shape_str({m, groups}) +
              " with strides " + shape_str({1, mp}) + " (scale(r, g) at g * " + std::to_string(mp) +
              " + r), got the row-major shape " + describe_shape(s) + " with strides " + strides_str(s) +
              ", whose element [r, g] would not be scale(r, g)");
    }
    // MN-major but with columns M floats apart (vLLM's column_major_scales without
    // tma_aligned_scales, at M % 4 != 0): the kernels write columns Mp floats apart.
    if (m_by_g && s.strides != nullptr && s.strides[0] == 1) {
      invalid(std::string(name) + ": expected the MN-major view " + shape_str({m, groups}) + " with strides " +
              shape_str({1, mp}) + " (columns of Mp = fp8_group_scale_rows(" + std::to_string(m) + ") = " +
              std::to_string(mp) + " floats, 16-byte aligned as DeepGEMM's TMA-aligned layout; vLLM's "
              "tma_aligned_scales=True) or the flat buffer of " + std::to_string(mp * groups) +
              " floats, got column stride " + std::to_string(s.strides[1]) + " (strides " + strides_str(s) + ")");
    }
    if (numel(s) * 4 != want) {
      invalid(std::string(name) + ": expected " + std::to_string(want) + " bytes (fp8_group_scale_bytes(" +
              std::to_string(m) + ", " + std::to_string(h) + ") = 4 * " + std::to_string(mp) + " * " +
              std::to_string(groups) + ") of float32, or the MN-major view " + shape_str({m, groups}) +
              " with strides " + shape_str({1, mp}) + "; got shape " + describe_shape(s) + " with strides " +
              strides_str(s));
    }
    if (!is_contiguous(s)) {
      invalid(std::string(name) + ": expected a contiguous tensor or the MN-major view " + shape_str({m, groups}) +
              " with strides " + shape_str({1, mp}) + ", got shape " + describe_shape(s) + " with strides " +
              strides_str(s));
    }
  }
  if (s.device.device_type != kDLCUDA || s.device.device_id != device) {
    invalid(std::string(name) + ": expected a CUDA tensor on device cuda:" + std::to_string(device) + ", got " +
            (s.device.device_type == kDLCUDA ? "cuda:" : "device type ") +
            std::to_string(s.device.device_type == kDLCUDA ? s.device.device_id : int(s.device.device_type)));
  }
  if (s.data == nullptr) invalid(std::string(name) + ": expected a data pointer, got null");
  if (data_address(s) % 16 != 0) {
    invalid(std::string(name) + ": expected a 16-byte aligned data pointer (16-byte scale columns), got " +
            hex_address(data_address(s)));
  }
}

// Byte range [first, last) a checked tensor's elements cover, from its data and strides: a
// compact tensor's tensor_bytes; the FP8 scales' MN-major view its extent (fp8_scale_floats);
// a strided all-gather input from its lowest to its highest element. Strides that reach beyond
// 2^62 bytes (only a hand-built DLTensor has them) are refused. An absent tensor, or one without
// elements or a whole-byte dtype, covers nothing.
struct Span {
  const char* name;
  uintptr_t first, last;
};
Span span_of(const DLTensor* t, const char* name) {
  if (t == nullptr) return Span{name, 0, 0};
  const uintptr_t a = data_address(*t);
  const int64_t n = numel(*t), bytes = tensor_bytes(*t);
  if (n <= 0 || bytes < 0) return Span{name, a, a};
  // [a + first, a + last) as a range of addresses: one that wraps past 2^64 or starts below 0
  // (only a hand-built DLTensor has one) would cover "nothing" to the overlap test: refused.
  auto span = [&](__int128 first, __int128 last) {
    const __int128 lo = static_cast<__int128>(a) + first, hi = static_cast<__int128>(a) + last;
    if (lo < 0 || hi > static_cast<__int128>(UINTPTR_MAX)) {
      invalid(std::string(name) + ": expected a tensor inside the address space, got data at " + hex_address(a) +
              " with shape " + describe_shape(*t) + " and strides " + strides_str(*t) +
              ", whose bytes would wrap past it");
    }
    return Span{name, static_cast<uintptr_t>(lo), static_cast<uintptr_t>(hi)};
  };
  if (t->strides == nullptr) return span(0, bytes);
  const int64_t elem = bytes / n;
  __int128 lo = 0, hi = 0;  // element offsets from the data (strides unbounded)
  for (int i = 0; i < t->ndim; ++i) {
    const __int128 reach = static_cast<__int128>(t->shape[i] - 1) * t->strides[i];
    (reach < 0 ? lo : hi) += reach;
  }
  const __int128 limit = __int128{1} << 62;
  if (lo * elem < -limit || (hi + 1) * elem > limit) {
    invalid(std::string(name) + ": expected strides that reach at most 2^62 bytes from its data, got " +
            describe_shape(*t) + " with strides " + strides_str(*t));
  }
  return span(lo * elem, (hi + 1) * elem);
}
bool overlap(const Span& a, const Span& b) {
  return a.first < a.last && b.first < b.last && a.first < b.last && b.first < a.last;
}
// Outputs may not overlap one another or an input: the kernels read inputs and write outputs in
// any order across CTAs, so an overlap gives wrong bits (and ranks that differ). The one
// exception: outputs[0] (residual_out) covering exactly inputs[in_place] (residual), an in-place
// update, where each element is read before it is written by the same thread.
void check_no_overlap(const std::vector<Span>& inputs, const std::vector<Span>& outputs, size_t in_place) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Span& o = outputs[i];
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (overlap(o, outputs[j])) {
        invalid(std::string(o.name) + " and " + outputs[j].name + ": expected outputs in separate memory, got "
                "overlapping ranges [" + hex_address(o.first) + ", " + hex_address(o.last) + ") and [" +
                hex_address(outputs[j].first) + ", " + hex_address(outputs[j].last) + ")");
      }
    }
    for (size_t j = 0; j < inputs.size(); ++j) {
      const Span& in = inputs[j];
      if (!overlap(o, in)) continue;
      if (i == 0 && j == in_place && o.first == in.first && o.last == in.last) continue;
      invalid(std::string(o.name) + ": expected an output apart from every input (only residual_out may be "
              "residual itself, the same tensor), got memory overlapping " + in.name + " ([" +
              hex_address(o.first) + ", " + hex_address(o.last) + ") and [" + hex_address(in.first) + ", " +
              hex_address(in.last) + ")");
    }
  }
}

void check_epilogue(const AllReduceMHCConfig& c, int device, int64_t m, const MHCEpilogueArgs& e,
                    std::vector<Span> inputs) {
  const int64_t h = c.hidden_size, hc = c.hc_mult;
  const bool has_pre = e.pre != nullptr, has_norm = e.norm_weight != nullptr;
  if (has_pre != has_norm) {
    invalid(std::string("pre and norm_weight: expected both given or both absent (residual-only), "
                        "got ") + (has_pre ? "pre without norm_weight" : "norm_weight without pre"));
  }
  const bool residual_only = !has_pre;
  if (residual_only && !c.residual_only) {
    unsupported("pre and norm_weight absent: a residual-only call needs an instance built with "
                "residual_only=true, this one was built without it");
  }
  const bool has_values = e.mxfp8_values != nullptr, has_scales = e.mxfp8_scales != nullptr;
  const bool has_fp8_values = e.fp8_values != nullptr, has_fp8_scales = e.fp8_scales != nullptr;
  const bool has_fp8 = has_fp8_values || has_fp8_scales;
  if (has_fp8 && (has_values || has_scales)) {
    invalid("fp8 outputs: expected either the mxfp8 outputs or the fp8 outputs (one quantized copy), got both");
  }
  if (has_values != has_scales) {
    invalid("mxfp8_out: expected both values and scales, got only " +
            std::string(has_values ? "values" : "scales"));
  }
  if (has_values && residual_only) {
    invalid("mxfp8_out: a residual-only call has no layer input to quantize, got mxfp8 outputs");
  }
  if (has_values && !c.quantize_layer_input) {
    unsupported("mxfp8_out: needs an instance built with quantize_layer_input=true, this one was "
                "built without it");
  }
  if (has_fp8_values != has_fp8_scales) {
    invalid("fp8 outputs: expected both values and scales, got only " +
            std::string(has_fp8_values ? "values" : "scales"));
  }
  if (has_fp8 && residual_only) {
    invalid("fp8 outputs: a residual-only call has no layer input to quantize, got fp8 outputs");
  }
  if (has_fp8 && !c.quantize_layer_input_fp8) {
    unsupported("fp8 outputs: need an instance built with quantize_layer_input_fp8=true, this one was "
                "built without it");
  }
  if (residual_only && e.layer_input != nullptr) {
    invalid("layer_input: a residual-only call writes no layer input, got a layer_input tensor");
  }
  if (!residual_only && e.layer_input == nullptr) {
    invalid("layer_input: expected a [M, H] BF16 output tensor, got none");
  }

  check_tensor(e.residual, "residual", Kind::kBF16, {m, hc, h}, device);
  if (e.post == nullptr) invalid("post: expected a tensor, got none");
  check_dims(*e.post, "post");
  if (!shape_is(*e.post, {m, hc}) && !shape_is(*e.post, {m, hc, 1})) {
    invalid("post: expected shape " + shape_str({m, hc}) + " or " + shape_str({m, hc, 1}) +
            ", got " + describe_shape(*e.post));
  }
  check_storage(*e.post, "post", Kind::kF32, device);
  check_tensor(e.comb, "comb", Kind::kF32, {m, hc, hc}, device);
  if (!residual_only) {
    check_tensor(e.pre, "pre", Kind::kF32, {m, hc}, device);
    check_tensor(e.norm_weight, "norm_weight", Kind::kBF16, {h}, device);
    if (!std::isfinite(e.eps) || e.eps < 0.0f) {
      char got[32];
      std::snprintf(got, sizeof got, "%.9g", static_cast<double>(e.eps));  // -1e-45, not -0.000000
      invalid(std::string("eps: expected a finite RMSNorm epsilon >= 0, got ") + got);
    }
    check_tensor(e.layer_input, "layer_input", Kind::kBF16, {m, h}, device);
  }
  check_tensor(e.residual_out, "residual_out", Kind::kBF16, {m, hc, h}, device);
  if (has_values) {
    check_tensor(e.mxfp8_values, "mxfp8 values", Kind::kE4M3Bytes, {m, h}, device);
    const DLTensor& s = *e.mxfp8_scales;
    check_dims(s, "mxfp8 scales");
    const int64_t want = mxfp8_scale_bytes(m, h);
    if (!dtype_is(s.dtype, Kind::kUE8M0Bytes) || numel(s) != want) {
      invalid("mxfp8 scales: expected " + std::to_string(want) + " bytes (mxfp8_scale_bytes(" +
              std::to_string(m) + ", " + std::to_string(h) + ")) of " + kind_name(Kind::kUE8M0Bytes) +
              ", got " + std::to_string(numel(s)) + " elements of " + describe_dtype(s.dtype));
    }
    check_storage(s, "mxfp8 scales", Kind::kUE8M0Bytes, device);
  }
  if (has_fp8) {
    check_tensor(e.fp8_values, "fp8 values", Kind::kE4M3Bytes, {m, h}, device);
    check_fp8_scales(*e.fp8_scales, m, h, device);
  }
  // Every tensor is well formed here: the byte ranges of the outputs against the inputs'.
  // Absent tensors (residual-only, no quantized output) cover nothing.
  const size_t residual_index = inputs.size();
  inputs.insert(inputs.end(), {span_of(e.residual, "residual"), span_of(e.post, "post"), span_of(e.comb, "comb"),
                               span_of(e.pre, "pre"), span_of(e.norm_weight, "norm_weight")});
  const std::vector<Span> outputs{span_of(e.residual_out, "residual_out"), span_of(e.layer_input, "layer_input"),
                                  span_of(e.mxfp8_values, "mxfp8 values"), span_of(e.mxfp8_scales, "mxfp8 scales"),
                                  span_of(e.fp8_values, "fp8 values"), span_of(e.fp8_scales, "fp8 scales")};
  check_no_overlap(inputs, outputs, residual_index);
}

}  // namespace

std::string describe_dtype(const DLDataType& t) {
  // DLPack 1.1's narrow float formats, codes 7 to 17, by torch's names and their widths.
  struct Narrow {
    const char* name;
    int bits;
  };
  static constexpr Narrow kNarrowFloats[] = {
      {"float8_e3m4", 8},   {"float8_e4m3", 8},     {"float8_e4m3b11fnuz", 8}, {"float8_e4m3fn", 8},
      {"float8_e4m3fnuz", 8}, {"float8_e5m2", 8},   {"float8_e5m2fnuz", 8},    {"float8_e8m0fnu", 8},
      {"float6_e2m3fn", 6}, {"float6_e3m2fn", 6},   {"float4_e2m1fn", 4}};
  constexpr int kFirstNarrow = 7, kNarrowCount = sizeof kNarrowFloats / sizeof kNarrowFloats[0];
  const std::string bits = std::to_string(t.bits);
  std::string s;
  if (t.code >= kFirstNarrow && t.code < kFirstNarrow + kNarrowCount) {
    const Narrow& f = kNarrowFloats[t.code - kFirstNarrow];
    s = f.bits == t.bits ? f.name : std::string(f.name) + "(bits " + bits + ")";
  } else if (t.code == kDLBool) {
    s = t.bits == 8 ? "bool" : "bool(bits " + bits + ")";
  } else {
    switch (t.code) {
      case kDLInt: s = "int" + bits; break;
      case kDLUInt: s = "uint" + bits; break;
      case kDLFloat: s = "float" + bits; break;
      case kDLBfloat: s = "bfloat" + bits; break;
      case kDLComplex: s = "complex" + bits; break;
      default: s = "code" + std::to_string(t.code) + "_" + bits; break;
    }
  }
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

std::string describe_shape(const DLTensor& t) {
  return join_dims(t.shape, t.ndim);
}

int64_t fp8_scale_floats(const DLTensor& scales, int64_t m, int64_t h) {
  const int64_t mp = fp8_group_scale_rows(m), groups = h / kFp8GroupElems;
  return is_fp8_scales_view(scales, m, groups, mp) ? fp8_group_scale_view_floats(m, h) : mp * groups;
}

int coalesce_dims(const DLTensor& t, int64_t* shape, int64_t* strides, int max_dims) {
  if (t.ndim < 0 || t.ndim > 16) return -1;  // DLTensors of at most 16 dims (check_dims)
  int n = 0;
  int64_t dense = 1;  // a compact tensor's strides, innermost first
  int64_t sh[16], st[16];
  for (int i = t.ndim - 1; i >= 0; --i) {  // innermost first
    const int64_t stride = t.strides == nullptr ? dense : t.strides[i];
    dense *= t.shape[i];
    if (t.shape[i] == 1) continue;
    if (n > 0 && stride == st[n - 1] * sh[n - 1]) {
      sh[n - 1] *= t.shape[i];  // i is the outer neighbour of what is merged so far
    } else {
      sh[n] = t.shape[i];
      st[n] = stride;
      ++n;
    }
  }
  if (n > max_dims) return -1;
  for (int k = 0; k < n; ++k) {  // outermost first, as DLPack
    shape[k] = sh[n - 1 - k];
    strides[k] = st[n - 1 - k];
  }
  return n;
}

bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr || numel(t) == 0) return true;  // no element: any strides (as PyTorch)
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

int64_t tensor_bytes(const DLTensor& t) {
  // Whole-byte elements of at most 64 bytes (so that 2^48 elements stay far inside int64).
  const int64_t bits = int64_t(t.dtype.bits) * t.dtype.lanes;
  if (bits <= 0 || bits % 8 != 0 || bits > 512) return -1;
  return numel(t) * (bits / 8);
}

void check_tp(int tp) {
  if (tp != 1 && tp != 2 && tp != 4 && tp != 8) {
    unsupported("tp: expected 1, 2, 4 or 8 ranks on one node, got " + std::to_string(tp));
  }
}

void check_all_reduce_mhc_config(const AllReduceMHCConfig& c, int tp) {
  check_tp(tp);
  if (c.hidden_size <= 0 || c.hidden_size % 8 != 0) {
    invalid("hidden_size: expected a positive multiple of 8 (16-byte rows), got " +
            std::to_string(c.hidden_size));
  }
  if (c.hidden_size > kMaxHidden) {
    unsupported("hidden_size: expected at most " + std::to_string(kMaxHidden) + ", got " +
                std::to_string(c.hidden_size));
  }
  if (c.quantize_layer_input && c.hidden_size % 32 != 0) {
    invalid("hidden_size: quantize_layer_input needs a multiple of 32 (MXFP8 blocks), got " +
            std::to_string(c.hidden_size));
  }
  if (c.quantize_layer_input && c.quantize_layer_input_fp8) {
    invalid("quantize_layer_input and quantize_layer_input_fp8: expected at most one quantized layer "
            "input variant (MXFP8 or per-token-group FP8), got both");
  }
  if (c.fp8_ue8m0_scales && !c.quantize_layer_input_fp8) {
    invalid("fp8_ue8m0_scales: chooses the scales of the FP8 variant, which needs "
            "quantize_layer_input_fp8=true; got fp8_ue8m0_scales without it");
  }
  if (c.quantize_layer_input_fp8 && c.hidden_size % kFp8GroupElems != 0) {
    invalid("hidden_size: quantize_layer_input_fp8 needs a multiple of 128 (groups of 128 elements), got " +
            std::to_string(c.hidden_size));
  }
  if (c.hc_mult != 1 && c.hc_mult != 2 && c.hc_mult != 4 && c.hc_mult != 8) {
    unsupported("hc_mult: expected 1, 2, 4 or 8 residual streams, got " + std::to_string(c.hc_mult));
  }
  if (c.top_k < 1) invalid("top_k: expected 1..16, got " + std::to_string(c.top_k));
  if (c.top_k > kMaxTopK) {  // a limit of the kernels, as hc, tp and H: kUnsupported (README's error table)
    unsupported("top_k: expected 1..16 (the kernels' limit), got " + std::to_string(c.top_k));
  }
  if (c.max_num_tokens < 1 || c.max_num_tokens > kMaxTokens) {
    invalid("max_num_tokens: expected 1 to " + std::to_string(kMaxTokens) + ", got " +
            std::to_string(c.max_num_tokens));
  }
  if (c.single_launch_max_rows < -1 || c.streaming_min_rows < -1) {
    invalid("single_launch_max_rows / streaming_min_rows: expected -1 (automatic), 0 (never) or a row "
            "count, got " + std::to_string(c.single_launch_max_rows) + " / " +
            std::to_string(c.streaming_min_rows));
  }
  if (c.nccl_min_rows < 0 || c.nccl_min_finalize_rows < 0) {
    invalid("nccl_min_rows / nccl_min_finalize_rows: expected >= 0 (0 = never), got " +
            std::to_string(c.nccl_min_rows) + " / " + std::to_string(c.nccl_min_finalize_rows));
  }
  if (c.two_shot_min_rows < 0 || c.two_shot_min_finalize_rows < 0) {
    invalid("two_shot_min_rows / two_shot_min_finalize_rows: expected >= 0 (0 = default), got " +
            std::to_string(c.two_shot_min_rows) + " / " +
            std::to_string(c.two_shot_min_finalize_rows));
  }
}

int64_t check_all_reduce_mhc_call(const AllReduceMHCConfig& c, int device,
                                  const AllReduceMHCCallArgs& a) {
  if (a.x != nullptr && !dtype_is(a.x->dtype, Kind::kBF16)) {
    invalid("x: expected dtype bfloat16, got " + describe_dtype(a.x->dtype));
  }
  const int64_t m = leading_rows(a.x, "x", c);
  check_storage(*a.x, "x", Kind::kBF16, device);
  check_epilogue(c, device, m, a.epilogue, {span_of(a.x, "x")});
  return m;
}

int64_t check_all_reduce_mhc_finalize(const AllReduceMHCConfig& c, int device,
                                      const AllReduceMHCFinalizeArgs& a) {
  if (a.shared_output != nullptr && !dtype_is(a.shared_output->dtype, Kind::kBF16)) {
    invalid("shared_output: expected dtype bfloat16, got " + describe_dtype(a.shared_output->dtype));
  }
  const int64_t m = leading_rows(a.shared_output, "shared_output", c);
  check_storage(*a.shared_output, "shared_output", Kind::kBF16, device);
  const DLTensor* g = a.gemm2_permuted;
  if (g == nullptr) invalid("gemm2_permuted: expected a tensor, got none");
  check_dims(*g, "gemm2_permuted");
  if (g->ndim != 2 || g->shape[1] != c.hidden_size || g->shape[0] < 0) {
    invalid("gemm2_permuted: expected shape [rows, " + std::to_string(c.hidden_size) + "], got " +
            describe_shape(*g));
  }
  if (g->shape[0] > INT32_MAX) {
    invalid("gemm2_permuted: expected fewer than 2^31 rows (int32 routes), got " +
            std::to_string(g->shape[0]));
  }
  check_storage(*g, "gemm2_permuted", Kind::kBF16, device);
  const int64_t k = c.top_k;
  for (auto [t, name, kind] : {std::tuple{a.expert_weights, "expert_weights", Kind::kF32},
                               std::tuple{a.expanded_idx_to_permuted_idx,
                                          "expanded_idx_to_permuted_idx", Kind::kI32}}) {
    if (t == nullptr) invalid(std::string(name) + ": expected a tensor, got none");
    check_dims(*t, name);
    if (!dtype_is(t->dtype, kind)) {
      invalid(std::string(name) + ": expected dtype " + kind_name(kind) + ", got " +
              describe_dtype(t->dtype));
    }
    if (!shape_is(*t, {m, k})) {
      invalid(std::string(name) + ": expected shape [M, top_k] = " + shape_str({m, k}) +
              " (top_k=" + std::to_string(k) + " at construction), got " + describe_shape(*t));
    }
    check_storage(*t, name, kind, device);
  }
  check_epilogue(c, device, m, a.epilogue,
                 {span_of(a.shared_output, "shared_output"), span_of(g, "gemm2_permuted"),
                  span_of(a.expert_weights, "expert_weights"),
                  span_of(a.expanded_idx_to_permuted_idx, "expanded_idx_to_permuted_idx")});
  return m;
}

void check_all_gather_config(int64_t cap) {
  if (cap <= 0 || cap % 16 != 0 || cap > kMaxAllGatherCapacity) {
    invalid("rank_capacity_bytes: expected a positive multiple of 16, at most 2^35, got " +
            std::to_string(cap));
  }
}

uint32_t all_gather_layout_digest(const DLTensor& in) {
  uint64_t h = detail::kFnv1aBasis;
  const auto mix = [&h](uint64_t v) { h = detail::fnv1a(&v, sizeof v, h); };
  mix(in.dtype.code);
  mix(in.dtype.bits);
  mix(in.dtype.lanes);
  mix(static_cast<uint64_t>(in.ndim));
  for (int i = 0; i < in.ndim && in.shape != nullptr; ++i) mix(static_cast<uint64_t>(in.shape[i]));
  constexpr int kBits = static_cast<int>(kernels::kLayoutDigestBits);  // folded to what the identity carries
  return static_cast<uint32_t>((h ^ (h >> kBits) ^ (h >> (2 * kBits))) & ((1u << kBits) - 1));
}

bool all_gather_accepts(int64_t cap, const DLTensor& in) {
  if (in.ndim < 1 || in.ndim > 16 || in.shape == nullptr) return false;
  int64_t n = 1;
  for (int i = 0; i < in.ndim; ++i) {  // the product, without overflow, at most 2^48 (check_dims)
    if (in.shape[i] < 0) return false;
    if (in.shape[i] > 0 && n > (int64_t{1} << 48) / in.shape[i]) return false;
    n *= in.shape[i];
  }
  const int64_t b = tensor_bytes(in);
  return b > 0 && b <= cap && b % 16 == 0;
}

namespace {
std::string device_str(const DLDevice& d) {
  return d.device_type == kDLCUDA ? "cuda:" + std::to_string(d.device_id)
                                  : "device type " + std::to_string(int(d.device_type));
}
}  // namespace

bool check_all_gather_call(int64_t cap, int tp, int device, const DLTensor& in,
                           const DLTensor& out) {
  check_dims(in, "input");
  check_dims(out, "output");
  if (in.ndim < 1) invalid("input: expected at least one dimension, got a scalar");
  if (tensor_bytes(in) < 0) {
    invalid("input: expected whole-byte elements of at most 64 bytes, got dtype " + describe_dtype(in.dtype));
  }
  if (!all_gather_accepts(cap, in)) {
    invalid("input: expected a multiple of 16 bytes, from 16 to " + std::to_string(cap) +
            " (rank_capacity_bytes), got " + std::to_string(tensor_bytes(in)) + " bytes: " +
            describe_shape(in) + " " + describe_dtype(in.dtype));
  }
  if (in.device.device_type != kDLCUDA || in.device.device_id != device) {
    invalid("input: expected a CUDA tensor on device cuda:" + std::to_string(device) + ", got " +
            device_str(in.device));
  }
  if (in.data == nullptr) invalid("input: expected a data pointer, got null");
  if (out.data == nullptr) invalid("output: expected a data pointer, got null");
  if (out.dtype.code != in.dtype.code || out.dtype.bits != in.dtype.bits ||
      out.dtype.lanes != in.dtype.lanes) {
    invalid("output: expected dtype " + describe_dtype(in.dtype) + " (the input's), got " +
            describe_dtype(out.dtype));
  }
  bool shape_ok = out.ndim == in.ndim && out.shape[0] == tp * in.shape[0];
  for (int i = 1; shape_ok && i < in.ndim; ++i) shape_ok = out.shape[i] == in.shape[i];
  if (!shape_ok) {
    std::string want = "[" + std::to_string(tp * in.shape[0]);
    for (int i = 1; i < in.ndim; ++i) want += ", " + std::to_string(in.shape[i]);
    invalid("output: expected shape " + want + "] (tp * input rows), got " + describe_shape(out));
  }
  if (out.device.device_type != kDLCUDA || out.device.device_id != device) {
    invalid("output: expected a CUDA tensor on device cuda:" + std::to_string(device) + ", got " +
            device_str(out.device));
  }
  if (!is_contiguous(out)) {
    invalid("output: expected a contiguous tensor, got shape " + describe_shape(out) +
            " with strides " + strides_str(out));
  }
  if (data_address(out) % 16 != 0) {
    invalid("output: expected a 16-byte aligned data pointer, got " + hex_address(data_address(out)));
  }
  // The output is written while the input is read (strided: the bytes its elements span).
  const Span input = span_of(&in, "input"), output = span_of(&out, "output");
  if (overlap(input, output)) {
    invalid("output: expected a tensor apart from the input, got bytes [" + hex_address(output.first) + ", " +
            hex_address(output.last) + ") overlapping the input's [" + hex_address(input.first) + ", " +
            hex_address(input.last) + ") (an in-place all-gather, the input being this rank's rows of the "
            "output, is not supported: the output is written while the input is read)");
  }
  return !is_contiguous(in) || data_address(in) % 16 != 0;
}

}  // namespace mhccl
