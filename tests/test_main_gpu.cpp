// GPU test main: without a usable driver and device, say why and exit 77,
// which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "driver.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (!normjit::detail::gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need an NVIDIA GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
