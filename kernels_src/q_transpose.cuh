// q transposed: qt[j, i] = q[i, j] for the FP8 codes of a quantized
// forward (store_y_t past decode), q [M, N] with rows `ld` bytes apart,
// qt [N, M] contiguous. A launch of its own after the row kernel, so that both sides
// move whole sectors: written from the row kernel, each column of a
// program's rows left as one short strided store (2-16 bytes), and the L2
// took one write request per column (11-26% of the copy). Included after
// norm_fwd.cuh by the preludes of those variants only.
//
// A CTA of 256 threads moves a tile of 64 rows x 256 columns through
// shared memory: each thread loads four 16-byte pieces of q's rows (a warp
// reads two 256-byte runs) and stores 64-byte runs of qt's rows. The grid
// walks the row tiles of a column strip first. Transposing 8192 x 4096
// codes on an H200 alone (one harness, L2 flushed): tiles of 128 x 64 took
// 36.6 us, 32 x 256 26.9, 64 x 256 22.7 (18.1 right after the row kernel).
// Grid: x over the row tiles, y over the column tiles of `tc` columns (TC,
// or fewer where a few rows would leave most SMs idle).
#pragma once
#include "common.cuh"
#include "quant_args.cuh"

namespace nj {
// Bytes [k0, k1) of the 16-byte-aligned slot at `slot`, held little-endian
// in w: the whole slot as one store, else pieces of 8, 4, 2 or 1 bytes, each
// aligned to its size (so none crosses w's halves).
__device__ __forceinline__ void store_slot(unsigned char* slot, int k0, int k1, const unsigned long long (&w)[2]) {
  if (k0 == 0 && k1 == 16) {
    *reinterpret_cast<ulonglong2*>(slot) = make_ulonglong2(w[0], w[1]);
    return;
  }
  for (int k = k0; k < k1;) {
    int n = (k & 7) == 0 ? 8 : (k & 1) ? 1 : (k & 2) ? 2 : 4;
    while (n > k1 - k) n /= 2;
    const unsigned long long v = (k < 8 ? w[0] : w[1]) >> (8 * (k % 8));
    if (n == 8) *reinterpret_cast<unsigned long long*>(slot + k) = v;
    else if (n == 4) *reinterpret_cast<unsigned*>(slot + k) = static_cast<unsigned>(v);
    else if (n == 2) *reinterpret_cast<unsigned short*>(slot + k) = static_cast<unsigned short>(v);
    else slot[k] = static_cast<unsigned char>(v);
    k += n;
  }
}

// The 16 bytes at p (mis = p % 16 > 0; only the first `need` are used) from
// the aligned 16-byte words that hold them: an odd N starts q's rows
// anywhere, and byte loads took 61 x 2881 5.5 us to transpose. A word
// holding one of q's bytes lies inside q's allocation (16-byte granules);
// the second is read only where a needed byte lies in it.
__device__ __forceinline__ uint4 load_misaligned16(const unsigned char* p, int mis, int need) {
  const uint4* a = reinterpret_cast<const uint4*>(p - mis);
  const uint4 lo = a[0], hi = mis + need > 16 ? a[1] : make_uint4(0u, 0u, 0u, 0u);
  const unsigned u[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const int s = mis / 4, sh = 8 * (mis % 4);
  unsigned o[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) o[k] = s == 0 ? u[k] : s == 1 ? u[k + 1] : s == 2 ? u[k + 2] : u[k + 3];
  return make_uint4(__funnelshift_r(o[0], o[1], sh), __funnelshift_r(o[1], o[2], sh), __funnelshift_r(o[2], o[3], sh),
                    __funnelshift_r(o[3], o[4], sh));
}

// Whole runs of qt rows c0 .. c0 + cols - 1 (q's tile rows 0 .. TR - 1, at
// r0), each aligned to P bytes: item i is P-byte piece i % (TR / P) of the
// run of column i / (TR / P).
template <int P>
__device__ __forceinline__ void store_runs(const unsigned (*tile)[qt_tile_cols() / 4 + 1], unsigned char* qt,
                                           long long M, long long r0, int c0, int cols) {
  constexpr int TR = qt_tile_rows(), PIECES = TR / P;
  static_assert(P == 8 || P == 16, "8- or 16-byte pieces");
  for (int i = threadIdx.x; i < qt_tile_cols() * PIECES; i += blockDim.x) {
    const int j = i / PIECES, rs = P * (i % PIECES);
    if (j >= cols) continue;
    const int word = j / 4, shift = 8 * (j % 4);
    unsigned w[P / 4];
#pragma unroll
    for (int k = 0; k < P / 4; ++k) w[k] = 0u;
#pragma unroll
    for (int k = 0; k < P; ++k) w[k / 4] |= ((tile[rs + k][word] >> shift) & 0xffu) << (8 * (k % 4));
    unsigned char* p = qt + (long long)(c0 + j) * M + r0 + rs;
    if constexpr (P == 16) *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    else *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
}
}  // namespace nj

extern "C" __global__ void __launch_bounds__(256)
normjit_q_transpose(const unsigned char* __restrict__ q, unsigned char* __restrict__ qt, long long M, long long ld,
                    int N, int tc) {
  constexpr int TR = nj::qt_tile_rows(), TC = nj::qt_tile_cols(), SEG = TC / 16, RSEG = TR / 16;
  static_assert(TR % 16 == 0 && TC % 16 == 0, "16-byte pieces");
  // One word of padding a row: the gathers below (a byte of 16 rows at one
  // column) then meet at most two rows in one bank.
  __shared__ unsigned tile[TR][TC / 4 + 1];
  const long long r0 = (long long)blockIdx.x * TR;
  const int c0 = blockIdx.y * tc;
  const int cols = N - c0 < tc ? N - c0 : tc;  // tc <= TC, a multiple of 16
  // Load: piece i is bytes 16 * (i % SEG) .. + 15 of tile row i / SEG; a
  // thread's pieces all in flight before any is stored.
  constexpr int LOADS = TR * SEG / 256;
  static_assert(TR * SEG % 256 == 0, "whole rounds of the CTA's threads");
  uint4 v[LOADS];
#pragma unroll
  for (int k = 0; k < LOADS; ++k) {
    const int i = threadIdx.x + 256 * k, seg = i % SEG;
    const long long row = r0 + i / SEG;
    const int col = c0 + 16 * seg;
    v[k] = make_uint4(0u, 0u, 0u, 0u);
    if (row < M && 16 * seg < cols) {
      const unsigned char* p = q + row * ld + col;
      const int mis = static_cast<int>(reinterpret_cast<unsigned long long>(p) % 16);
      if (mis == 0) {
        v[k] = *reinterpret_cast<const uint4*>(p);  // (bytes past N: columns no store reads)
      } else {
        v[k] = nj::load_misaligned16(p, mis, col + 16 <= N ? 16 : N - col);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < LOADS; ++k) {
    const int i = threadIdx.x + 256 * k, r = i / SEG, seg = i % SEG;
    tile[r][4 * seg + 0] = v[k].x;
    tile[r][4 * seg + 1] = v[k].y;
    tile[r][4 * seg + 2] = v[k].z;
    tile[r][4 * seg + 3] = v[k].w;
  }
  __syncthreads();
  // Store. M is a token count, odd as often as not: qt's runs lie at any
  // alignment, so each item writes the part of a run in one 16-byte-aligned
  // slot, a whole slot as one 16-byte store, a partial one in its widest
  // aligned pieces (byte stores alone took 3000 x 3584 43 us to transpose).
  if (M <= TR) {
    // The tile holds every row: its columns' runs lie back to back in qt,
    // cols * M bytes from qt row c0 (a few long stores where each short run
    // cost a round of pieces: 61 x 2880 took 10.3 us).
    unsigned char* base = qt + (long long)c0 * M;
    const int bytes = cols * static_cast<int>(M), m = static_cast<int>(M);
    const int mis = static_cast<int>(reinterpret_cast<unsigned long long>(base) % 16);
    for (int slot = threadIdx.x; slot * 16 < mis + bytes; slot += 256) {
      const int lo = 16 * slot - mis, b0 = lo < 0 ? 0 : lo;
      int r = b0 % m, j = b0 / m;
      unsigned long long w[2] = {0ull, 0ull};
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (lo + k < b0 || lo + k >= bytes) continue;
        w[k / 8] |= static_cast<unsigned long long>((tile[r][j / 4] >> (8 * (j % 4))) & 0xffu) << (8 * (k % 8));
        if (++r == m) r = 0, ++j;
      }
      nj::store_slot(base + lo, b0 - lo, (lo + 16 < bytes ? lo + 16 : bytes) - lo, w);
    }
    return;
  }
  const int L = static_cast<int>(M - r0 < TR ? M - r0 : TR);
  // Whole runs aligned to 16 or 8 bytes (every M a multiple of 8): pieces
  // of one width, RSEG or 2 * RSEG lanes a run (as slots, 5 items a run,
  // 8192 x 4096 took 23.0 us to transpose where these take 18.1).
  const unsigned long long qa = reinterpret_cast<unsigned long long>(qt);
  if (L == TR && M % 16 == 0 && qa % 16 == 0) return nj::store_runs<16>(tile, qt, M, r0, c0, cols);
  if (L == TR && M % 8 == 0 && qa % 8 == 0) return nj::store_runs<8>(tile, qt, M, r0, c0, cols);
  // Else item i writes slot i % SLOTS of the run of column i / SLOTS.
  constexpr int SLOTS = RSEG + 1;
  for (int i = threadIdx.x; i < TC * SLOTS; i += 256) {
    const int j = i / SLOTS, slot = i % SLOTS;
    if (j >= cols) continue;
    unsigned char* run = qt + (long long)(c0 + j) * M + r0;
    const int mis = static_cast<int>(reinterpret_cast<unsigned long long>(run) % 16);
    const int lo = 16 * slot - mis, b0 = lo < 0 ? 0 : lo, b1 = lo + 16 < L ? lo + 16 : L;
    if (b0 >= b1) continue;
    const int word = j / 4, shift = 8 * (j % 4);
    unsigned long long w[2] = {0ull, 0ull};
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (lo + k >= b0 && lo + k < b1)
        w[k / 8] |= static_cast<unsigned long long>((tile[lo + k][word] >> shift) & 0xffu) << (8 * (k % 8));
    nj::store_slot(run + lo, b0 - lo, b1 - lo, w);
  }
}
