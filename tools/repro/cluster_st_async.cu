// A standalone program (no normjit code) for compute-sanitizer: CTAs of a
// thread-block cluster swap one float per round through distributed shared
// memory with st.async, each completing on the receiver's mbarrier
// (sm_90). Every CTA checks what it received. Used to tell a sanitizer's own
// failure from a kernel's (tools/gpu_check.sh runs it plain and under each
// tool).
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 cluster_st_async.cu -o cluster_st_async
//   ./cluster_st_async [cluster size 2..16] [rounds] [final cluster barrier 0|1] [threads] [clusters]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

constexpr int kMaxC = 16;

__device__ unsigned smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__global__ void swap_rounds(int rounds, bool final_barrier, float* out) {
  __shared__ float buf[2][kMaxC];
  __shared__ alignas(8) unsigned long long bar[2];
  unsigned rank, csize;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&bar[b])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  float acc = 0.f;
  for (int r = 0; r < rounds; ++r) {
    const int b = r & 1;
    const unsigned parity = (r >> 1) & 1, mb = smem(&bar[b]);
    if (threadIdx.x == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(csize * 4) : "memory");
    if (threadIdx.x < csize) {  // thread p sends this CTA's value to rank p
      const unsigned peer = threadIdx.x;
      unsigned dst, dbar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(smem(&buf[b][rank])), "r"(peer));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dbar) : "r"(mb), "r"(peer));
      const float v = static_cast<float>(rank + 1 + r);
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst), "f"(v),
                   "r"(dbar)
                   : "memory");
    }
    unsigned done = 0;
    while (!done)
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                   : "=r"(done)
                   : "r"(mb), "r"(parity)
                   : "memory");
    for (unsigned s = 0; s < csize; ++s) acc += buf[b][s];
    __syncthreads();  // buf[b] is written again two rounds on
  }
  // Optional: every CTA has received all its values before it gets here, so
  // none is written after it exits; the barrier only makes that explicit.
  if (final_barrier) {
    asm volatile("barrier.cluster.arrive.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

int main(int argc, char** argv) {
  const int C = argc > 1 ? std::atoi(argv[1]) : 2, rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const bool final_barrier = argc > 3 ? std::atoi(argv[3]) != 0 : false;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 128;
  const int clusters = argc > 5 ? std::atoi(argv[5]) : 4;  // more than fit at once: clusters run in waves
  if (C < 2 || C > kMaxC || rounds < 1 || threads < 32 || threads > 1024 || clusters < 1) {
    std::fprintf(stderr,
                 "usage: %s [cluster size 2..%d] [rounds >= 1] [final barrier 0|1] [threads 32..1024] [clusters]\n",
                 argv[0], kMaxC);
    return 2;
  }
  const int n = clusters * C * threads;
  if (C > 8) CK(cudaFuncSetAttribute(swap_rounds, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  float* out = nullptr;
  CK(cudaMalloc(&out, n * sizeof(float)));
  CK(cudaMemset(out, 0xff, n * sizeof(float)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(clusters * C);
  cfg.blockDim = dim3(threads);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, swap_rounds, rounds, final_barrier, out));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  // Each round every CTA receives sum over ranks s of (s + 1 + r).
  double want = 0;
  for (int r = 0; r < rounds; ++r)
    for (int s = 0; s < C; ++s) want += s + 1 + r;
  int bad = 0;
  for (float v : h) bad += v != static_cast<float>(want);
  std::printf("%d clusters of %d, %d rounds, final barrier %d, %d threads: %d of %d values wrong\n", clusters, C, rounds,
              final_barrier, threads, bad, n);
  CK(cudaFree(out));
  return bad ? 1 : 0;
}
