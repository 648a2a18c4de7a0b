#include "common/mhc_harness.h"

#include <algorithm>
#include <cstring>

#include "common/tensor_desc.h"
#include "common/text.h"
#include "mhccl/fp8_groups.h"
#include "mhccl/mxfp8.h"
#include "mhccl/reference.h"

namespace mhccl::testing {


const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kPlain: return "plain";
    case Variant::kMxfp8: return "mxfp8";
    case Variant::kResidualOnly: return "residual-only";
    case Variant::kFp8: return "fp8";
    case Variant::kFp8Ue8m0: return "fp8-ue8m0";
  }
  return "?";
}

bool is_fp8(Variant v) { return v == Variant::kFp8 || v == Variant::kFp8Ue8m0; }

const char* quant_name(Quant q) {
  return q == Quant::kMxfp8 ? "mxfp8" : q == Quant::kFp8 ? "fp8" : "fp8-ue8m0";
}

Variant quant_variant(Quant q) {
  return q == Quant::kMxfp8 ? Variant::kMxfp8 : q == Quant::kFp8 ? Variant::kFp8 : Variant::kFp8Ue8m0;
}

void build_quant(AllReduceMHCConfig& c, Quant q) {
  c.quantize_layer_input = q == Quant::kMxfp8 && c.hidden_size % 32 == 0;
  c.quantize_layer_input_fp8 = q != Quant::kMxfp8 && c.hidden_size % kFp8GroupElems == 0;
  c.fp8_ue8m0_scales = c.quantize_layer_input_fp8 && q == Quant::kFp8Ue8m0;
}

namespace {
// Bytes of the scale buffer of `rows` rows that holds either format.
size_t scale_buffer_bytes(int64_t rows, int64_t h) {
  const int64_t mx = mxfp8_scale_bytes(rows, h % 32 == 0 ? h : 32);
  const int64_t fp8 = h % kFp8GroupElems == 0 ? fp8_group_scale_bytes(rows, h) : 0;
  return static_cast<size_t>(std::max(mx, fp8));
}
int64_t scale_bytes(Variant v, int64_t m, int64_t h) {
  return v == Variant::kMxfp8 ? mxfp8_scale_bytes(m, h) : is_fp8(v) ? fp8_group_scale_bytes(m, h) : 0;
}
}  // namespace

int64_t scale_bytes_written(Variant v, int64_t m, int64_t h) {
  return v == Variant::kFp8Ue8m0 ? 4 * fp8_group_scale_view_floats(m, h) : scale_bytes(v, m, h);
}

CallBuffers::CallBuffers(int64_t rows_, int64_t h_, int hc_, int top_k_)
    : rows(rows_), h(h_), hc(hc_), top_k(top_k_) {
  size_t off = 0;
  std::vector<std::pair<char**, size_t>> parts;
  auto take = [&](char** p, size_t bytes) { parts.push_back({p, bytes}); };
  const size_t mh = static_cast<size_t>(rows * h);
  take(&x, mh * 2);
  take(&gemm2, mh * top_k * 2);
  take(&weights, rows * top_k * 4);
  take(&routes, rows * top_k * 4);
  take(&shared, mh * 2);
  take(&residual, mh * hc * 2);
  take(&post, rows * hc * 4);
  take(&comb, rows * hc * hc * 4);
  take(&pre, rows * hc * 4);
  take(&norm, h * 2);
  take(&res_out, mh * hc * 2);
  take(&layer, mh * 2);
  take(&values, mh);
  take(&scales, scale_buffer_bytes(rows, h));
  std::vector<size_t> offsets;
  for (auto& [p, bytes] : parts) {
    offsets.push_back(off);
    off += (bytes + 255) / 256 * 256;
  }
  mem = DeviceBuffer(off);
  for (size_t i = 0; i < parts.size(); ++i) *parts[i].first = mem.as<char>() + offsets[i];
  output_offset = static_cast<size_t>(res_out - mem.as<char>());
  output_bytes = off - output_offset;
}

uint64_t Outputs::hash() const {
  uint64_t h = fnv1a(residual_out.data(), residual_out.size() * 2);
  h = fnv1a(layer_input.data(), layer_input.size() * 2, h);
  h = fnv1a(values.data(), values.size(), h);
  return fnv1a(scales.data(), scales_written, h);
}

void upload(const Problem& p, int rank, CallBuffers& b) {
  auto put = [](char* dst, const void* src, size_t bytes) {
    if (bytes) MHCCL_TEST_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  };
  MHCCL_TEST_CUDA(cudaMemset(b.mem.as<char>() + b.output_offset, 0xA5, b.output_bytes));
  const size_t mh = static_cast<size_t>(p.m * p.h);
  if (!p.finalize) {
    put(b.x, p.x[rank].data(), mh * 2);
  } else {
    put(b.gemm2, p.gemm2[rank].data(), p.gemm2[rank].size() * 2);
    put(b.weights, p.weights[rank].data(), p.weights[rank].size() * 4);
    put(b.routes, p.routes[rank].data(), p.routes[rank].size() * 4);
    put(b.shared, p.shared[rank].data(), mh * 2);
  }
  put(b.residual, p.residual.data(), p.residual.size() * 2);
  put(b.post, p.post.data(), p.post.size() * 4);
  put(b.comb, p.comb.data(), p.comb.size() * 4);
  put(b.pre, p.pre.data(), p.pre.size() * 4);
  put(b.norm, p.norm_weight.data(), p.norm_weight.size() * 2);
  MHCCL_TEST_CUDA(cudaDeviceSynchronize());  // the legacy stream's copies, before any other stream
}

void launch(AllReduceMHC& op, const Problem& p, Variant v, Protocol protocol,
            CallBuffers& b, int device, cudaStream_t stream) {
  const int64_t m = p.m, h = p.h, hc = p.hc;
  Desc residual(b.residual, kBF16, {m, hc, h}, device);
  Desc post(b.post, kF32, {m, hc}, device);
  Desc comb(b.comb, kF32, {m, hc, hc}, device);
  Desc pre(b.pre, kF32, {m, hc}, device);
  Desc norm(b.norm, kBF16, {h}, device);
  Desc res_out(b.res_out, kBF16, {m, hc, h}, device);
  Desc layer(b.layer, kBF16, {m, h}, device);
  Desc values(b.values, kU8, {m, h}, device);
  Desc scales(b.scales, kU8, {v == Variant::kMxfp8 ? mxfp8_scale_bytes(m, h) : 0}, device);
  // FP8 scales: the contiguous [G, Mp] buffer (kFp8), or the MN-major view [M, G] with strides
  // [1, Mp] that DeepGEMM and vLLM take (kFp8Ue8m0): the checks accept both.
  const int64_t mp = fp8_group_scale_rows(m), groups = h / kFp8GroupElems;
  Desc fp8_scales = v == Variant::kFp8Ue8m0 ? Desc(b.scales, kF32, {m, groups}, device).with_strides({1, mp})
                                            : Desc(b.scales, kF32, {groups, mp}, device);
  MHCEpilogueArgs e;
  e.residual = residual.get();
  e.post = post.get();
  e.comb = comb.get();
  e.eps = p.eps;
  e.residual_out = res_out.get();
  if (v != Variant::kResidualOnly) {
    e.pre = pre.get();
    e.norm_weight = norm.get();
    e.layer_input = layer.get();
  }
  if (v == Variant::kMxfp8) {
    e.mxfp8_values = values.get();
    e.mxfp8_scales = scales.get();
  }
  if (is_fp8(v)) {
    e.fp8_values = values.get();
    e.fp8_scales = fp8_scales.get();
  }
  if (!p.finalize) {
    Desc x(b.x, kBF16, {m, h}, device);
    AllReduceMHCCallArgs a;
    a.x = x.get();
    a.epilogue = e;
    a.protocol = protocol;
    op.call(a, stream);
  } else {
    Desc gemm2(b.gemm2, kBF16, {p.gemm2_rows, h}, device);
    Desc weights(b.weights, kF32, {m, p.top_k}, device);
    Desc routes(b.routes, kI32, {m, p.top_k}, device);
    Desc shared(b.shared, kBF16, {m, h}, device);
    AllReduceMHCFinalizeArgs a;
    a.gemm2_permuted = gemm2.get();
    a.expert_weights = weights.get();
    a.expanded_idx_to_permuted_idx = routes.get();
    a.shared_output = shared.get();
    a.epilogue = e;
    a.protocol = protocol;
    op.finalize(a, stream);
  }
}

Outputs download(const Problem& p, Variant v, const CallBuffers& b) {
  Outputs o;
  const size_t mh = static_cast<size_t>(p.m * p.h);
  auto get = [](auto& vec, size_t n, const char* src) {
    vec.resize(n);
    if (n) MHCCL_TEST_CUDA(cudaMemcpy(vec.data(), src, n * sizeof(vec[0]), cudaMemcpyDeviceToHost));
  };
  get(o.residual_out, mh * p.hc, b.res_out);
  if (v != Variant::kResidualOnly) get(o.layer_input, mh, b.layer);
  if (v == Variant::kMxfp8 || is_fp8(v)) {
    get(o.values, mh, b.values);
    get(o.scales, static_cast<size_t>(scale_bytes(v, p.m, p.h)), b.scales);
    o.scales_written = static_cast<size_t>(scale_bytes_written(v, p.m, p.h));
  }
  return o;
}

std::string check(const Problem& p, Variant v, const Outputs& got) {
  detail::Text o;  // no iostream: the Python extension links this (src/common/text.h)
  const std::vector<uint16_t> y = reference_y(p);
  const size_t mh = static_cast<size_t>(p.m * p.h);
  const bool residual_only = v == Variant::kResidualOnly;
  const reference::MHCProblem mp = p.mhc(residual_only);
  std::vector<uint16_t> res_out(mh * p.hc), layer(residual_only ? 0 : mh);
  // Rows [b, e) of the problem (the reference's rows are independent), for the thread pool.
  auto rows = [&mp](int64_t b, int64_t e) {
    reference::MHCProblem q = mp;
    q.m = e - b;
    q.residual += b * mp.hc * mp.h;
    q.post += b * mp.hc;
    q.comb += b * mp.hc * mp.hc;
    if (q.pre != nullptr) q.pre += b * mp.hc;
    return q;
  };
  parallel_for(p.m, 64, [&](int64_t b, int64_t e) {
    reference::mhc_epilogue(rows(b, e), y.data() + b * p.h, res_out.data() + b * p.hc * p.h,
                            residual_only ? nullptr : layer.data() + b * p.h);
  });
  for (size_t i = 0; i < res_out.size(); ++i) {
    if (got.residual_out[i] != res_out[i]) {
      o << "residual_out[" << i / (p.hc * p.h) << ", " << (i / p.h) % p.hc << ", " << i % p.h
        << "] = 0x" << detail::hex_text(got.residual_out[i]) << ", reference 0x"
        << detail::hex_text(res_out[i]);
      return o.str();
    }
  }
  if (residual_only) return "";
  std::vector<double> fp64(mh);
  parallel_for(p.m, 64, [&](int64_t b, int64_t e) {
    reference::layer_input_fp64(rows(b, e), got.residual_out.data() + b * p.hc * p.h, fp64.data() + b * p.h);
  });
  for (size_t i = 0; i < mh; ++i) {
    const double d = reference::bf16_ulp_distance(got.layer_input[i], fp64[i]);
    if (!(d <= 1.0)) {
      o << "layer_input[" << i / p.h << ", " << i % p.h << "] = 0x" << detail::hex_text(got.layer_input[i])
        << ", " << d << " ulp from FP64 " << fp64[i];
      return o.str();
    }
  }
  if (v == Variant::kMxfp8) {
    std::vector<uint8_t> values(mh), scales(static_cast<size_t>(mxfp8_scale_bytes(p.m, p.h)));
    reference::mxfp8_quantize(got.layer_input.data(), p.m, p.h, values.data(), scales.data());
    for (size_t i = 0; i < mh; ++i) {
      if (got.values[i] != values[i]) {
        o << "mxfp8 value [" << i / p.h << ", " << i % p.h << "] = 0x" << detail::hex_text(got.values[i])
          << ", reference 0x" << detail::hex_text(values[i]);
        return o.str();
      }
    }
    for (size_t i = 0; i < scales.size(); ++i) {
      if (got.scales[i] != scales[i]) {
        o << "mxfp8 scale byte " << i << " = " << int(got.scales[i]) << ", reference " << int(scales[i]);
        return o.str();
      }
    }
  }
  if (is_fp8(v)) {
    const int64_t mp = fp8_group_scale_rows(p.m);
    std::vector<uint8_t> values(mh);
    std::vector<float> scales(static_cast<size_t>(fp8_group_scale_bytes(p.m, p.h) / 4));
    reference::fp8_group_quantize(got.layer_input.data(), p.m, p.h, v == Variant::kFp8Ue8m0, values.data(),
                                  scales.data());
    for (size_t i = 0; i < mh; ++i) {
      if (got.values[i] != values[i]) {
        o << variant_name(v) << " value [" << i / p.h << ", " << i % p.h << "] = 0x"
          << detail::hex_text(got.values[i]) << ", reference 0x" << detail::hex_text(values[i]);
        return o.str();
      }
    }
    // kFp8Ue8m0's scales are the MN-major view (launch above): a call writes its extent,
    // (G - 1) * Mp + M floats, and not the last column's padding rows beyond it (download).
    for (size_t i = 0; i < got.scales_written / 4; ++i) {
      uint32_t g;
      std::memcpy(&g, got.scales.data() + 4 * i, 4);
      if (g != float_bits(scales[i])) {
        const int64_t row = static_cast<int64_t>(i) % mp, group = static_cast<int64_t>(i) / mp;
        o << variant_name(v) << " scale (row " << row << ", group " << group << ")"
          << (row >= p.m ? " (padding)" : "") << " = 0x" << detail::hex_text(g) << ", reference 0x"
          << detail::hex_text(float_bits(scales[i]));
        return o.str();
      }
    }
  }
  return "";
}

}  // namespace mhccl::testing
