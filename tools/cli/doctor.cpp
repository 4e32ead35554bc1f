// normjit doctor: reports the driver, NVRTC, devices, cache paths and what is missing.
#include <fmt/format.h>

#include "device/kernel_clock.hpp"
#include "device/driver.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "tuning/tuned_cache.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace normjit::cli {

int cmd_doctor(Engine& engine) {
  bool ok = true;
  fmt::print("normjit {}\n", NORMJIT_VERSION_STRING);
  fmt::print("kernel sources: {} ({} files, hash {})\n", kernel_sources_origin(), kernel_sources().size(), kernel_source_hash());
  try {
    const auto& n = nvrtc();
    fmt::print("NVRTC: {} ({})\n", n.version, n.path);
  } catch (const Error& e) {
    ok = false;
    fmt::print("NVRTC: MISSING: {}\n", e.message());
  }
  std::string why;
  if (gpu_available(&why)) {
    int driver = 0, count = 0;
    cu().cuDriverGetVersion(&driver);
    cu().cuDeviceGetCount(&count);
    fmt::print("driver: CUDA {}.{}; {} device(s)\n", driver / 1000, driver % 1000 / 10, count);
    for (int i = 0; i < count; ++i) {
      CUdevice dev = 0;
      NJ_CU(cuDeviceGet(&dev, i));
      const DeviceInfo d = device_info(dev);
      DeviceFingerprint fp{d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes, d.memory_gbps};
      fmt::print("  [{}] {} ({}, {} SMs, L2 {} MiB); tuned-cache file {}.json\n", i, d.name, d.arch(), d.sm_count,
                 d.l2_bytes >> 20, fp.slug());
    }
    fmt::print("timing (tune, bench): {}\n", timing_method());
  } else {
    ok = false;
    fmt::print("driver/GPU: MISSING: {}\n", why);
    fmt::print("  (kernels can still be compiled: normjit compile --arch sm_90 ...)\n");
  }
  fmt::print("user cache: {}\n", engine.cache_dir());
  fmt::print("tune policy: {}\n", tune_policy_name(engine.options().tune_policy));
  for (const auto& d : engine.shipped_cache_dirs()) fmt::print("shipped cache: {}\n", d);
  fmt::print("{}\n", ok ? "everything needed to run kernels is present" : "some parts are missing (see above)");
  return ok ? 0 : 1;
}

}  // namespace normjit::cli
