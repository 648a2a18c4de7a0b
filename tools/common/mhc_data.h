// Random problems of one sublayer boundary for tests and mhccl-bench: fresh BF16 data (never
// zeros) and DSV4.1-like mixes: post = 2 * sigmoid, pre = sigmoid + 1e-6, comb = a
// Sinkhorn-normalised softmax (20 iterations). Every rank can rebuild every rank's inputs from
// the seed, so each checks the whole reduction against the CPU reference.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "mhccl/bf16.h"
#include "mhccl/reference.h"

namespace mhccl::testing {

// Runs fn(begin, end) over [0, n) split into chunks of `grain` on up to hardware_concurrency
// threads (the tests' and the bench's CPU side: problem generation and the reference at
// M = 4096 would otherwise take longer than the GPU work by far). Chunk boundaries depend on n
// and grain only, so results never depend on the thread count.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t c; (c = next.fetch_add(1)) < chunks;) fn(c * grain, std::min(n, (c + 1) * grain));
    });
  }
  for (auto& th : pool) th.join();
}

// splitmix64: the per-chunk generator of bulk fills (fast, and seeded independently per chunk).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Roughly normal (Irwin-Hall: four uniforms of one 64-bit draw) BF16 of standard deviation
// `scale`; never zero.
template <class Next>
inline uint16_t random_bf16(Next&& next, float scale) {
  for (;;) {
    const uint64_t u = next();
    const float s = float((u & 0xFFFF) + ((u >> 16) & 0xFFFF) + ((u >> 32) & 0xFFFF) + (u >> 48)) *
                        (1.0f / 65536.0f) - 2.0f;
    const uint16_t b = float_to_bf16(s * 1.7320508f * scale);
    if ((b & 0x7FFF) != 0) return b;
  }
}

// n random BF16 values: one draw of `rng` seeds the fill, chunks of 2^16 values each get their
// own splitmix64 stream (in parallel).
inline void fill_bf16(std::mt19937_64& rng, std::vector<uint16_t>& v, size_t n, float scale) {
  v.resize(n);
  const uint64_t seed = rng();
  parallel_for(static_cast<int64_t>(n), int64_t{1} << 16, [&](int64_t b, int64_t e) {
    uint64_t state = seed ^ (static_cast<uint64_t>(b) * 0xD1B54A32D192ED03ull);
    auto next = [&state] { return splitmix64(state); };
    for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)] = random_bf16(next, scale);
  });
}

// post [m, hc], comb [m, hc, hc] ([source, target]), pre [m, hc].
inline void fill_mixes(std::mt19937_64& rng, int64_t m, int hc, std::vector<float>& post,
                       std::vector<float>& comb, std::vector<float>& pre) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto sigmoid = [](float z) { return 1.0f / (1.0f + std::exp(-z)); };
  post.resize(static_cast<size_t>(m * hc));
  pre.resize(static_cast<size_t>(m * hc));
  comb.resize(static_cast<size_t>(m * hc * hc));
  for (auto& p : post) p = 2.0f * sigmoid(n(rng));
  for (auto& p : pre) p = sigmoid(n(rng)) + 1e-6f;
  std::vector<double> k(static_cast<size_t>(hc * hc));
  for (int64_t r = 0; r < m; ++r) {
    for (auto& v : k) v = std::exp(double(n(rng)));
    for (int it = 0; it < 20; ++it) {
      for (int i = 0; i < hc; ++i) {  // rows sum to 1
        double s = 0;
        for (int j = 0; j < hc; ++j) s += k[i * hc + j];
        for (int j = 0; j < hc; ++j) k[i * hc + j] /= s;
      }
      for (int j = 0; j < hc; ++j) {  // columns sum to 1
        double s = 0;
        for (int i = 0; i < hc; ++i) s += k[i * hc + j];
        for (int i = 0; i < hc; ++i) k[i * hc + j] /= s;
      }
    }
    for (int i = 0; i < hc * hc; ++i) comb[r * hc * hc + i] = static_cast<float>(k[i]);
  }
}

// Inputs of one call for every rank of a TP group.
struct Problem {
  int64_t m = 0, h = 0;
  int hc = 4, tp = 1, top_k = 6;
  bool finalize = false;
  std::vector<std::vector<uint16_t>> x;  // [tp][m, h] (call) — or the finalize inputs below
  std::vector<std::vector<uint16_t>> gemm2, shared;
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<int32_t>> routes;
  int64_t gemm2_rows = 0;
  std::vector<uint16_t> residual, norm_weight;
  std::vector<float> post, comb, pre;
  float eps = 1e-6f;

  reference::MHCProblem mhc(bool residual_only) const {
    reference::MHCProblem p;
    p.m = m;
    p.h = h;
    p.hc = hc;
    p.residual = residual.data();
    p.post = post.data();
    p.comb = comb.data();
    p.pre = residual_only ? nullptr : pre.data();
    p.norm_weight = norm_weight.data();
    p.eps = eps;
    return p;
  }
};

// x (or the finalize inputs: routes to distinct rows of a per-rank gemm2, about a third -1)
// at a scale whose sum over tp ranks is O(1); residual O(1).
inline Problem make_problem(uint64_t seed, int64_t m, int64_t h, int hc, int tp, bool finalize,
                            int top_k = 6) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.m = m;
  p.h = h;
  p.hc = hc;
  p.tp = tp;
  p.top_k = top_k;
  p.finalize = finalize;
  const size_t mh = static_cast<size_t>(m * h);
  if (!finalize) {
    p.x.resize(tp);
    for (auto& x : p.x) fill_bf16(rng, x, mh, 1.0f / std::sqrt(float(tp)));
  } else {
    p.gemm2_rows = m * top_k;
    p.gemm2.resize(tp);
    p.shared.resize(tp);
    p.weights.resize(tp);
    p.routes.resize(tp);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int r = 0; r < tp; ++r) {
      fill_bf16(rng, p.gemm2[r], static_cast<size_t>(p.gemm2_rows * h), 1.0f);
      fill_bf16(rng, p.shared[r], mh, 0.5f);
      p.weights[r].resize(static_cast<size_t>(m * top_k));
      p.routes[r].resize(static_cast<size_t>(m * top_k));
      std::vector<int32_t> perm(static_cast<size_t>(p.gemm2_rows));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (size_t i = 0; i < p.routes[r].size(); ++i) {
        p.weights[r][i] = u(rng) / float(top_k);
        p.routes[r][i] = u(rng) < 0.33f ? -1 : perm[i];
      }
    }
  }
  fill_bf16(rng, p.residual, static_cast<size_t>(m * hc * h), 1.0f);
  fill_bf16(rng, p.norm_weight, static_cast<size_t>(h), 0.3f);
  for (auto& w : p.norm_weight) w = float_to_bf16(1.0f + bf16_to_float(w));
  fill_mixes(rng, m, hc, p.post, p.comb, p.pre);
  return p;
}

// This call's reduced rows y = bf16(sum over ranks of x_r) (x_r from finalize when so built).
inline std::vector<uint16_t> reference_y(const Problem& p) {
  const size_t mh = static_cast<size_t>(p.m * p.h);
  std::vector<std::vector<uint16_t>> xs(p.tp);
  for (int r = 0; r < p.tp; ++r) {
    if (!p.finalize) {
      xs[r] = p.x[r];
    } else {
      xs[r].resize(mh);
      parallel_for(p.m, 64, [&](int64_t b, int64_t e) {  // rows are independent
        const size_t k = static_cast<size_t>(b * p.top_k);
        reference::finalize_rank_input(p.gemm2[r].data(), p.gemm2_rows, p.weights[r].data() + k,
                                       p.routes[r].data() + k, p.shared[r].data() + b * p.h, e - b,
                                       p.h, p.top_k, xs[r].data() + b * p.h);
      });
    }
  }
  std::vector<uint16_t> y(mh);
  parallel_for(static_cast<int64_t>(mh), int64_t{1} << 18, [&](int64_t b, int64_t e) {
    std::vector<const uint16_t*> ptrs;
    for (auto& x : xs) ptrs.push_back(x.data() + b);
    reference::all_reduce_bf16(ptrs, e - b, y.data() + b);
  });
  return y;
}

}  // namespace mhccl::testing
