// Every autotune candidate of a few shapes against the float64 reference;
// tuning, the tune policies and the tuned-config cache on a real device.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>

#include <cstdlib>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "gpu_harness.hpp"
#include "device/kernel_clock.hpp"
#include "normjit/normjit.h"
#include "runtime/ops.hpp"
#include "test_util.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/parallel.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::test;
using normjit_test::make_temp_dir;

GPU_TEST_CASE("every autotune candidate matches the float64 reference") {
  const DeviceInfo dev = device_info(current_device());
  KernelCache jit(suite_kernel_dir());
  // Narrow rows packed several to a program, usual, odd, fp32 and wide rows
  // (two-pass and clusters); M sized so each output is about 200K elements
  // (each of ~1200 candidates' checks reads its outputs back).
  const NormDesc shapes[] = {normjit_test::make_desc(400, 128, DType::BF16, DType::BF16), normjit_test::make_desc(48, 4096, DType::BF16, DType::F32),
                             normjit_test::make_desc(130, 1000, DType::F16, DType::F16), normjit_test::make_desc(24, 5120, DType::F32, DType::F32),
                             normjit_test::make_desc(9, 16384, DType::BF16, DType::BF16), normjit_test::make_desc(2, 262144, DType::BF16, DType::BF16)};
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<KernelSpec> specs;
    for (const NormDesc& d : shapes)
      for (Op op : {Op::Forward, Op::Backward})
        for (auto& k : grid_specs(op, d, dev.max_cluster)) specs.push_back(std::move(k));
    compile_all(specs);
  }
  const auto t1 = std::chrono::steady_clock::now();
  int launches = 0;
  for (const NormDesc& d : shapes) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(d.str());
    CAPTURE(seed);
    Random rng(seed);
    Tensor x(d.x_dtype, d.M, d.N, d.N), w(d.weight_dtype, 1, d.N, d.N), y(d.y_dtype, d.M, d.N, d.N),
        rstd(DType::F32, 1, d.M, d.M), dy(d.y_dtype, d.M, d.N, d.N), dx(d.x_dtype, d.M, d.N, d.N),
        dw(d.weight_dtype, 1, d.N, d.N);
    x.fill_random(rng, -3.f, 3.f);
    w.fill_random(rng, -2.f, 2.f);
    dy.fill_random(rng, -1.f, 1.f);
    std::vector<double> y_ref, rstd_ref, dx_ref, dw_ref;
    rms_forward_reference(d, x.host.data(), w.host.data(), &y_ref, &rstd_ref);
    for (std::int64_t i = 0; i < d.M; ++i) store_as(DType::F32, rstd.host.data(), i, static_cast<float>(rstd_ref[i]));
    rms_backward_reference(d, dy.host.data(), x.host.data(), w.host.data(),
                           reinterpret_cast<const float*>(rstd.host.data()), &dx_ref, &dw_ref);
    for (Op op : {Op::Forward, Op::Backward}) {
      const auto grid = test_grid(op, d, dev.max_cluster);  // cluster and staged configs too, where the GPU has them
      REQUIRE(!grid.empty());
      int ran = 0;
      for (const auto& cfg : grid) {
        CAPTURE(cfg.str());
        auto k = jit.get(make_spec(op, d, cfg), dev.arch());
        if (k->local_bytes > 0 || k->blocks_per_sm < 1) continue;  // the tuner prunes these too
        ++ran;
        ++launches;
        if (op == Op::Forward) {
          y.poison();
          rstd.poison();
          ForwardTensors t;
          t.x = x.dev.ptr();
          t.weight = w.dev.ptr();
          t.y = y.dev.ptr();
          t.rstd = static_cast<float*>(rstd.dev.ptr());
          launch_forward(*k, d, t, dev.sm_count, nullptr);
          y.download();
          rstd.download();
          CHECK(relative_error(y.values(), y_ref) <= tolerance(d.y_dtype));
          CHECK(relative_error(rstd.values(), rstd_ref) <= 1e-5);
        } else {
          for (std::int64_t i = 0; i < d.M; ++i)
            store_as(DType::F32, rstd.host.data(), i, static_cast<float>(rstd_ref[i]));
          rstd.upload();
          auto fin = jit.get(finalize_spec(d), dev.arch());
          const Geometry g = backward_geometry(*k, d, cfg, dev.sm_count);
          DeviceBuffer ws(std::max<std::size_t>(16, backward_workspace_bytes(g, d)));
          dx.poison();
          dw.poison();
          BackwardTensors t;
          t.dy = dy.dev.ptr();
          t.x = x.dev.ptr();
          t.weight = w.dev.ptr();
          t.rstd = static_cast<const float*>(rstd.dev.ptr());
          t.dx = dx.dev.ptr();
          t.dweight = dw.dev.ptr();
          t.workspace = ws.ptr();
          t.workspace_bytes = ws.bytes();
          launch_backward(*k, *fin, d, t, g, nullptr);
          dx.download();
          dw.download();
          CHECK(relative_error(dx.values(), dx_ref) <= tolerance(d.x_dtype));
          CHECK(relative_error(dw.values(), dw_ref) <= tolerance(d.weight_dtype));
        }
      }
      CHECK(ran > 0);
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  MESSAGE(fmt::format("compile {:.1f} s, {} launches checked in {:.1f} s",
                      std::chrono::duration<double>(t1 - t0).count(), launches,
                      std::chrono::duration<double>(t2 - t1).count()));
}

GPU_TEST_CASE("tuning stores a winner that later engines find; policies behave") {
  const auto tmp = make_temp_dir("cache");
  const std::string dir = tmp->string();
  // N = 2056 is in no shipped cache (autotune_cache/grid/grid.json).
  const NormDesc d = normjit_test::make_desc(4096, 2056, DType::BF16, DType::BF16);
  EngineOptions o = suite_engine_options("tune");
  o.cache_dir = dir;

  o.tune_policy = TunePolicy::Never;
  {
    Engine e(o);
    ConfigSource src{};
    const LaunchConfig c = e.config_for(Op::Forward, d, &src);
    // No exact entry: the config model's, from this device's facts.
    CHECK(src == ConfigSource::Heuristic);
    CHECK(c == heuristic_config(Op::Forward, d, device_info(current_device()).facts()));
    const ConfigExplanation x = e.explain(Op::Forward, d);
    CHECK(x.config == c);
    CHECK(x.source == src);
    CHECK(!x.reason.empty());
    CHECK(x.shape_key == shape_key(Op::Forward, d));
  }
  o.tune_policy = TunePolicy::OnFirstUse;
  LaunchConfig tuned;
  {
    Engine e(o);
    ConfigSource src{};
    tuned = e.config_for(Op::Forward, d, &src);
    CHECK(src == ConfigSource::Tuned);
    e.config_for(Op::Forward, d, &src);
    CHECK(src == ConfigSource::Memory);
  }
  o.tune_policy = TunePolicy::Never;
  {
    Engine e(o);
    ConfigSource src{};
    CHECK(e.config_for(Op::Forward, d, &src) == tuned);
    CHECK(src == ConfigSource::UserCache);
    // Same M bucket, same entry.
    NormDesc d2 = d;
    d2.M = 3000;
    CHECK(e.config_for(Op::Forward, d2, &src) == tuned);
  }
  // The stored entry keeps the time of every candidate the local search
  // timed, the model's config among them.
  const auto files = list_tuned_cache_files(dir + "/tuned", default_warn);
  REQUIRE(files.size() == 1);
  const auto& entry = files[0].entries.at(shape_key(Op::Forward, d));
  CHECK(entry.winner == tuned);
  const DeviceInfo dev = device_info(current_device());
  const auto grid = candidate_grid(Op::Forward, d, dev.max_cluster);
  CHECK(entry.candidates.size() <= grid.size());
  const LaunchConfig model = heuristic_config(Op::Forward, d, dev.facts());
  double model_us = -1;
  for (const auto& c : entry.candidates) {
    CHECK(std::find(grid.begin(), grid.end(), c.config) != grid.end());
    if (c.config == model) model_us = c.median_us;
  }
  REQUIRE(model_us > 0);
  // Tuning stores no config that is not > 2% faster than the model's.
  CHECK((entry.winner == model || entry.winner_us * 1.02 < model_us));
}

GPU_TEST_CASE("one engine used from several threads at once gives correct results") {
  // Each thread has its own shape (so its own kernels, compiled concurrently)
  // and its own stream-0 work; results are checked afterwards.
  const auto tmp = make_temp_dir("threads");
  EngineOptions o = suite_engine_options("threads");
  o.cache_dir = tmp->string();
  o.kernel_dir.clear();  // its own, empty: the threads compile concurrently
  Engine e(o);
  const std::int64_t Ns[] = {96, 1000, 4096, 5120, 128, 3000};
  struct Job {
    NormDesc d;
    std::unique_ptr<Tensor> x, w, y, rstd;
    std::vector<double> y_ref, rstd_ref;
  };
  std::vector<Job> jobs(std::size(Ns));
  Random rng(fresh_seed());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    j.d = normjit_test::make_desc(333, Ns[i], i % 2 ? DType::F16 : DType::BF16, DType::F32);
    j.x = std::make_unique<Tensor>(j.d.x_dtype, j.d.M, j.d.N, j.d.N);
    j.w = std::make_unique<Tensor>(j.d.weight_dtype, 1, j.d.N, j.d.N);
    j.y = std::make_unique<Tensor>(j.d.y_dtype, j.d.M, j.d.N, j.d.N);
    j.rstd = std::make_unique<Tensor>(DType::F32, 1, j.d.M, j.d.M);
    j.x->fill_random(rng, -3.f, 3.f);
    j.w->fill_random(rng, -2.f, 2.f);
    j.y->poison();
    rms_forward_reference(j.d, j.x->host.data(), j.w->host.data(), &j.y_ref, &j.rstd_ref);
  }
  CUcontext ctx = nullptr;
  NJ_CU(cuCtxGetCurrent(&ctx));
  std::vector<std::string> errors(jobs.size());
  normjit::detail::parallel_for(static_cast<int>(jobs.size()), [&](int i) {
    try {
      NJ_CU(cuCtxSetCurrent(ctx));  // a new thread has no current context
      Job& j = jobs[i];
      for (int rep = 0; rep < 3; ++rep)
        e.rms_norm_forward(j.d, j.x->ptr(), j.w->ptr(), j.y->ptr(), static_cast<float*>(j.rstd->ptr()), nullptr);
    } catch (const std::exception& ex) {
      errors[i] = ex.what();
    }
  });
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    CAPTURE(j.d.str());
    CHECK(errors[i].empty());
    j.y->download();
    j.rstd->download();
    CHECK(relative_error(j.y->values(), j.y_ref) <= tolerance(j.d.y_dtype));
    CHECK(relative_error(j.rstd->values(), j.rstd_ref) <= 1e-5);
  }
}

GPU_TEST_CASE("C ABI: NORMJIT_BUILTIN_CACHES=0 holds with options given, as without") {
  // rms bf16 M = 4096, N = 4096 is a shape of the shipped grid.
  normjit_norm_desc d;
  REQUIRE(normjit_norm_desc_init(&d) == NORMJIT_SUCCESS);
  d.M = 4096;
  d.N = 4096;
  normjit_engine_options o;
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  const auto tmp = make_temp_dir("capi");
  const std::string dir = tmp->string();
  o.cache_dir = dir.c_str();
  auto source_with = [&](const char* builtin) {
    setenv("NORMJIT_BUILTIN_CACHES", builtin, 1);
    normjit_engine e = nullptr;
    REQUIRE(normjit_engine_create(&o, &e) == NORMJIT_SUCCESS);
    char buf[64];
    std::int32_t src = -1;
    REQUIRE(normjit_config_for(e, NORMJIT_OP_FORWARD, &d, buf, sizeof buf, &src) == NORMJIT_SUCCESS);
    normjit_engine_destroy(e);
    unsetenv("NORMJIT_BUILTIN_CACHES");
    return src;
  };
  CHECK(source_with("0") == NORMJIT_SOURCE_HEURISTIC);
  // With the built-in caches the shape resolves to an entry, or, where
  // pruning dropped it as no faster than the model, to the model.
  const std::int32_t with = source_with("1");
  CHECK((with == NORMJIT_SOURCE_SHIPPED_CACHE || with == NORMJIT_SOURCE_HEURISTIC));
}

GPU_TEST_CASE("the kernel clock records each copy and kernel of a region, and no memset") {
  KernelClock* clock = KernelClock::get();  // asked for in test_main_gpu.cpp, as the CLI does
  if (!clock) {
    MESSAGE("skipped: CUPTI unavailable (" << KernelClock::unavailable_reason() << "); timing falls back to events");
    return;
  }
  const DeviceInfo dev = device_info(current_device());
  DeviceBuffer a(1 << 20), b(1 << 20);
  const DeviceBuffer flush = make_flush_buffer(dev);
  NJ_CU(cuCtxSynchronize());
  clock->begin(dev.device);
  for (int i = 0; i < 3; ++i) {
    NJ_CU(cuMemsetD32Async(flush.get(), i, flush.bytes() / 4, nullptr));  // not recorded
    NJ_CU(cuMemcpyDtoDAsync(b.get(), a.get(), a.bytes(), nullptr));
  }
  NJ_CU(cuCtxSynchronize());
  const auto acts = clock->end(dev.device);
  REQUIRE(acts.size() == 3);
  for (std::size_t i = 0; i < acts.size(); ++i) {
    CHECK(acts[i].end > acts[i].start);
    if (i) CHECK(acts[i].start >= acts[i - 1].end);  // in stream order
  }
  // median_us sums each repetition's activities: a positive time.
  CHECK(median_us([&](CUstream st) { NJ_CU(cuMemcpyDtoDAsync(b.get(), a.get(), a.bytes(), st)); }, flush, 10) > 0);
}
