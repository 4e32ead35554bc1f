// Quantized (FP8) outputs of the forward: scales from amax, the maxima over
// a row, a group of lanes and a block, as QuantOps, which a quantized
// variant's Spec names (`using Q = nj::QuantOps`); norm_fwd.cuh reaches them
// only through Spec::Q, so kernels without a quantized y do not include
// this file. One convention (see normjit.hpp, QuantScaling): scales
// dequantize, y ~= q * scale, q = sat(rne(y / scale)).
#pragma once
#include "common.cuh"
#include "fp8.cuh"
#include "quant_args.cuh"

namespace nj {

struct QuantOps {
  static constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

  // The largest of v over the TPR threads of a row (all threads of the block
  // call it: it may hold a barrier). fmaxf drops NaN: amax ignores NaN inputs.
  template <int TPR, int ROWS> static __device__ __forceinline__ float row_max(float v) {
#pragma unroll
    for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (TPR > 32) {
      __shared__ float smem[ROWS][kWarpsPerRow<TPR>];
      const int rg = threadIdx.x / TPR, w = (threadIdx.x % TPR) / 32;
      if (threadIdx.x % 32 == 0) smem[rg][w] = v;
      __syncthreads();
      v = 0.f;
#pragma unroll
      for (int i = 0; i < TPR / 32; ++i) v = fmaxf(v, smem[rg][i]);
      __syncthreads();
    }
    return v;
  }

  // The largest of v over the LANES (a power of two <= 32) aligned lanes that
  // hold one group; only those lanes take part, so groups may diverge.
  template <int LANES> static __device__ __forceinline__ float group_max(float v) {
    if constexpr (LANES > 1) {
      const unsigned lane = threadIdx.x % 32;
      const unsigned mask = LANES == 32 ? 0xffffffffu : ((1u << LANES) - 1u) << (lane & ~(LANES - 1u));
#pragma unroll
      for (int o = LANES / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(mask, v, o));
    }
    return v;
  }

  // The largest v over the block, to every thread (all of them call it).
  static __device__ __forceinline__ float block_max(float v) {
    __shared__ float warp_max[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
    __syncthreads();
    float m = 0.f;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; ++i) m = fmaxf(m, warp_max[i]);
    return m;
  }

  // max(v over the block) into *out with one atomic: non-negative floats
  // order as their bit patterns, so an unsigned atomicMax is a float max. A
  // grid of one program stores it instead: the engine then sets no zero
  // first (a memset is a GPU operation of its own, about 1 us at decode).
  // UNIFORM: v is the block's max in every thread already (no reduction).
  template <bool UNIFORM = false> static __device__ __forceinline__ void block_max_to(float v, float* out) {
    const float m = UNIFORM ? v : block_max(v);
    if (threadIdx.x == 0) {
      if (gridDim.x == 1) *out = m;
      else atomicMax(reinterpret_cast<unsigned*>(out), __float_as_uint(m));
    }
  }

  // Tensor scaling where one program, or one cluster of them, holds every
  // row (decode): the tensor's amax is the max of the blocks' max of their
  // rows' amax (ClusterMax, whose init() the kernel called); thread 0 of the
  // cluster's first CTA stores it.
  static __device__ __forceinline__ float tensor_amax_once(float row_amax, const QuantArgs& q) {
    float m = block_max(row_amax);
    if (cluster_ctas() > 1) m = ClusterMax::max(m);
    if (threadIdx.x == 0 && cluster_rank_any() == 0) *q.amax = m;
    return m;
  }

  // The scale rules (fp8.cuh, shared with the host tests).
  template <class Q> static __device__ __forceinline__ float scale_of(float amax, const QuantArgs& q) {
    return fp8_scale_of(amax, Fp8Limits<Q>::MAX, q.scale_min);
  }
  static __device__ __forceinline__ float pow2_ceil(float s) { return fp8_pow2_ceil(s); }
  template <class Q> static __device__ __forceinline__ int mx_exponent(float amax) {
    return fp8_mx_exponent(amax, Fp8Limits<Q>::EMAX);
  }
  static __device__ __forceinline__ float exp2i(int e) { return fp8_exp2i(e); }

  // VEC floats times `inv` to FP8 codes, two per conversion.
  template <class Q, int VEC> static __device__ __forceinline__ Vec<Q, VEC> quantize(const float (&v)[VEC], float inv) {
    Vec<Q, VEC> q;
    if constexpr (VEC == 1) {
      q.v[0] = from_float<Q>(v[0] * inv);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; k += 2) {
        const unsigned short p = fp8x2<Q>(v[k] * inv, v[k + 1] * inv);
        q.v[k].bits = static_cast<unsigned char>(p & 0xffu);
        q.v[k + 1].bits = static_cast<unsigned char>(p >> 8);
      }
    }
    return q;
  }

  // y_hp of one chunk (STORE_YHP): y unquantized, in yhp_t.
  template <class S, class Row>
  static __device__ __forceinline__ void store_yhp(const Row& R, int col, bool exact, const float (&v)[S::VEC]) {
    Vec<typename S::yhp_t, S::VEC> hv;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) hv.v[k] = from_float<typename S::yhp_t>(v[k]);
    R.st(static_cast<typename S::yhp_t*>(R.yhp) + R.yo, col, hv, exact);
  }

  // One element of a quantized y at column p (a peeled row's edge): its code,
  // y_hp and transpose, as store does for a chunk.
  template <class S, class Row> static __device__ __forceinline__ void store1(const Row& R, int p, float v, float inv) {
    const typename S::y_t c = from_float<typename S::y_t>(v * inv);
    R.y[p] = c;
    if constexpr (S::STORE_YHP) (static_cast<typename S::yhp_t*>(R.yhp) + R.yo)[p] = from_float<typename S::yhp_t>(v);
    if constexpr (S::STORE_YT) {
      if (R.yt) static_cast<unsigned char*>(R.yt)[(long long)(p - R.lo) * R.M + R.row] = c.bits;
    }
  }

  // Column j of the row's codes as element (j, row) of the [N, M]
  // transpose, a byte each (R.yt is set only at decode, where the engine
  // finds these strided bytes cheaper than a transpose launch of its own).
  // `col`: a column of the row's view (a peeled row's column col - R.lo).
  template <class S, class Row>
  static __device__ __forceinline__ void store_yt(const Row& R, int col, bool exact, const unsigned char (&b)[S::VEC]) {
    if constexpr (S::STORE_YT) {
      if (!R.yt) return;
      unsigned char* t = static_cast<unsigned char*>(R.yt) + R.row;
#pragma unroll
      for (int k = 0; k < S::VEC; ++k)
        if (exact || R.has(col + k)) t[(long long)(col + k - R.lo) * R.M] = b[k];
    }
  }

  // Stores one chunk of a quantized y at column `col` of row R (an
  // nj::FwdRow; a column of a peeled row's view): the values `v` times
  // `inv` = 1 / scale as FP8 codes, and y_hp and the transpose where the
  // variant writes them. `exact`: the chunk lies wholly inside the row.
  template <class S, class Row>
  static __device__ __forceinline__ void store(const Row& R, int col, bool exact, const float (&v)[S::VEC], float inv) {
    if constexpr (S::VEC % 4 == 0) {
      // Whole chunks as 32-bit words of four codes (fp8x4): no byte moves.
      if (exact || R.inner(col)) {
        Vec<unsigned, S::VEC / 4> w;
#pragma unroll
        for (int k = 0; k < S::VEC; k += 4)
          w.v[k / 4] = fp8x4<typename S::y_t>(v[k] * inv, v[k + 1] * inv, v[k + 2] * inv, v[k + 3] * inv);
        *reinterpret_cast<Vec<unsigned, S::VEC / 4>*>(R.y + col) = w;
        if constexpr (S::STORE_YHP) store_yhp<S>(R, col, true, v);
        if constexpr (S::STORE_YT) {
          // One row: its transpose [N, 1] is q's row itself, stored whole.
          unsigned char* t = static_cast<unsigned char*>(R.yt);
          if (R.M == 1 && t && reinterpret_cast<unsigned long long>(t + col - R.lo) % sizeof(w) == 0) {
            *reinterpret_cast<Vec<unsigned, S::VEC / 4>*>(t + col - R.lo) = w;
          } else {
            unsigned char b[S::VEC];
#pragma unroll
            for (int k = 0; k < S::VEC; ++k) b[k] = static_cast<unsigned char>(w.v[k / 4] >> (8 * (k % 4)));
            store_yt<S>(R, col, true, b);
          }
        }
        return;
      }
    }
    const Vec<typename S::y_t, S::VEC> qv = quantize<typename S::y_t, S::VEC>(v, inv);
    R.st(R.y, col, qv, exact);
    if constexpr (S::STORE_YHP) store_yhp<S>(R, col, exact, v);
    if constexpr (S::STORE_YT) {
      unsigned char b[S::VEC];
#pragma unroll
      for (int k = 0; k < S::VEC; ++k) b[k] = qv.v[k].bits;
      store_yt<S>(R, col, exact, b);
    }
  }

  // 1 / the scale a whole row (Token) or tensor (Tensor, TensorStatic)
  // shares, from the row's amax for Token; lane 0 of a row writes it.
  // `given`: TensorStatic, the scale as the caller read it from q.scale;
  // Tensor, the tensor's amax.
  template <class S>
  static __device__ __forceinline__ float shared_inv_scale(const QuantArgs& q, float row_amax, bool lane0, long long row,
                                                           float given) {
    using y_t = typename S::y_t;
    if constexpr (S::QUANT == Q_TENSOR_STATIC) {
      return 1.f / given;
    } else if constexpr (S::QUANT == Q_TENSOR) {
      // `given` is the tensor's amax (phase 0's, or the block's where one
      // program holds every row): every program derives the same scale.
      const float sc = scale_of<y_t>(given, q);
      if (lane0 && row == 0) *static_cast<float*>(q.scale) = sc;
      return 1.f / sc;
    } else if constexpr (S::QUANT == Q_TOKEN) {
      float sc = scale_of<y_t>(row_amax, q);
      if (q.scale_ub > 0.f) sc = fminf(sc, q.scale_ub);
      if (lane0) static_cast<float*>(q.scale)[row] = sc;
      return 1.f / sc;
    } else {
      return 1.f;
    }
  }

  // Group and MX scales of all R chunks of a thread at once (KEEP_U rows:
  // chunk i is at column tc.col(i) of row `row`, its y = u * rstd, and m[i]
  // is its max|u|); 1 / scale of chunk i into inv[i]. Every lane of the warp
  // calls this together. The LANES = QGROUP / VEC aligned lanes of a group
  // reduce-scatter their R maxima (each exchange halves what a lane holds,
  // until it holds max(1, R / LANES) of the group maxima), derive only
  // those scales, one lane writes each, and each chunk's 1 / scale comes
  // back in one shuffle: R/2 + R/4 + ... exchanges and a division or two a
  // lane, where a group at a time took LANES' log2 exchanges and two
  // divisions a chunk. (Partial-mask shuffles in branches also made ptxas
  // wrap each in warp-synchronising code.) R is padded to a power of two, P.
  template <class S, int R, class TC>
  static __device__ __forceinline__ void group_inv_scales(const QuantArgs& q, const float (&m)[R], float rstd,
                                                          long long row, bool valid, const TC& tc, float (&inv)[R]) {
    using y_t = typename S::y_t;
    constexpr int LANES = S::QGROUP / S::VEC;
    constexpr int P = pow2_at_least(R);
    constexpr int HELD = P >= LANES ? P / LANES : 1;  // maxima a lane holds after the exchanges
    static_assert((LANES & (LANES - 1)) == 0 && LANES <= 32, "a group is a power of two of lanes");
    const int gl = (threadIdx.x % 32) % LANES;  // lane in the group
    float v[P];
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = i < R ? m[i] : 0.f;
    int c = P;  // maxima still held: v[0, c)
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) {
      const bool up = gl & o;  // keeps the upper half, sends the lower
      if (c > 1) {
#pragma unroll
        for (int j = 0; j < P / 2; ++j) {
          if (j < c / 2) {
            const float send = up ? v[j] : v[j + c / 2];
            const float keep = up ? v[j + c / 2] : v[j];
            v[j] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, o));
          }
        }
        c /= 2;
      } else {
        v[0] = fmaxf(v[0], __shfl_xor_sync(0xffffffffu, v[0], o));
      }
    }
    // v[h] is the max|u| of the group of chunk gl * P / LANES + h.
    const int base = gl * P / LANES;
    float held[HELD];
#pragma unroll
    for (int h = 0; h < HELD; ++h) {
      const int i = base + h;
      const float am = v[h] * rstd;  // = max|y| of the group
      // One writer a group: the first of the lanes that hold its maximum.
      const bool writes = valid && i < R && tc.in(i) && (P >= LANES || gl % (LANES / P) == 0);
      const long long g = (tc.lane + (long long)i * S::TPR) / LANES;  // the group's index in the row
      if constexpr (S::QUANT == Q_MX) {
        const int e = mx_exponent<y_t>(am);
        if (writes) static_cast<unsigned char*>(q.scale)[row * (S::N / S::QGROUP) + g] = static_cast<unsigned char>(e + 127);
        held[h] = exp2i(-e);
      } else {
        float sc = scale_of<y_t>(am, q);
        if (q.scale_ub > 0.f) sc = fminf(sc, q.scale_ub);
        if constexpr (S::UE8M0) sc = pow2_ceil(sc);
        if (writes) static_cast<float*>(q.scale)[S::COLMAJOR ? g * q.scale_ld + row : row * (S::N / S::QGROUP) + g] = sc;
        held[h] = 1.f / sc;
      }
    }
    if constexpr (LANES == 1) {
#pragma unroll
      for (int i = 0; i < R; ++i) inv[i] = held[i];
    } else {
      const int first = (threadIdx.x % 32) - gl;  // the group's first lane in the warp
#pragma unroll
      for (int i = 0; i < R; ++i)
        inv[i] = __shfl_sync(0xffffffffu, held[i % HELD], first + (P >= LANES ? i / HELD : i * (LANES / P)));
    }
  }

  // Group and MX scales of the chunk `v` at column `col` of row `row`; the
  // LANES = QGROUP / VEC lanes of a group meet in group_max (all of them call
  // this together). Returns 1 / scale; the group's first lane writes it.
  template <class S>
  static __device__ __forceinline__ float group_inv_scale(const QuantArgs& q, const float (&v)[S::VEC], int col,
                                                          long long row) {
    using y_t = typename S::y_t;
    constexpr int LANES = S::QGROUP / S::VEC;
    float am = 0.f;
#pragma unroll
    for (int k = 0; k < S::VEC; ++k) am = fmaxf(am, fabsf(v[k]));
    am = group_max<LANES>(am);
    const bool first = (col / S::VEC) % LANES == 0;
    const long long g = col / S::QGROUP;
    if constexpr (S::QUANT == Q_MX) {
      const int e = mx_exponent<y_t>(am);
      if (first) static_cast<unsigned char*>(q.scale)[row * (S::N / S::QGROUP) + g] = static_cast<unsigned char>(e + 127);
      return exp2i(-e);
    } else {
      float sc = scale_of<y_t>(am, q);
      if (q.scale_ub > 0.f) sc = fminf(sc, q.scale_ub);
      if constexpr (S::UE8M0) sc = pow2_ceil(sc);
      if (first) static_cast<float*>(q.scale)[S::COLMAJOR ? g * q.scale_ld + row : row * (S::N / S::QGROUP) + g] = sc;
      return 1.f / sc;
    }
  }
};

}  // namespace nj
