// Several GPUs in one process: one Engine called from a thread per device at
// once (forward and backward against float64), and tuning on two devices at
// once into the caches of their kind. Each case needs two devices and says
// so, visibly, where there are fewer.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "gpu_harness.hpp"
#include "normjit/normjit.hpp"
#include "test_util.hpp"
#include "tuning/cache_file.hpp"
#include "tuning/tuned_cache.hpp"

using namespace normjit;
using namespace normjit::detail;
using namespace normjit::test;

namespace {

// Both threads past this point before either goes on (C++17: no std::barrier).
void meet(std::atomic<int>& arrived) {
  ++arrived;
  while (arrived.load() < 2) std::this_thread::yield();
}

// Whether the machine has two devices; says why the case is skipped if not.
bool two_devices() {
  const int n = device_count();
  if (n >= 2) return true;
  MESSAGE("skipped: needs 2 GPUs, this machine has " << n);
  return false;
}

// Errors of one device's calls, against float64 (filled by its thread).
struct DeviceRun {
  int device = 0;
  std::string error;  // an exception, if one was thrown
  std::vector<std::string> shapes;
  std::vector<double> y_err, y_tol, rstd_err, dx_err, dx_tol, dw_err, dw_tol;
};

// RMSNorm forward then backward of `d` on the thread's current device, each
// repeated (the plans are found again), the outputs poisoned first.
void run_shape(Engine& e, const NormDesc& d, std::uint64_t seed, DeviceRun& out) {
  Random rng(seed);
  Tensor x(d.x_dtype, d.M, d.N, d.N), w(d.weight_dtype, 1, d.N, d.N), y(d.y_dtype, d.M, d.N, d.N),
      rstd(DType::F32, 1, d.M, d.M), dy(d.y_dtype, d.M, d.N, d.N), dx(d.x_dtype, d.M, d.N, d.N),
      dw(d.weight_dtype, 1, d.N, d.N);
  x.fill_random(rng, -3.f, 3.f);
  w.fill_random(rng, -2.f, 2.f);
  dy.fill_random(rng, -1.f, 1.f);
  y.poison();
  rstd.poison();
  dx.poison();
  dw.poison();
  DeviceBuffer ws(std::max<std::size_t>(e.rms_norm_backward_workspace_size(d), 16));
  for (int rep = 0; rep < 3; ++rep) {
    e.rms_norm_forward(d, x.ptr(), w.ptr(), y.ptr(), static_cast<float*>(rstd.ptr()), nullptr);
    e.rms_norm_backward(d, dy.ptr(), x.ptr(), w.ptr(), static_cast<const float*>(rstd.ptr()), dx.ptr(), dw.ptr(),
                        ws.ptr(), ws.bytes(), nullptr);
  }
  y.download();
  rstd.download();
  dx.download();
  dw.download();
  std::vector<double> y_ref, rstd_ref, dx_ref, dw_ref, dx_scale;
  rms_forward_reference(d, x.host.data(), w.host.data(), &y_ref, &rstd_ref);
  // The backward's reference with the rstd the forward stored (its input).
  rms_backward_reference(d, dy.host.data(), x.host.data(), w.host.data(),
                         reinterpret_cast<const float*>(rstd.host.data()), &dx_ref, &dw_ref, &dx_scale);
  out.shapes.push_back(d.str());
  out.y_err.push_back(relative_error(y.values(), y_ref));
  out.y_tol.push_back(tolerance(d.y_dtype));
  out.rstd_err.push_back(relative_error(rstd.values(), rstd_ref));
  out.dx_err.push_back(scaled_error(dx.values(), dx_ref, dx_scale));
  out.dx_tol.push_back(tolerance(d.x_dtype));
  out.dw_err.push_back(relative_error(dw.values(), dw_ref));
  out.dw_tol.push_back(tolerance(d.weight_dtype));
}

}  // namespace

GPU_TEST_CASE("devices: one engine, a thread a device at once, forward and backward match float64") {
  if (!two_devices()) return;
  const auto tmp = normjit_test::make_temp_dir("devices");
  EngineOptions o = suite_engine_options("devices");
  o.cache_dir = tmp->string();
  Engine e(o);
  // Each device the same shapes (same kernels, loaded once a context) and
  // one of its own.
  const std::int64_t Ns[] = {4096, 1000, 5120};
  const DType xs[] = {DType::BF16, DType::F16, DType::F32};
  std::vector<DeviceRun> runs(2);
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int dev = 0; dev < 2; ++dev)
    threads.emplace_back([&, dev] {
      DeviceRun& r = runs[dev];
      r.device = dev;
      try {
        use_device(dev);
        meet(arrived);  // both devices call from here on at once
        for (int i = 0; i < 3; ++i) run_shape(e, normjit_test::make_desc(333, Ns[i], xs[i], xs[i]), fresh_seed(), r);
        run_shape(e, normjit_test::make_desc(7 + dev, 2048 + 8 * dev, DType::BF16, DType::F32), fresh_seed(), r);
        NJ_CU(cuCtxSynchronize());
        cu().cuCtxSetCurrent(nullptr);
      } catch (const std::exception& ex) {
        r.error = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const DeviceRun& r : runs) {
    CAPTURE(r.device);
    CHECK(r.error.empty());
    REQUIRE(r.shapes.size() == 4);
    for (std::size_t i = 0; i < r.shapes.size(); ++i) {
      CAPTURE(r.shapes[i]);
      CHECK(r.y_err[i] <= r.y_tol[i]);
      CHECK(r.rstd_err[i] <= 1e-5);
      CHECK(r.dx_err[i] <= r.dx_tol[i]);
      CHECK(r.dw_err[i] <= r.dw_tol[i]);
    }
  }
}

GPU_TEST_CASE("devices: two devices tuning at once store every entry in their kind's file") {
  if (!two_devices()) return;
  const auto tmp = normjit_test::make_temp_dir("devices-tune");
  EngineOptions o = suite_engine_options("devices-tune");
  o.cache_dir = tmp->string();
  Engine e(o);
  // Shapes in no shipped cache, a different one a device.
  const NormDesc ds[2] = {normjit_test::make_desc(4096, 2056, DType::BF16, DType::BF16),
                          normjit_test::make_desc(4096, 2072, DType::BF16, DType::BF16)};
  std::string errors[2];
  std::string kinds[2];
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int dev = 0; dev < 2; ++dev)
    threads.emplace_back([&, dev] {
      try {
        const DeviceInfo info = device_info(use_device(dev));
        kinds[dev] = DeviceFingerprint{info.name,     info.cc_major, info.cc_minor, info.sm_count,
                                       info.l2_bytes, info.memory_gbps}
                         .slug();
        meet(arrived);
        e.tune(Op::Forward, ds[dev]);
        cu().cuCtxSetCurrent(nullptr);
      } catch (const std::exception& ex) {
        errors[dev] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  // Every tuned entry is in its device kind's file: one file holding both
  // where the devices are of one kind (merged under its lock), else one each.
  const auto files = list_tuned_cache_files(tmp->string() + "/tuned", default_warn);
  CHECK(files.size() == (kinds[0] == kinds[1] ? 1u : 2u));
  for (int dev = 0; dev < 2; ++dev) {
    CAPTURE(dev);
    bool found = false;
    for (const auto& f : files)
      if (f.device.slug() == kinds[dev]) found = f.entries.count(shape_key(Op::Forward, ds[dev])) == 1;
    CHECK(found);
  }
}
