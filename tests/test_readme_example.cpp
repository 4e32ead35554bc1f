// The README's example (compiled from README.md into readme_example.cpp)
// rejects bad input with a clear error, before touching the driver.
#include <doctest/doctest.h>

#include <string>

#include "normjit/normjit.hpp"

void rms_norm_4096(normjit::Engine& engine, const void* x, const void* weight, void* y, float* rstd,
                   long long tokens, CUstream stream);
void rms_norm_4096_backward(normjit::Engine& engine, const normjit::NormDesc& desc, const void* dy,
                            const void* x, const void* weight, const float* rstd, void* dx,
                            void* dweight, void* workspace, std::size_t workspace_bytes, CUstream stream);

TEST_CASE("README example: null pointers and negative M are named in the error") {
  normjit::Engine engine;
  try {
    rms_norm_4096(engine, nullptr, nullptr, nullptr, nullptr, 8, nullptr);
    FAIL("expected an error");
  } catch (const normjit::Error& e) {
    CHECK(e.kind() == normjit::ErrorKind::InvalidArgument);
    CHECK(std::string(e.what()).find("x = null") != std::string::npos);
    CHECK(e.op() == "rms_fwd");
  }
  try {
    rms_norm_4096(engine, nullptr, nullptr, nullptr, nullptr, -5, nullptr);
    FAIL("expected an error");
  } catch (const normjit::Error& e) {
    CHECK(std::string(e.what()).find("M = -5") != std::string::npos);
  }
  normjit::NormDesc d;
  d.M = 4;
  d.N = 4096;
  try {
    rms_norm_4096_backward(engine, d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr);
    FAIL("expected an error");
  } catch (const normjit::Error& e) {
    CHECK(std::string(e.what()).find("dy = null") != std::string::npos);
  }
}
