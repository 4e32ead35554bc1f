// Prints the co-resident clusters the driver counts (cudaOccupancyMaxActiveClusters) for
// clusters of 1-16 CTAs at 128-1024 threads and 0-200 KiB of shared memory a CTA: what
// launch_geometry reads per kernel (LoadedKernel::max_clusters). Build and run on a GPU:
//   nvcc -arch=sm_90 -o cluster_probe tools/cluster_probe.cu && ./cluster_probe
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(float* p) { extern __shared__ float s[]; if (p) p[threadIdx.x] = s[threadIdx.x]; }
int main() {
  cudaDeviceProp pr; cudaGetDeviceProperties(&pr, 0);
  printf("%s sms=%d\n", pr.name, pr.multiProcessorCount);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  for (int smemk : {0, 60, 100, 200})
  for (int t : {128, 256, 512, 1024}) {
    printf("threads %4d smem %3dK:", t, smemk);
    for (int cl : {1, 2, 4, 8, 16}) {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(cl * 64); c.blockDim = dim3(t); c.dynamicSmemBytes = smemk * 1024;
      cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeClusterDimension; a[0].val.clusterDim.x = cl; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
      c.attrs = a; c.numAttrs = 1;
      int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k, &c);
      printf(" c%d=%d%s", cl, n, e ? "(err)" : "");
    }
    printf("\n");
  }
}
