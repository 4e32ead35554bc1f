// Second stage of the deterministic dweight / dbias reduction: out[j] = sum
// over programs p (in order) of partial[p, j]. blockIdx.y picks the partial
// array (0: out0 = dweight, or dbias without a weight; 1: out1 = dbias), each
// `programs` x N. A block is a tile of 32 x VEC columns and S slices of 32
// threads (S = blockDim.x / 32, the launch picks it from `programs`): lane
// cx adds VEC columns, slice s the partial rows s, s + S, ...; the slices
// are then added in order through shared memory. Blocks stride over the
// column tiles. VEC (finalize_geometry) is 4 or 2 where it divides N and
// still gives every SM a block: each lane loads its columns of a partial
// row as one vector, 8 / VEC rows a round (the whole backward on an H100,
// against 4-byte loads four rows a round: ln bf16 147x6560 1.08x, wide rows
// of few programs 1.14-1.17x); else 1, the scalar loop.
//
// Spec: using w_t; nothing else.
#pragma once
#include "common.cuh"

namespace nj {
// VEC 2 or 4.
template <int VEC, class W>
__device__ __forceinline__ void dw_finalize_tiles(const float* __restrict__ partial, W* __restrict__ dw, int programs,
                                                  int N, float* s) {
  using V = Vec<float, VEC>;
  constexpr int TILE = 32 * VEC;
  constexpr int U = 8 / VEC;  // independent sums a thread: 32 bytes of loads in flight
  const int slices = blockDim.x / 32;
  const int cx = threadIdx.x % 32, sy = threadIdx.x / 32;
  for (int tile = blockIdx.x; tile * TILE < N; tile += gridDim.x) {
    const int col = tile * TILE + cx * VEC;  // N % VEC == 0: a chunk is whole or past N
    float acc[VEC] = {};
    if (col < N) {
      // Fixed order (row by row within each of the U sums, then the sums in
      // pairs), so the result does not depend on timing; rows past the
      // last add nothing.
      float a[U][VEC] = {};
      const float* row = partial + (long long)sy * N + col;
      const long long step = (long long)slices * N;
      for (int p = sy; p < programs; p += U * slices, row += U * step) {
        V r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int q = p + u * slices;
          if (q < programs) {
            r[u] = *reinterpret_cast<const V*>(row + u * step);
          } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) r[u].v[k] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int k = 0; k < VEC; ++k) a[u][k] += r[u].v[k];
      }
      // The U sums added in pairs, in a fixed tree.
#pragma unroll
      for (int w = 1; w < U; w *= 2)
#pragma unroll
        for (int u = 0; u + w < U; u += 2 * w)
#pragma unroll
          for (int k = 0; k < VEC; ++k) a[u][k] += a[u + w][k];
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] = a[0][k];
    }
    // s[slice][column of the tile]: a vector store a lane, a warp's 128 x
    // VEC bytes contiguous (no bank conflicts); read back a column a thread.
    V o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = acc[k];
    *reinterpret_cast<V*>(s + sy * TILE + cx * VEC) = o;
    __syncthreads();
    for (int j = threadIdx.x; j < TILE; j += blockDim.x) {
      const int c = tile * TILE + j;
      if (c < N) {
        float t = 0.f;
        // Unrolled: the loads issue together (a load, then its add, each
        // slice in turn took 0.25 us more at 32 slices).
#pragma unroll 8
        for (int i = 0; i < slices; ++i) t += s[i * TILE + j];
        dw[c] = from_float<W>(t);
      }
    }
    __syncthreads();  // s is reused by the next tile
  }
}

// VEC 1 (N odd, or too few columns for wider lanes): 4-byte loads, four
// rows in flight. The vector loop above, run with VEC 1 and eight rows a
// round, was 3-5% slower at 16 to 64 partial rows of 4096-8192 columns on
// an H100 (3.8% faster at 2112 partial rows of 184).
template <class W>
__device__ __forceinline__ void dw_finalize_scalar(const float* __restrict__ partial, W* __restrict__ dw,
                                                   int programs, int N, float* sm) {
  float(*s)[33] = reinterpret_cast<float(*)[33]>(sm);  // +1 column: no bank conflicts on the transposed read
  const int slices = blockDim.x / 32;
  const int cx = threadIdx.x % 32, sy = threadIdx.x / 32;
  for (int tile = blockIdx.x; tile * 32 < N; tile += gridDim.x) {
    const int col = tile * 32 + cx;
    float acc = 0.f;
    if (col < N) {
      // Four independent sums keep four loads in flight; fixed order.
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
      int p = sy;
      for (; p + 3 * slices < programs; p += 4 * slices) {
        a0 += partial[(long long)p * N + col];
        a1 += partial[(long long)(p + slices) * N + col];
        a2 += partial[(long long)(p + 2 * slices) * N + col];
        a3 += partial[(long long)(p + 3 * slices) * N + col];
      }
      for (; p < programs; p += slices) a0 += partial[(long long)p * N + col];
      acc = (a0 + a1) + (a2 + a3);
    }
    s[sy][cx] = acc;
    __syncthreads();
    if (sy == 0 && col < N) {
      float t = 0.f;
      for (int i = 0; i < slices; ++i) t += s[i][cx];
      dw[col] = from_float<W>(t);
    }
    __syncthreads();  // s is reused by the next tile
  }
}
}  // namespace nj

// Two 1024-thread blocks an SM (32 registers): one a wave left the many
// tiles of 8192 columns in two waves (6.8 us against 5.3 on an H100).
extern "C" __global__ void __launch_bounds__(1024, 2)
normjit_dw_finalize(const float* __restrict__ partial, typename Spec::w_t* __restrict__ out0,
                    typename Spec::w_t* __restrict__ out1, int programs, int N, int vec) {
  partial += (long long)blockIdx.y * programs * N;
  typename Spec::w_t* __restrict__ dw = blockIdx.y ? out1 : out0;
  __shared__ __align__(16) float s[32 * 33];  // slices x a tile's columns (VEC > 1: 32 x VEC, slices <= 32 / VEC)
  if (vec == 4) nj::dw_finalize_tiles<4>(partial, dw, programs, N, s);
  else if (vec == 2) nj::dw_finalize_tiles<2>(partial, dw, programs, N, s);
  else nj::dw_finalize_scalar(partial, dw, programs, N, s);
}
