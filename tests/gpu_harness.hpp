// Helpers for the GPU tests: random tensors laid out as on the device,
// poisoned outputs, and the float64 reference comparison.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "driver.hpp"
#include "host_dtype.hpp"
#include "reference.hpp"

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
