// The JIT pipeline as value types:
//   KernelSpec --compile_spec--> KernelBinary (cubin, disk-cached)
//              --LoadedKernel--> CUmodule + CUfunction + attributes (RAII)
// KernelCache memoises loaded kernels per (context, spec) for the process.
#pragma once

#include <cuda.h>

#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "compile/specialization.hpp"

namespace normjit::detail {

/// A compiled kernel for one arch.
struct KernelBinary {
  std::string cubin;
  std::string arch;       ///< "sm_90"
  std::string cache_key;  ///< 32 hex digits
  bool from_disk = false;
};

/// Hash of everything that determines the cubin: template sources, the
/// spec's generated source, NVRTC options and version, arch, engine version.
std::string binary_cache_key(const KernelSpec& spec, const std::string& arch);

/// Whether $NORMJIT_OFFLINE=1: a deployment that promises never to compile
/// or tune. compile_spec then serves the kernel cache only, and the engine
/// never tunes; either need throws Error(Cache) naming what is missing.
bool offline_mode();

/// Compiles `spec` for `arch`, or reads it from `<kernel_dir>/<key>.cubin`
/// (kernel_dir empty: no disk cache). New cubins are written atomically.
KernelBinary compile_spec(const KernelSpec& spec, const std::string& arch, const std::string& kernel_dir);

/// A loaded module and its kernel, with the attributes the tuner prunes on.
class LoadedKernel {
 public:
  LoadedKernel(const KernelSpec& spec, const KernelBinary& bin);
  ~LoadedKernel();
  LoadedKernel(const LoadedKernel&) = delete;
  LoadedKernel& operator=(const LoadedKernel&) = delete;

  CUfunction function() const { return fn_; }
  const KernelSpec& spec() const { return spec_; }
  int num_regs = 0, local_bytes = 0, static_smem = 0, max_threads = 0;
  /// Resident blocks per SM at the spec's block size (>= 1 when launchable).
  int blocks_per_sm = 0;
  /// Cluster specs: how many clusters the device runs at once (0: none fit).
  int max_clusters = 0;

  /// cuLaunchKernel with `args` (cuLaunchKernelEx with the cluster
  /// dimension for cluster specs); errors carry the spec's name.
  void launch(unsigned grid, unsigned block, CUstream stream, void** args, unsigned grid_y = 1) const;
  /// The module's q transpose kernel (spec().transpose_kernel_name()), on a
  /// grid x by y of 256-thread blocks.
  void launch_transpose(unsigned grid, unsigned grid_y, CUstream stream, void** args) const;
  /// The module's one-launch kernel (spec().once_kernel_name()): one block,
  /// or a cluster of `ctas` blocks (2..once_ctas), one a row group.
  void launch_once(unsigned ctas, unsigned block, CUstream stream, void** args) const;
  /// One of a sharded norm's kernels (KernelKind::Sharded specs), on a grid
  /// of `grid` blocks of the spec's threads.
  void launch_shard(ShardKernel which, unsigned grid, CUstream stream, void** args) const;
  /// The most CTAs one cluster of the once kernel may hold on this device
  /// (its own occupancy; 1 without clusters or without a once kernel).
  int once_ctas = 1;

 private:
  // A launch config of `grid` CTAs in clusters of `cluster` (0: the spec's size).
  void cluster_config(CUlaunchConfig& lc, CUlaunchAttribute& at, unsigned grid, unsigned block, CUstream stream,
                      unsigned cluster = 0) const;
  // cuLaunchKernel of one of the module's kernels; errors name `what` (the
  // kernel, or "" for the spec's own) and the spec.
  void launch_plain(CUfunction f, const char* what, unsigned grid, unsigned grid_y, unsigned block, unsigned smem,
                    CUstream stream, void** args) const;
  // cuLaunchKernelEx of the same, in clusters of `cluster` CTAs (0: the spec's size).
  void launch_cluster(CUfunction f, const char* what, unsigned grid, unsigned grid_y, unsigned block, unsigned cluster,
                      CUstream stream, void** args) const;
  KernelSpec spec_;
  CUmodule mod_ = nullptr;
  CUfunction fn_ = nullptr;
  CUfunction transpose_ = nullptr, once_ = nullptr;
  CUfunction shard_[4] = {};  // KernelKind::Sharded: ShardKernel order
};

/// Thread-safe memo of loaded kernels in the current context; concurrent
/// requests for one spec compile it once.
class KernelCache {
 public:
  explicit KernelCache(std::string kernel_dir) : kernel_dir_(std::move(kernel_dir)) {}
  /// The kernel for `spec` in the current context, for `arch`; `compiled`,
  /// when given, is its binary (no compile or disk read then).
  std::shared_ptr<const LoadedKernel> get(const KernelSpec& spec, const std::string& arch,
                                          const KernelBinary* compiled = nullptr);
  const std::string& kernel_dir() const { return kernel_dir_; }

 private:
  std::string kernel_dir_;
  std::mutex mu_;
  std::map<std::string, std::shared_future<std::shared_ptr<const LoadedKernel>>> loaded_;
};

}  // namespace normjit::detail
