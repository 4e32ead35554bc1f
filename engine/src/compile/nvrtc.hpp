// NVRTC, opened with dlopen. $NORMJIT_NVRTC_LIBRARY names the library to use;
// otherwise the usual sonames and the CUDA toolkit's lib64 are tried.
#pragma once

#include <nvrtc.h>

#include <map>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

#define NORMJIT_NVRTC_FUNCTIONS(X)                                                     \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog)              \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)

struct NvrtcApi {
#define NORMJIT_DECLARE(name) decltype(&::name) name = nullptr;
  NORMJIT_NVRTC_FUNCTIONS(NORMJIT_DECLARE)
#undef NORMJIT_DECLARE
  std::string path;     ///< the library that was opened
  std::string version;  ///< "13.0"
};

/// Throws Error(LibraryNotFound) listing every path tried.
const NvrtcApi& nvrtc();
/// "13.0", or "" when NVRTC cannot be loaded. Never throws.
std::string nvrtc_version_or_empty();

/// A kernel compiled to SASS for one arch.
struct CompiledKernel {
  std::string cubin;
  std::string log;  ///< warnings, if any
};

/// Compiles `source` (named `name`) with the given in-memory headers for
/// `arch` ("sm_90") to a cubin. Throws CompileError with the log, options,
/// kernel name and arch.
CompiledKernel compile_cubin(const std::string& source, const std::string& name,
                             const std::map<std::string, std::string>& headers,
                             const std::vector<std::string>& options, const std::string& kernel_name,
                             const std::string& arch);

}  // namespace normjit::detail
