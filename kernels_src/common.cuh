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

// Element k of a chunk in fp32. A bf16 pair's 32-bit word widens in one
// instruction an element: the low half shifted up, the high half masked
// (from the 16-bit element, ptxas shifted the high half down, then up).
template <class T, int VEC> __device__ __forceinline__ float elem_f32(const Vec<T, VEC>& v, int k) {
  return to_float(v.v[k]);
}
template <int VEC> __device__ __forceinline__ float elem_f32(const Vec<bf16_t, VEC>& v, int k) {
  if constexpr (VEC >= 2) {
    const unsigned w = reinterpret_cast<const unsigned*>(&v)[k / 2];
    return __uint_as_float(k % 2 ? (w & 0xffff0000u) : (w << 16));
  } else {
    return to_float(v.v[k]);
  }
}

// The vector at `p` where `take`, else zeros: one predicated load into
// registers zeroed as whole words. (Zeroed element by element, ptxas kept
// 16-bit elements a register each and split every chunk on arrival, before
// the next chunk's load: one round trip a chunk.) READ_ONLY: through the
// read-only data path (ld.global.nc), for the weight and bias, which no
// kernel writes: a plain load may alias the row's stores, so ptxas issued
// each chunk's after the previous chunk's store, one L1 round trip a chunk
// (SASS of rms bf16 32768x128, v8.t4.r32: four in a row per row).
template <int BYTES> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };
template <class T, int VEC, bool READ_ONLY = false>
__device__ __forceinline__ Vec<T, VEC> load_vec_if(const T* p, bool take) {
  using W = typename Word<sizeof(Vec<T, VEC>)>::type;
  union {
    W w;
    Vec<T, VEC> v;
  } u;
  u.w = W{};
  if (take) {
    if constexpr (READ_ONLY) u.w = __ldg(reinterpret_cast<const W*>(p));
    else u.w = *reinterpret_cast<const W*>(p);
  }
  return u.v;  // (memcpy from a W kept an 8-byte W in a stack frame in rows of fp16 by 4)
}

// Row layout shared by all row kernels: a row of N elements is cut into
// CHUNKS chunks of VEC; a cluster of C CTAs splits them into C slices of
// SLICE_CHUNKS (C = 1: one slice, the whole row); thread `lane` of the TPR
// threads of a row in a CTA owns chunks lane, lane + TPR, ... of its slice
// (ITERS of them), so a warp's accesses are contiguous.
template <int N, int VEC, int TPR, int C = 1> struct RowLayout {
  static constexpr int CHUNKS = (N + VEC - 1) / VEC;
  static constexpr int SLICE_CHUNKS = (CHUNKS + C - 1) / C;
  static constexpr int SLICE = SLICE_CHUNKS * VEC;  // columns per CTA
  static constexpr int ITERS = (SLICE_CHUNKS + TPR - 1) / TPR;
  // Every chunk of every thread is in range and whole: no guards at all.
  static constexpr bool EXACT = N % (VEC * TPR * C) == 0;
};

// The columns of one thread: chunk i starts at col(i) and is part of the row
// (and of this CTA's slice) when in(i). PAD: columns past N that a slot may
// still start at (a peeled row's slots start up to a vector late, from its
// first inner chunk: norm_fwd.cuh's span_of).
template <int N, int VEC, int TPR, int C = 1, int PAD = 0> struct ThreadCols {
  using L = RowLayout<N, VEC, TPR, C>;
  int c0, lane;  // first column of the CTA's slice; the thread's lane in its row
  __device__ __forceinline__ int chunk(int i) const { return lane + i * TPR; }
  __device__ __forceinline__ int col(int i) const { return c0 + chunk(i) * VEC; }
  __device__ __forceinline__ bool in(int i) const {
    return L::EXACT || (chunk(i) < L::SLICE_CHUNKS && col(i) < N + PAD);
  }
};

// Loads the chunk starting at column `col` (a multiple of VEC) of a row;
// columns >= N read as 0. Where VEC divides N a chunk lies wholly inside the
// row or wholly past it, and the test says so (col < N): tested as
// col + VEC <= N, ptxas kept the element-wise path it cannot prove dead,
// and hoisted its first element's load ahead of every chunk's vector.
template <int N, int VEC, class T>
__device__ __forceinline__ Vec<T, VEC> load_chunk(const T* __restrict__ row, int col, bool exact) {
  Vec<T, VEC> r;
  if constexpr (N % VEC == 0) {
    if (exact || col < N) {
      r = *reinterpret_cast<const Vec<T, VEC>*>(row + col);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) r.v[k] = from_float<T>(0.f);
    }
  } else if (exact || col + VEC <= N) {
    r = *reinterpret_cast<const Vec<T, VEC>*>(row + col);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = col + k < N ? row[col + k] : from_float<T>(0.f);
  }
  return r;
}

template <int N, int VEC, class T>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int col, const Vec<T, VEC>& v, bool exact) {
  if constexpr (N % VEC == 0) {
    if (exact || col < N) *reinterpret_cast<Vec<T, VEC>*>(row + col) = v;
  } else if (exact || col + VEC <= N) {
    *reinterpret_cast<Vec<T, VEC>*>(row + col) = v;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (col + k < N) row[col + k] = v.v[k];
  }
}

// PEEL: defined only by the preludes of peeled rows (rows that start
// anywhere in a vector: norm_fwd.cuh's FwdRow, norm_bwd.cuh's Cols), so the
// others compile to the code they had. A function, not a data member: no
// variable joins the other kernels' code.
template <class S> constexpr auto peel_or0(int) -> decltype(S::PEEL + 0) { return S::PEEL; }
template <class S> constexpr int peel_or0(long) { return 0; }
template <class S> constexpr bool peel_of() { return peel_or0<S>(0) != 0; }

// A peeled row's chunk at an aligned column `col` of which only columns
// [lo, hi) belong to the row. Whole chunks move as one vector; the row's
// first and last chunk element by element, so nothing outside the row is
// read or written.
template <int VEC, class T>
__device__ __forceinline__ Vec<T, VEC> load_span(const T* __restrict__ row, int col, int lo, int hi) {
  Vec<T, VEC> r;
  if (col >= lo && col + VEC <= hi) {
    r = *reinterpret_cast<const Vec<T, VEC>*>(row + col);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = col + k >= lo && col + k < hi ? row[col + k] : from_float<T>(0.f);
  }
  return r;
}

template <int VEC, class T>
__device__ __forceinline__ void store_span(T* __restrict__ row, int col, const Vec<T, VEC>& v, int lo, int hi) {
  if (col >= lo && col + VEC <= hi) {
    *reinterpret_cast<Vec<T, VEC>*>(row + col) = v;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (col + k >= lo && col + k < hi) row[col + k] = v.v[k];
  }
}

// A peeled row's output pointer moved back to the vector boundary at or
// before it: p - lo, since every row tensor starts at element lo of a
// vector (the engine's fit_alignment). Masked, so the compiler sees the chunks'
// addresses aligned: after `y -= lo` (lo being x's) it split each chunk's
// store into 16- or 32-bit ones, 4 to 8 a chunk (rms bf16 512x100003: 2.1x
// the time on an H100). The stores turn generic (the mask hides the address
// space); an st.global in asm, whose memory clobber took the loads' .nc,
// ran 12% slower on ln bf16 4096x5121 with a residual.
template <int VEC, class T> __device__ __forceinline__ T* align_down(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<unsigned long long>(p) & ~(unsigned long long)(VEC * sizeof(T) - 1));
}

// A vector of 4, 8 or 16 bytes stored to global memory at p, which the
// caller knows to be aligned to its size where the compiler cannot (a
// peeled row's pointer moved back by lo elements): a plain store there was
// split into 2- and 4-byte ones, and one through a masked pointer
// (align_down) became generic and took 28 more registers (norm_bwd.cuh's
// peeled rows, v8.t128.c16). No "memory" clobber: the rows' loads may still
// move past it (they never alias dx).
template <class V> __device__ __forceinline__ void st_global(V* p, const V& v) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16, "4, 8 or 16 bytes");
  union {
    V v;
    unsigned w[sizeof(V) / 4];
  } u{v};
  const unsigned* w = u.w;
  const size_t g = __cvta_generic_to_global(p);
  if constexpr (sizeof(V) == 16)
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(g), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
  else if constexpr (sizeof(V) == 8)
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(g), "r"(w[0]), "r"(w[1]));
  else
    asm volatile("st.global.b32 [%0], %1;" ::"l"(g), "r"(w[0]));
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
// The same, of which only the first `src_bytes` come from gmem and the rest
// are zeros (a peeled row's last chunk: nothing past the row is read).
template <int BYTES> __device__ __forceinline__ void cp_async_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(gmem), "n"(BYTES), "r"(src_bytes)
                 : "memory");
}
// A whole vector of 4 bytes or more, 16 at a time.
template <class V> __device__ __forceinline__ void cp_async_vec(V* smem, const V* gmem) {
  constexpr int B = sizeof(V) < 16 ? sizeof(V) : 16;
  static_assert(B >= 4 && sizeof(V) % B == 0, "cp.async moves 4, 8 or 16 bytes");
#pragma unroll
  for (int o = 0; o < static_cast<int>(sizeof(V)); o += B)
    cp_async<B>(reinterpret_cast<char*>(smem) + o, reinterpret_cast<const char*>(gmem) + o);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Sums of K values over the TPR threads of a row. TPR <= 32: butterfly
// shuffles inside the aligned lane segment. TPR > 32: per-warp shuffles,
// then the row's warps' sums through shared memory, added in a fixed order
// (deterministic); one barrier pair serves all K sums. The last KMAX of
// the K values are maxima of non-negative values instead (fmaxf: NaN
// dropped), reduced in the same shuffles and barriers. Every thread of the
// block must call it (it may hold a barrier).
// A row of 8 warps or more adds its warps' sums with
// shuffles (each lane reads one warp's, a butterfly, a broadcast; still a
// fixed order) instead of every thread adding all of them: at 1024 threads
// that was 32 loads and adds per value and row, more than a backward
// thread's 16 elements took (rms bf16 1024x131072 backward, 16 warps: 339 ->
// 223 us on an H200; forward, ln fp16 4096x32768 v8.t512: 160 -> 135 us).
template <int TPR> constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
template <int TPR, int ROWS, int K, int KMAX = 0>
__device__ __forceinline__ void row_reduce(float (&v)[K], float (*smem)[kWarpsPerRow<TPR>][K]) {
  auto combine = [](int k, float a, float b) { return k < K - KMAX ? a + b : fmaxf(a, b); };
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = combine(k, v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
  if constexpr (TPR > 32) {
    constexpr int W = TPR / 32;
    const int rg = threadIdx.x / TPR, w = (threadIdx.x % TPR) / 32, lane = threadIdx.x % 32;
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < K; ++k) smem[rg][w][k] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if constexpr (W >= 8) {
        float t = lane < W ? smem[rg][lane < W ? lane : 0][k] : 0.f;
#pragma unroll
        for (int o = W / 2; o > 0; o >>= 1) t = combine(k, t, __shfl_xor_sync(0xffffffffu, t, o));
        v[k] = __shfl_sync(0xffffffffu, t, 0);
      } else {
        v[k] = 0.f;
#pragma unroll
        for (int i = 0; i < W; ++i) v[k] = combine(k, v[k], smem[rg][i][k]);
      }
    }
    __syncthreads();  // smem is reused by the next call
  }
}

// Thread-block clusters (sm_90+): the CTAs of a cluster split one row, and
// each CTA's partial row statistics reach the others through distributed
// shared memory (DSMEM). Used only when C > 1, so C = 1 kernels still
// compile for older GPUs.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned num_clusters() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
// The CTAs of the launch's cluster, and this CTA's rank in it, for kernels
// of any arch: 1 and 0 below sm_90, or where the launch has no cluster.
__device__ __forceinline__ unsigned cluster_ctas() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
#else
  return 1;
#endif
}
__device__ __forceinline__ unsigned cluster_rank_any() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cluster_rank();
#else
  return 0;
#endif
}

// DSMEM primitives of the cluster exchanges below (sm_90+): a shared
// address as a 32-bit offset, its peer's copy in CTA `rank`, a float stored
// there whose 4 bytes complete on the peer's mbarrier, and a wait for the
// phase of parity `parity` of a local mbarrier.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned dsmem_map(unsigned local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void dsmem_store_async(unsigned dst, float v, unsigned dst_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst), "f"(v),
               "r"(dst_bar)
               : "memory");
}
// Two floats at once (8-byte aligned `dst`): one transaction on the peer's mbarrier, not two.
__device__ __forceinline__ void dsmem_store_async(unsigned dst, float v0, float v1, unsigned dst_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst),
               "f"(v0), "f"(v1), "r"(dst_bar)
               : "memory");
}
// Thread 0 sets up n mbarriers of one arrival each and publishes them to
// the cluster; every thread then arrives at the cluster barrier whose wait
// (before the first st.async to a peer) makes them safe to target.
__device__ __forceinline__ void mbarriers_init(unsigned long long* bars, int n) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < n; ++b)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[b])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// This CTA's arrival on `bar` for a phase that completes once `bytes` of
// st.async have landed on it.
__device__ __forceinline__ void mbarrier_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}

// The max of one float over a cluster of a launch's size (2..16 CTAs: tensor
// scaling at decode, norm_fwd_once). Each CTA stores its value into every
// peer's shared memory with st.async, whose bytes complete on the peer's
// mbarrier: no fence and no barrier after (a release barrier before and
// after the exchange compiled to MEMBAR.ALL.GPU each: 32x7168 over 16 CTAs
// of 1024 threads took 6.91 us on an H200 with them, 4.35 without), since
// a CTA reads only its own shared memory and
// moves on only once every peer's value has reached it. All threads call
// init() early (it arrives at a cluster barrier) and max() once, which
// waits on that barrier first.
struct ClusterMax {
  struct Shared {
    float buf[16];
    unsigned long long bar;  // mbarrier, 8-byte aligned
  };
  static __device__ __forceinline__ Shared& shared() {
    __shared__ Shared s;  // one a CTA, whoever calls
    return s;
  }
  static __device__ __forceinline__ void init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    mbarriers_init(&shared().bar, 1);
#endif
  }
  // v: the CTA's value, the same in every thread.
  static __device__ __forceinline__ float max(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    Shared& sh = shared();
    const unsigned n = cluster_ctas(), me = cluster_rank(), bar = smem_addr(&sh.bar);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every peer's mbarrier is initialised
    if (threadIdx.x == 0) mbarrier_expect_tx(bar, n * 4);
    if (threadIdx.x < n)
      dsmem_store_async(dsmem_map(smem_addr(&sh.buf[me]), threadIdx.x), v, dsmem_map(bar, threadIdx.x));
    mbarrier_wait(bar, 0);
    const unsigned lane = threadIdx.x % 32;
    float m = lane < n ? sh.buf[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
#else
    return v;
#endif
  }
};

template <int C, int K> struct ClusterExchange {
  struct Shared {
    float buf[2][C][K];           // [parity][sender rank][value]
    unsigned long long bar[2];    // mbarriers, 8-byte aligned
  };
  Shared& sh;
  int round = 0;

  // Every thread calls init(), later ready() before the first exchange; the
  // loads in between overlap the cluster barrier that publishes the mbarriers.
  __device__ __forceinline__ explicit ClusterExchange(Shared& s) : sh(s) {}
  __device__ __forceinline__ void init() { mbarriers_init(sh.bar, 2); }
  __device__ __forceinline__ void ready() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

  // v: this CTA's values (in every thread). Afterwards lane r < C of every
  // warp holds rank r's values, the other lanes 0.
  __device__ __forceinline__ void exchange(float (&v)[K]) {
    const int b = round & 1;
    const unsigned parity = (round >> 1) & 1;
    ++round;
    const unsigned bar = smem_addr(&sh.bar[b]);
    if (threadIdx.x == 0) mbarrier_expect_tx(bar, C * K * 4);
    if (threadIdx.x < C * K) {
      const unsigned peer = threadIdx.x / K, k = threadIdx.x % K;
      const unsigned me = cluster_rank();
      float val = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (j == (int)k) val = v[j];
      dsmem_store_async(dsmem_map(smem_addr(&sh.buf[b][me][k]), peer), val, dsmem_map(bar, peer));
    }
    mbarrier_wait(bar, parity);
    const unsigned lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = lane < C ? sh.buf[b][lane < C ? lane : 0][k] : 0.f;
  }
};
// The sum of a warp's lanes, in every lane. A butterfly adds the same pairs in
// every lane, and float addition commutes, so every lane, warp and CTA of the
// cluster gets the same bits: the CTAs agree on the row's statistics.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The largest of a warp's lanes, in every lane (fmaxf: NaN drops out, as
// amax ignores NaN).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
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

// w' = w + W_OFFSET of a weight element (S: a kernel's Spec). A zero offset
// is skipped: w + 0.f is an instruction (it turns -0 into +0), each element
// of each row where a kernel reads its weight per row.
template <class S, class T> __device__ __forceinline__ float w_prime(T w) {
  if constexpr (S::W_OFFSET == 0.f) return to_float(w);
  else return to_float(w) + S::W_OFFSET;
}

// Rounds through T and back: where model code computes in T (casting modes).
template <class T> __device__ __forceinline__ float round_to(float f) { return to_float(from_float<T>(f)); }

}  // namespace nj
