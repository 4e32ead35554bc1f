// GPU test main: without a usable driver and device, say why and exit 77,
// which ctest reports as skipped. Listing the cases (-ltc, -lts, -h) needs no
// GPU. Every case is a GPU_TEST_CASE (gpu_harness.hpp): it makes the primary
// context current itself, so one case runs alone (-tc=...) as well as in the
// whole suite, e.g. under compute-sanitizer (tools/sanitize.sh). Each case's
// wall time is printed; `-ts=quick` runs the quick subset (<= 30 s), for
// iterating on a kernel.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "device/driver.hpp"
#include "device/kernel_clock.hpp"

namespace {
// Options that only print (no case runs).
bool listing_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    for (const char* o : {"-ltc", "--list-test-cases", "-lts", "--list-test-suites", "-h", "--help", "-v", "--version",
                          "-?", "-dt-ltc", "--dt-list-test-cases", "-dt-lts", "--dt-list-test-suites"})
      if (std::strcmp(argv[i], o) == 0 || (std::strncmp(argv[i], o, std::strlen(o)) == 0 && argv[i][std::strlen(o)] == '='))
        return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!listing_only(argc, argv) && !normjit::detail::gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need an NVIDIA GPU: %s\n", why.c_str());
    return 77;
  }
  normjit::detail::KernelClock::prefer_cupti();  // the tuner times as the CLI does
  doctest::Context ctx;
  ctx.setOption("duration", true);  // each case's wall time (the suite's budget is 120 s on one H100)
  ctx.applyCommandLine(argc, argv);
  const int rc = ctx.run();
  // Each case leaves no context current; the engines the cases keep in
  // statics are destroyed after main, and free their modules and buffers in
  // the primary context: make it current again.
  try {
    if (!listing_only(argc, argv)) normjit::detail::current_device();
  } catch (const std::exception&) {
  }
  return rc;
}
