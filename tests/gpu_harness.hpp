// Helpers for the GPU tests: random tensors laid out as on the device,
// poisoned outputs, and the float64 reference comparison.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "device/driver.hpp"
#include "core/host_dtype.hpp"
#include "compile/jit.hpp"
#include "runtime/ops.hpp"
#include "core/reference.hpp"
#include "compile/specialization.hpp"
#include "core/parallel.hpp"

namespace normjit::test {

using namespace normjit::detail;

/// Device 0's primary context, current on the calling thread for the life of
/// one test case. Every GPU case starts with it (GPU_TEST_CASE), so a case
/// never relies on a context an earlier case made current: `-tc=<one case>`
/// and compute-sanitizer runs of single cases (tools/sanitize.sh) work, in
/// any order. The primary context is retained once per process and never
/// released (cases keep engines, with modules and buffers in it, in
/// statics); the case's end leaves the thread with no current context, so a
/// case that forgot the fixture fails the same way in a full run as alone.
struct GpuContext {
  GpuContext() {
    static const CUcontext primary = [] {
      CUdevice dev = 0;
      NJ_CU(cuDeviceGet(&dev, 0));
      CUcontext ctx = nullptr;
      NJ_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
      return ctx;
    }();
    NJ_CU(cuCtxSetCurrent(primary));
  }
  ~GpuContext() {
    // Work the case queued finishes inside it (an asynchronous fault is
    // reported by the case that caused it); no throwing from a destructor.
    const CUresult r = cu().cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      cu().cuGetErrorName(r, &name);
      FAIL_CHECK(fmt::format("cuCtxSynchronize at the end of the case failed: {}", name ? name : "?"));
    }
    cu().cuCtxSetCurrent(nullptr);
  }
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;
};

}  // namespace normjit::test

/// A test case that needs the GPU: runs with the primary context current
/// (normjit::test::GpuContext), whatever ran before it.
#define GPU_TEST_CASE(name) TEST_CASE_FIXTURE(::normjit::test::GpuContext, name)

namespace normjit::test {

/// The suite's one directory of compiled kernels, shared by every Engine and
/// KernelCache of the process (a kernel two cases need is compiled once):
/// $NORMJIT_TEST_KERNEL_DIR if set (kept, e.g. to iterate on a test with
/// the kernels already compiled), else a fresh empty directory removed at
/// exit, so a run compiles every kernel it launches from scratch.
inline const std::string& suite_kernel_dir() {
  struct Dir {
    std::string path;
    bool owned = false;
    Dir() {
      if (const char* e = std::getenv("NORMJIT_TEST_KERNEL_DIR"); e && *e) {
        path = e;
      } else {
        path = (std::filesystem::temp_directory_path() / fmt::format("normjit-gpu-kernels-{}", ::getpid())).string();
        std::filesystem::remove_all(path);
        owned = true;
      }
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      if (owned) std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

/// Engine options for a test engine: its own tuned-config cache under
/// `tag` (tests never read or write the user's), the suite's kernels.
inline EngineOptions suite_engine_options(const std::string& tag, TunePolicy policy = TunePolicy::Never) {
  EngineOptions o;
  o.tune_policy = policy;
  o.cache_dir = (std::filesystem::temp_directory_path() / fmt::format("normjit-gpu-{}-{}", tag, ::getpid())).string();
  o.kernel_dir = suite_kernel_dir();
  return o;
}

/// Compiles `specs` (duplicates skipped) into the suite's kernel directory,
/// on every core: a case compiles what it will launch first, so its launches
/// only load cubins.
inline void compile_all(const std::vector<KernelSpec>& specs) {
  const std::string arch = device_info(current_device()).arch();
  std::vector<KernelSpec> todo;
  std::set<std::string> seen;
  for (const auto& s : specs)
    if (seen.insert(s.name()).second) todo.push_back(s);
  parallel_for(static_cast<int>(todo.size()),
               [&](int i) { compile_spec(todo[i], arch, suite_kernel_dir()); });
}

/// `op`'s candidate grid for `d` and, forward, each config's staged variant
/// (stages 1: the engine runs it where a launch's CTAs are all resident at
/// once, see staged_for_launch; the grid holds unstaged configs only).
inline std::vector<LaunchConfig> test_grid(Op op, const NormDesc& d, int max_cluster) {
  std::vector<LaunchConfig> out = candidate_grid(op, d, max_cluster);
  if (op != Op::Forward) return out;
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i)
    if (const auto s = staged_variant(op, d, out[i], max_cluster)) out.push_back(*s);
  return out;
}

/// The kernels of every config of test_grid (and the backward's finalize
/// kernel), for compile_all.
inline std::vector<KernelSpec> grid_specs(Op op, const NormDesc& d, int max_cluster) {
  std::vector<KernelSpec> specs;
  for (const auto& cfg : test_grid(op, d, max_cluster)) specs.push_back(make_spec(op, d, cfg));
  if (op == Op::Backward) specs.push_back(finalize_spec(d));
  return specs;
}

/// Launches config `cfg` of `op` on the tensors of `s` (the backward with a
/// fresh workspace of the size its grid needs), outputs poisoned first.
/// Returns false, launching nothing, where the tuner would prune the
/// kernel (it spills, or no block fits).
inline bool launch_candidate(KernelCache& jit, const DeviceInfo& dev, Op op, const NormDesc& d,
                             const LaunchConfig& cfg, Scratch& s) {
  auto k = jit.get(make_spec(op, d, cfg), dev.arch());
  if (k->local_bytes > 0 || k->blocks_per_sm < 1) return false;
  s.poison();
  if (op == Op::Forward) {
    launch_forward(*k, d, s.forward_tensors(), dev.sm_count, nullptr);
  } else {
    const Geometry g = backward_geometry(*k, d, cfg, dev.sm_count);
    s.workspace = DeviceBuffer(std::max<std::size_t>(16, backward_workspace_bytes(g, d)));
    launch_backward(*k, *jit.get(finalize_spec(d), dev.arch()), d, s.backward_tensors(), g, nullptr);
  }
  return true;
}

/// One engine call a case will make: x, y, weight (dy, dx) start `offset`
/// elements past an aligned address.
struct Call {
  Op op;
  NormDesc desc;
  std::int64_t offset = 0;
};

/// Compiles the kernels `e` will launch for `calls` (the configs it resolves
/// now, fitted to the calls' alignment as the engine fits them; the
/// backward's finalize kernel), in parallel.
inline void precompile_calls(Engine& e, const std::vector<Call>& calls) {
  std::vector<KernelSpec> specs;
  for (const auto& c : calls) {
    const NormDesc& d = c.desc;
    if (d.M == 0) continue;
    const LaunchConfig cfg = e.config_for(c.op, d);
    specs.push_back(make_spec(c.op, d, cfg));
    auto at = [&](DType t) {
      return reinterpret_cast<const void*>(static_cast<std::uintptr_t>((1u << 20) + c.offset * dtype_size(t)));
    };
    if (c.op == Op::Forward) {
      ForwardTensors t;
      t.x = at(d.x_dtype);
      t.y = const_cast<void*>(at(d.y_dtype));
      t.weight = at(d.weight_dtype);
      specs.push_back(make_spec(c.op, d, fit_forward_alignment(cfg, d, t)));
    } else {
      BackwardTensors t;
      t.dy = at(d.dy_dtype());
      t.x = at(d.normed_dtype());
      t.weight = at(d.weight_dtype);
      t.dx = const_cast<void*>(at(d.dx_dtype()));
      specs.push_back(make_spec(c.op, d, fit_backward_alignment(cfg, d, t)));
    }
    if (c.op == Op::Backward) specs.push_back(finalize_spec(d));
  }
  compile_all(specs);
}

/// A fresh seed per case (printed on failure through CAPTURE by callers).
inline std::uint64_t fresh_seed() {
  static std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

/// A host tensor of `rows` rows with leading dimension `ld`, `offset`
/// elements into its device allocation (to test unaligned bases).
struct Tensor {
  DType t{};
  std::int64_t rows = 0, ld = 0, n = 0, offset = 0;
  std::vector<unsigned char> host;  // (rows-1)*ld + n elements
  DeviceBuffer dev;

  Tensor(DType t_, std::int64_t rows_, std::int64_t ld_, std::int64_t n_, std::int64_t offset_ = 0)
      : t(t_), rows(rows_), ld(ld_), n(n_), offset(offset_) {
    host.assign(elems() * dtype_size(t), 0xff);  // poison: NaN in every dtype
    dev = DeviceBuffer((elems() + offset + 8) * dtype_size(t));
  }
  std::size_t elems() const { return rows > 0 ? static_cast<std::size_t>((rows - 1) * ld + n) : 0; }
  void* ptr() const { return static_cast<char*>(dev.ptr()) + offset * dtype_size(t); }
  float at(std::int64_t r, std::int64_t j) const { return load_as(t, host.data(), r * ld + j); }

  void fill_random(Random& rng, float lo, float hi) {
    for (std::size_t i = 0; i < elems(); ++i) store_as(t, host.data(), i, rng.uniform(lo, hi));
    upload();
  }
  void poison() {
    std::fill(host.begin(), host.end(), 0xff);
    NJ_CU(cuMemsetD8Async(dev.get(), 0xff, dev.bytes(), nullptr));
  }
  void upload() {
    if (!host.empty()) NJ_CU(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(ptr()), host.data(), host.size()));
  }
  void download() {
    NJ_CU(cuCtxSynchronize());
    if (!host.empty()) NJ_CU(cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(ptr()), host.size()));
  }
  /// The rows x n values (padding between rows left out).
  std::vector<float> values() const {
    std::vector<float> v;
    v.reserve(rows * n);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j) v.push_back(at(r, j));
    return v;
  }
  /// True when the padding between rows still holds the poison (nothing
  /// wrote past a row's N elements).
  bool padding_untouched() const {
    for (std::int64_t r = 0; r + 1 < rows; ++r)
      for (std::int64_t j = n; j < ld; ++j)
        for (int b = 0; b < dtype_size(t); ++b)
          if (host[(r * ld + j) * dtype_size(t) + b] != 0xff) return false;
    return true;
  }
};

}  // namespace normjit::test
