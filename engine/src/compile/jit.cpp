#include "compile/jit.hpp"

#include <cstdlib>
#include "core/trace.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "compile/cubin.hpp"
#include "core/atomic_file.hpp"
#include "device/device_facts.hpp"
#include "device/driver.hpp"
#include "core/hash.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"

namespace normjit::detail {

namespace fs = std::filesystem;

std::string binary_cache_key(const KernelSpec& spec, const std::string& arch) {
  Hasher h;
  h.add(spec.source_hash()).add(arch).add(nvrtc().version).add(NORMJIT_VERSION_STRING);
  return h.hex();
}

namespace {
bool read_file(const fs::path& p, std::string* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return in.good() || in.eof();
}

// The disk cache is an optimisation: a failed write is not an error.
void write_atomic(const fs::path& p, const std::string& data) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  (void)write_file_atomically(p.string(), data);
}

// A compile span's registers and stack frame: what sets a variant's occupancy.
void trace_resources(trace::Span& span, const std::string& cubin) {
  if (!trace::enabled()) return;
  const CubinResources r = cubin_resources(cubin);
  span.args["regs"] = std::to_string(r.regs);
  span.args["frame_bytes"] = std::to_string(r.frame_bytes);
}

}  // namespace

bool offline_mode() {
  const char* v = std::getenv("NORMJIT_OFFLINE");
  return v && std::string(v) == "1";
}

KernelBinary compile_spec(const KernelSpec& spec, const std::string& arch, const std::string& kernel_dir) {
  trace::Span span("compile", spec.name());
  span.args["arch"] = arch;
  KernelBinary b;
  b.arch = arch;
  b.cache_key = binary_cache_key(spec, arch);
  const fs::path file = kernel_dir.empty() ? fs::path() : fs::path(kernel_dir) / (b.cache_key + ".cubin");
  // A file that is not a whole CUDA ELF holding the kernel (truncated,
  // damaged, another file) is recompiled and replaced, never loaded.
  if (!kernel_dir.empty() && read_file(file, &b.cubin) && cubin_problem(b.cubin, spec.kernel_name()).empty()) {
    b.from_disk = true;
    span.args["from"] = "cubin cache";
    trace_resources(span, b.cubin);
    return b;
  }
  if (offline_mode())
    throw Error(ErrorKind::Cache,
                fmt::format("NORMJIT_OFFLINE=1: kernel {} for {} is not in the kernel cache {} (compile it ahead: "
                            "normjit compile, with the same engine and NVRTC)",
                            spec.name(), arch, kernel_dir.empty() ? std::string("(none: disk cache off)") : file.string()));
  span.args["from"] = "nvrtc";
  const std::string src = spec.source();
  b.cubin = compile_cubin(src, spec.name() + ".cu", kernel_sources(), nvrtc_options(), spec.kernel_name(), arch).cubin;
  if (!kernel_dir.empty()) write_atomic(file, b.cubin);
  trace_resources(span, b.cubin);
  return b;
}

void LoadedKernel::cluster_config(CUlaunchConfig& lc, CUlaunchAttribute& at, unsigned grid, unsigned block,
                                  CUstream stream, unsigned cluster) const {
  at.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at.value.clusterDim.x = cluster ? cluster : static_cast<unsigned>(spec_.cfg.cluster);
  at.value.clusterDim.y = at.value.clusterDim.z = 1;
  lc.gridDimX = grid;
  lc.gridDimY = lc.gridDimZ = 1;
  lc.blockDimX = block;
  lc.blockDimY = lc.blockDimZ = 1;
  lc.sharedMemBytes = static_cast<unsigned>(spec_.dynamic_smem());
  lc.hStream = stream;
  lc.attrs = &at;
  lc.numAttrs = 1;
}

LoadedKernel::LoadedKernel(const KernelSpec& spec, const KernelBinary& bin) : spec_(spec) {
  trace::Span span("load", spec.name());
  NJ_CU(cuModuleLoadData(&mod_, bin.cubin.data()));
  try {
    NJ_CU(cuModuleGetFunction(&fn_, mod_, spec.kernel_name()));
    if (const char* t = spec.transpose_kernel_name()) NJ_CU(cuModuleGetFunction(&transpose_, mod_, t));
    if (const char* o = spec.once_kernel_name()) NJ_CU(cuModuleGetFunction(&once_, mod_, o));
    if (spec.kind == KernelKind::Sharded)
      for (ShardKernel k : {ShardKernel::Stats, ShardKernel::Apply, ShardKernel::BackwardStats, ShardKernel::BackwardApply})
        NJ_CU(cuModuleGetFunction(&shard_[static_cast<int>(k)], mod_, shard_kernel_name(k)));
    auto attr = [&](CUfunction_attribute a) {
      int v = 0;
      NJ_CU(cuFuncGetAttribute(&v, a, fn_));
      return v;
    };
    num_regs = attr(CU_FUNC_ATTRIBUTE_NUM_REGS);
    local_bytes = attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
    static_smem = attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
    max_threads = attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    // Past 48 KiB of shared memory in all (static + dynamic) a kernel must opt
    // in to its dynamic part; a 48 KiB stage ring plus a few static bytes
    // fails to launch otherwise.
    if (static_smem + spec.dynamic_smem() > 48 * 1024)
      NJ_CU(cuFuncSetAttribute(fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.dynamic_smem()));
    if (max_threads >= spec.threads())
      NJ_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, fn_, spec.threads(), spec.dynamic_smem()));
    if (const int cl = spec.cfg.cluster; cl > 1) {
      // Clusters above 8 CTAs are Hopper's non-portable sizes: opt in.
      if (cl > 8) NJ_CU(cuFuncSetAttribute(fn_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
      CUlaunchAttribute at{};
      CUlaunchConfig lc{};
      cluster_config(lc, at, static_cast<unsigned>(cl), static_cast<unsigned>(spec.threads()), nullptr);
      if (blocks_per_sm > 0) NJ_CU(cuOccupancyMaxActiveClusters(&max_clusters, fn_, &lc));
      if (max_clusters < 1) blocks_per_sm = 0;  // no cluster of this size fits: not launchable
    }
    if (once_ && blocks_per_sm > 0 && max_cluster_of_arch(sm_of_arch(bin.arch)) > 1) {
      // The once kernel's largest cluster here: up to 16 CTAs (Hopper's
      // non-portable size, opted in), as its registers and GPCs allow.
      NJ_CU(cuFuncSetAttribute(once_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
      CUlaunchAttribute at{};
      CUlaunchConfig lc{};
      cluster_config(lc, at, 16, static_cast<unsigned>(spec.threads()), nullptr, 1);
      at.id = CU_LAUNCH_ATTRIBUTE_IGNORE;  // the query asks for the size; it takes no cluster dimension
      // A driver that cannot answer leaves it one program (two phases, no cluster).
      int n = 0;
      if (cu().cuOccupancyMaxPotentialClusterSize(&n, once_, &lc) != CUDA_SUCCESS) n = 1;
      once_ctas = std::max(1, n);
      span.args["once_ctas"] = std::to_string(once_ctas);
    }
    span.args["blocks_per_sm"] = std::to_string(blocks_per_sm);
  } catch (...) {
    cu().cuModuleUnload(mod_);
    throw;
  }
}

LoadedKernel::~LoadedKernel() {
  if (mod_) cu().cuModuleUnload(mod_);  // errors at teardown are ignored
}

void LoadedKernel::launch_plain(CUfunction f, const char* what, unsigned grid, unsigned grid_y, unsigned block,
                                unsigned smem, CUstream stream, void** args) const {
  const CUresult r = cu().cuLaunchKernel(f, grid, grid_y, 1, block, 1, 1, smem, stream, args, nullptr);
  if (r != CUDA_SUCCESS)
    throw_driver_error(
        r, fmt::format("cuLaunchKernel({}{}, grid {}x{}, block {})", what, spec_.name(), grid, grid_y, block).c_str(),
        __FILE__, __LINE__);
}

void LoadedKernel::launch_cluster(CUfunction f, const char* what, unsigned grid, unsigned grid_y, unsigned block,
                                  unsigned cluster, CUstream stream, void** args) const {
  CUlaunchAttribute at{};
  CUlaunchConfig lc{};
  cluster_config(lc, at, grid, block, stream, cluster);
  lc.gridDimY = grid_y;
  const CUresult r = cu().cuLaunchKernelEx(&lc, f, args, nullptr);
  if (r != CUDA_SUCCESS)
    throw_driver_error(r,
                       fmt::format("cuLaunchKernelEx({}{}, grid {}x{} in clusters of {}, block {})", what, spec_.name(),
                                   grid, grid_y, at.value.clusterDim.x, block)
                           .c_str(),
                       __FILE__, __LINE__);
}

void LoadedKernel::launch(unsigned grid, unsigned block, CUstream stream, void** args, unsigned grid_y) const {
  if (grid == 0 || grid_y == 0) return;
  if (spec_.cfg.cluster <= 1) return launch_plain(fn_, "", grid, grid_y, block, spec_.dynamic_smem(), stream, args);
  launch_cluster(fn_, "", grid, grid_y, block, 0, stream, args);
}

void LoadedKernel::launch_transpose(unsigned grid, unsigned grid_y, CUstream stream, void** args) const {
  if (grid == 0 || grid_y == 0) return;
  launch_plain(transpose_, "normjit_q_transpose of ", grid, grid_y, 256, 0, stream, args);
}

void LoadedKernel::launch_shard(ShardKernel which, unsigned grid, CUstream stream, void** args) const {
  if (grid == 0) return;
  const std::string what = std::string(shard_kernel_name(which)) + " of ";
  launch_plain(shard_[static_cast<int>(which)], what.c_str(), grid, 1, static_cast<unsigned>(spec_.threads()), 0, stream,
               args);
}

void LoadedKernel::launch_once(unsigned ctas, unsigned block, CUstream stream, void** args) const {
  if (ctas <= 1) return launch_plain(once_, "normjit_norm_fwd_once of ", 1, 1, block, spec_.dynamic_smem(), stream, args);
  launch_cluster(once_, "normjit_norm_fwd_once of ", ctas, 1, block, ctas, stream, args);
}

std::shared_ptr<const LoadedKernel> KernelCache::get(const KernelSpec& spec, const std::string& arch,
                                                     const KernelBinary* compiled) {
  CUcontext ctx = nullptr;
  NJ_CU(cuCtxGetCurrent(&ctx));
  const std::string key = fmt::format("{}|{}|{}", static_cast<const void*>(ctx), arch, spec.name());
  // A hit (every call after the first) takes no allocation: the promise is
  // made only by the call that loads the kernel.
  std::optional<std::promise<std::shared_ptr<const LoadedKernel>>> promise;
  std::shared_future<std::shared_ptr<const LoadedKernel>> fut;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = loaded_.find(key);
    if (it == loaded_.end()) {
      promise.emplace();
      fut = promise->get_future().share();
      loaded_.emplace(key, fut);
      owner = true;
    } else {
      fut = it->second;
    }
  }
  if (owner) {
    try {
      promise->set_value(std::make_shared<const LoadedKernel>(
          spec, compiled ? *compiled : compile_spec(spec, arch, kernel_dir_)));
    } catch (...) {
      // Forget the failure so a later call can retry, and tell every waiter.
      {
        std::lock_guard<std::mutex> lk(mu_);
        loaded_.erase(key);
      }
      promise->set_exception(std::current_exception());
    }
  }
  return fut.get();
}

}  // namespace normjit::detail
