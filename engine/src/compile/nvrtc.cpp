#include "compile/nvrtc.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

#include "core/cuda_libraries.hpp"

namespace normjit::detail {

namespace {

struct Loaded {
  NvrtcApi api;
  std::string error;
};

std::vector<std::string> candidate_paths() {
  return library_candidates("NORMJIT_NVRTC_LIBRARY", {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}, {"lib64"});
}

#define NORMJIT_STR2(x) #x
#define NORMJIT_STR(x) NORMJIT_STR2(x)

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    std::string tried;
    void* h = open_first(candidate_paths(), &r.api.path, &tried);
    if (!h) {
      r.error = "libnvrtc (NVRTC, the CUDA run-time compiler) could not be opened; set "
                "NORMJIT_NVRTC_LIBRARY to its path. Tried:" + tried;
      return r;
    }
#define NORMJIT_LOAD(name)                                                          \
  r.api.name = reinterpret_cast<decltype(r.api.name)>(dlsym(h, NORMJIT_STR(name))); \
  if (!r.api.name && r.error.empty()) r.error = fmt::format("{} lacks {}", r.api.path, NORMJIT_STR(name));
    NORMJIT_NVRTC_FUNCTIONS(NORMJIT_LOAD)
#undef NORMJIT_LOAD
    if (r.error.empty()) {
      int major = 0, minor = 0;
      r.api.nvrtcVersion(&major, &minor);
      r.api.version = fmt::format("{}.{}", major, minor);
    }
    return r;
  }();
  return l;
}

// Owns an nvrtcProgram: destroyed on every path out, errors included.
class Program {
 public:
  explicit Program(nvrtcProgram p) : p_(p) {}
  ~Program() { nvrtc().nvrtcDestroyProgram(&p_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return p_; }

 private:
  nvrtcProgram p_;
};

}  // namespace

const NvrtcApi& nvrtc() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw Error(ErrorKind::LibraryNotFound, l.error);
  return l.api;
}

std::string nvrtc_version_or_empty() { return loaded().error.empty() ? loaded().api.version : ""; }

CompiledKernel compile_cubin(const std::string& source, const std::string& name,
                             const std::map<std::string, std::string>& headers,
                             const std::vector<std::string>& options, const std::string& kernel_name,
                             const std::string& arch) {
  const NvrtcApi& api = nvrtc();
  std::vector<const char*> hdr_src, hdr_names;
  for (const auto& [n, s] : headers) {
    hdr_names.push_back(n.c_str());
    hdr_src.push_back(s.c_str());
  }
  std::vector<std::string> opts = options;
  opts.push_back("--gpu-architecture=" + arch);  // sm_XX: real SASS, no PTX JIT at load
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  // `line`: the failing call's line (__LINE__ inside this lambda would name the lambda's).
  auto fail = [&](nvrtcResult r, const char* call, std::string log, int line) -> CompileError {
    return CompileError(fmt::format("{} failed: {}", call, api.nvrtcGetErrorString(r)), std::move(log), opts,
                        kernel_name, arch, fmt::format("{}:{}", __FILE__, line));
  };
  nvrtcProgram raw = nullptr;
  nvrtcResult r = api.nvrtcCreateProgram(&raw, source.c_str(), name.c_str(), static_cast<int>(headers.size()),
                                         hdr_src.data(), hdr_names.data());
  if (r != NVRTC_SUCCESS) throw fail(r, "nvrtcCreateProgram", "", __LINE__);
  Program prog(raw);
  const nvrtcResult cr = api.nvrtcCompileProgram(prog.get(), static_cast<int>(copts.size()), copts.data());
  std::size_t log_size = 0;
  api.nvrtcGetProgramLogSize(prog.get(), &log_size);
  std::string log(log_size, '\0');
  if (log_size > 1) api.nvrtcGetProgramLog(prog.get(), log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (cr != NVRTC_SUCCESS) throw fail(cr, "nvrtcCompileProgram", log, __LINE__);
  std::size_t size = 0;
  if ((r = api.nvrtcGetCUBINSize(prog.get(), &size)) != NVRTC_SUCCESS) throw fail(r, "nvrtcGetCUBINSize", log, __LINE__);
  CompiledKernel out;
  out.cubin.resize(size);
  if ((r = api.nvrtcGetCUBIN(prog.get(), out.cubin.data())) != NVRTC_SUCCESS) throw fail(r, "nvrtcGetCUBIN", log, __LINE__);
  out.log = std::move(log);
  return out;
}

}  // namespace normjit::detail
