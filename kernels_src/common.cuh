// Shared device code for normjit kernels. Hermetic: no CUDA toolkit headers,
// so NVRTC needs no include path (only the driver and libnvrtc at run time).
// Also compiles with nvcc after a Spec (see the prelude in each kernel file).
#pragma once

namespace nj {

// 16-bit float storage types with our own conversions (cuda_fp16.h and
// cuda_bf16.h live in the toolkit, which users need not have).
struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(half_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
// bf16 is the top half of an fp32: widening is a shift.
__device__ __forceinline__ float to_float(bf16_t v) { return __uint_as_float(((unsigned)v.bits) << 16); }

template <class T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
  bf16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
  return b;
}

// VEC elements moved as one access; alignas makes 16-byte vectors one
// LDG.128/STG.128 when the address is aligned (the engine checks that).
template <class T, int VEC> struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Row layout shared by all row kernels: a row of N elements is cut into
// CHUNKS chunks of VEC; thread `lane` of the TPR threads of a row owns chunks
// lane, lane + TPR, ... (ITERS of them), so a warp's accesses are contiguous.
template <int N, int VEC, int TPR> struct RowLayout {
  static constexpr int CHUNKS = (N + VEC - 1) / VEC;
  static constexpr int ITERS = (CHUNKS + TPR - 1) / TPR;
  // Every chunk of every thread is in range and whole: no guards at all.
  static constexpr bool EXACT = N % (VEC * TPR) == 0;
};

// Loads the chunk starting at column `col` of a row; columns >= N read as 0.
template <int N, int VEC, class T>
__device__ __forceinline__ Vec<T, VEC> load_chunk(const T* __restrict__ row, int col, bool exact) {
  Vec<T, VEC> r;
  if (exact || col + VEC <= N) {
    r = *reinterpret_cast<const Vec<T, VEC>*>(row + col);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = col + k < N ? row[col + k] : from_float<T>(0.f);
  }
  return r;
}

template <int N, int VEC, class T>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int col, const Vec<T, VEC>& v, bool exact) {
  if (exact || col + VEC <= N) {
    *reinterpret_cast<Vec<T, VEC>*>(row + col) = v;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (col + k < N) row[col + k] = v.v[k];
  }
}

// Asynchronous global -> shared copies (sm_80+): the data lands in shared
// memory without passing through registers, so rows can be prefetched
// several deep at a small register cost. BYTES is 4, 8 or 16.
template <int BYTES> __device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(BYTES) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Sums of K values over the TPR threads of a row. TPR <= 32: butterfly
// shuffles inside the aligned lane segment. TPR > 32: per-warp shuffles,
// then the row's warps' sums through shared memory, added in a fixed order
// (deterministic); one barrier pair serves all K sums. Every thread of the
// block must call it (it may hold a barrier).
template <int TPR> constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
template <int TPR, int ROWS, int K>
__device__ __forceinline__ void row_reduce(float (&v)[K], float (*smem)[kWarpsPerRow<TPR>][K]) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
  if constexpr (TPR > 32) {
    const int rg = threadIdx.x / TPR, w = (threadIdx.x % TPR) / 32;
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int k = 0; k < K; ++k) smem[rg][w][k] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      v[k] = 0.f;
#pragma unroll
      for (int i = 0; i < TPR / 32; ++i) v[k] += smem[rg][i][k];
    }
    __syncthreads();  // smem is reused by the next call
  }
}

// Element offset of row `row` of a tensor with token stride ld and head
// stride hs: 2-D rows (HEADS false) are row * ld; 3-D rows are token
// row / heads, head row % heads (one division a row, not an element).
template <bool HEADS, class index_t>
__device__ __forceinline__ index_t row_offset(long long row, long long ld, long long hs, long long heads) {
  if constexpr (HEADS) {
    const index_t t = (index_t)row / (index_t)heads;
    return t * (index_t)ld + ((index_t)row - t * (index_t)heads) * (index_t)hs;
  } else {
    return (index_t)row * (index_t)ld;
  }
}

// Rounds through T and back: where model code computes in T (casting modes).
template <class T> __device__ __forceinline__ float round_to(float f) { return to_float(from_float<T>(f)); }

}  // namespace nj
