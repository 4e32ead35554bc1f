// Second stage of the deterministic dweight / dbias reduction: out[j] = sum
// over programs p (in order) of partial[p, j]. blockIdx.y picks the partial
// array (0: out0 = dweight, or dbias without a weight; 1: out1 = dbias), each
// `programs` x N. 32 columns x 32 slices a block:
// each warp reads 128 contiguous bytes of a partial row; each slice sums every
// 32nd partial row; the slices are then added in order through shared memory.
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
  const int cx = threadIdx.x % 32, sy = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + cx;
  float acc = 0.f;
  if (col < N) {
    // Four independent sums keep four loads in flight; fixed order, so the
    // result does not depend on timing.
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    int p = sy;
    for (; p + 96 < programs; p += 128) {
      a0 += partial[(long long)p * N + col];
      a1 += partial[(long long)(p + 32) * N + col];
      a2 += partial[(long long)(p + 64) * N + col];
      a3 += partial[(long long)(p + 96) * N + col];
    }
    for (; p < programs; p += 32) a0 += partial[(long long)p * N + col];
    acc = (a0 + a1) + (a2 + a3);
  }
  s[sy][cx] = acc;
  __syncthreads();
  if (sy == 0 && col < N) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) t += s[i][cx];
    dw[col] = nj::from_float<typename Spec::w_t>(t);
  }
}
