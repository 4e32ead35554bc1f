// Where the engine looks for a CUDA toolkit library it opens with dlopen
// (NVRTC, CUPTI), and how it opens it: one search order for every such
// library.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace normjit::detail {

/// The paths to try, in order: $override_env alone when it is set; else
/// each soname as is (the loader's search path), then in each of `dirs`
/// under $CUDA_HOME, $CUDA_PATH and /usr/local/cuda.
inline std::vector<std::string> library_candidates(const char* override_env, const std::vector<std::string>& sonames,
                                                   const std::vector<std::string>& dirs) {
  if (const char* e = std::getenv(override_env); e && *e) return {e};
  std::vector<std::string> c(sonames.begin(), sonames.end());
  std::vector<std::string> roots;
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = std::getenv(env); root && *root) roots.push_back(root);
  roots.push_back("/usr/local/cuda");
  for (const auto& root : roots)
    for (const auto& dir : dirs)
      for (const auto& so : sonames) c.push_back(fmt::format("{}/{}/{}", root, dir, so));
  return c;
}

/// The first of `paths` that dlopen opens (nullptr if none), its path into
/// *opened, and each failure ("\n  path: dlerror") appended to *tried.
inline void* open_first(const std::vector<std::string>& paths, std::string* opened, std::string* tried) {
  for (const auto& p : paths) {
    if (void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *opened = p;
      return h;
    }
    const char* e = dlerror();
    *tried += fmt::format("\n  {}: {}", p, e ? e : "not found");
  }
  return nullptr;
}

}  // namespace normjit::detail
