// q transposed: qt[j, i] = q[i, j] for the FP8 codes of a quantized
// forward (STORE_YT), q [M, N] with rows `ld` bytes apart, qt [N, M]
// contiguous. A launch of its own after the row kernel, so that both sides
// move whole sectors: written from the row kernel, each column of a
// program's rows left as one short strided store (2-16 bytes), and the L2
// took one write request per column (11-26% of the copy). Included after
// norm_fwd.cuh by the preludes of STORE_YT variants only.
//
// A CTA of 256 threads moves a tile of 128 rows x 64 columns through
// shared memory: each thread loads 16 bytes of two rows and stores 16
// bytes of two rows of qt, so every warp reads and writes 64-byte runs.
// Grid: x over the row tiles, y over the column tiles.
#pragma once
#include "common.cuh"
#include "quant_args.cuh"

extern "C" __global__ void __launch_bounds__(256)
normjit_q_transpose(const unsigned char* __restrict__ q, unsigned char* __restrict__ qt, long long M, long long ld,
                    int N) {
  constexpr int TR = nj::qt_tile_rows(), TC = nj::qt_tile_cols();
  // One word of padding a row: the gathers below (a byte of 16 rows at one
  // column) then meet at most two rows in one bank.
  __shared__ unsigned tile[TR][TC / 4 + 1];
  const long long r0 = (long long)blockIdx.x * TR;
  const int c0 = blockIdx.y * TC;
  const int t = threadIdx.x;
  // Load: thread t reads bytes 16 * (t % 4) .. + 15 of rows t / 4 and t / 4 + 64.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = t / 4 + 64 * h, seg = t % 4;
    const long long row = r0 + r;
    const int col = c0 + 16 * seg;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < M) {
      const unsigned char* p = q + row * ld + col;
      if (col + 16 <= N && reinterpret_cast<unsigned long long>(p) % 16 == 0) {
        v = *reinterpret_cast<const uint4*>(p);
      } else {
        unsigned w[4] = {0u, 0u, 0u, 0u};
        for (int k = 0; k < 16 && col + k < N; ++k) w[k / 4] |= static_cast<unsigned>(p[k]) << (8 * (k % 4));
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    tile[r][4 * seg + 0] = v.x;
    tile[r][4 * seg + 1] = v.y;
    tile[r][4 * seg + 2] = v.z;
    tile[r][4 * seg + 3] = v.w;
  }
  __syncthreads();
  // Store: thread t writes qt row c0 + t / 4 (a column of q), the bytes of
  // q's rows 16 * (t % 4) .. + 15 and 64 more.
  const int j = t / 4;
  if (c0 + j >= N) return;
  const int word = j / 4, shift = 8 * (j % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rs = 16 * (t % 4) + 64 * h;
    unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int k = 0; k < 16; ++k) w[k / 4] |= ((tile[rs + k][word] >> shift) & 0xffu) << (8 * (k % 4));
    const long long row = r0 + rs;
    if (row >= M) continue;
    unsigned char* p = qt + (long long)(c0 + j) * M + row;
    if (row + 16 <= M && reinterpret_cast<unsigned long long>(p) % 16 == 0) {
      *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int k = 0; k < 16 && row + k < M; ++k) p[k] = static_cast<unsigned char>(w[k / 4] >> (8 * (k % 4)));
    }
  }
}
