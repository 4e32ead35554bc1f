// Uses the installed header and library; runs without a GPU.
#include <normjit/normjit.hpp>

#include <cstdio>

int main() {
  normjit::NormDesc d;
  d.M = 2;
  d.N = 0;  // invalid on purpose: validation needs no GPU
  try {
    d.validate();
  } catch (const normjit::Error& e) {
    std::printf("normjit %s: %s\n", NORMJIT_VERSION_STRING, e.what());
    return 0;
  }
  return 1;
}
