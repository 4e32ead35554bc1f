// Second stage of the deterministic dweight / dbias reduction: out[j] = sum
// over programs p (in order) of partial[p, j]. blockIdx.y picks the partial
// array (0: out0 = dweight, or dbias without a weight; 1: out1 = dbias), each
// `programs` x N. A block is 32 columns x S slices (S = blockDim.x / 32, the
// launch picks it from `programs`, 32 at most): each warp reads 128
// contiguous bytes of a partial row; slice s sums the partial rows s, s + S,
// ...; the slices are then added in order through shared memory. Blocks
// stride over the column tiles, so a few partial rows of a wide row need no
// more blocks than the GPU holds at once (one 1024-thread block a tile of 32
// columns took 28 us for 4 rows of 234K).
//
// Spec: using w_t; nothing else.
#pragma once
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(1024)
normjit_dw_finalize(const float* __restrict__ partial, typename Spec::w_t* __restrict__ out0,
                    typename Spec::w_t* __restrict__ out1, int programs, int N) {
  partial += (long long)blockIdx.y * programs * N;
  typename Spec::w_t* __restrict__ dw = blockIdx.y ? out1 : out0;
  __shared__ float s[32][33];  // +1 column: no bank conflicts on the transpose read
  const int slices = blockDim.x / 32;
  const int cx = threadIdx.x % 32, sy = threadIdx.x / 32;
  for (int tile = blockIdx.x; tile * 32 < N; tile += gridDim.x) {
    const int col = tile * 32 + cx;
    float acc = 0.f;
    if (col < N) {
      // Four independent sums keep four loads in flight; fixed order, so the
      // result does not depend on timing.
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
      dw[col] = nj::from_float<typename Spec::w_t>(t);
    }
    __syncthreads();  // s is reused by the next tile
  }
}
