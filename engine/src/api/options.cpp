// EngineOptions from the environment, and the default cache location.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "api/options.hpp"

namespace normjit {

using namespace detail;

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

namespace detail {
std::string default_cache_dir() {
  if (auto d = env("NORMJIT_CACHE_DIR"); !d.empty()) return d;
  if (auto x = env("XDG_CACHE_HOME"); !x.empty()) return x + "/normjit";
  if (auto h = env("HOME"); !h.empty()) return h + "/.cache/normjit";
  return (std::filesystem::temp_directory_path() / "normjit-cache").string();
}
}  // namespace detail

EngineOptions EngineOptions::from_env() {
  EngineOptions o;
  if (auto t = env("NORMJIT_TUNE"); !t.empty()) {
    try {
      o.tune_policy = parse_tune_policy(t);
    } catch (const Error&) {
      throw Error(ErrorKind::InvalidArgument, fmt::format("NORMJIT_TUNE = '{}' is not one of never, first, always", t));
    }
  }
  o.cache_dir = env("NORMJIT_CACHE_DIR");
  if (auto b = env("NORMJIT_BUILTIN_CACHES"); !b.empty()) {
    if (b != "0" && b != "1")
      throw Error(ErrorKind::InvalidArgument, fmt::format("NORMJIT_BUILTIN_CACHES = '{}' is not 0 or 1", b));
    o.builtin_shipped_caches = b == "1";
  }
  std::string path = env("NORMJIT_SHIPPED_CACHE_PATH");
  for (std::size_t a = 0; !path.empty() && a <= path.size();) {
    std::size_t b = path.find(':', a);
    if (b == std::string::npos) b = path.size();
    if (b > a) o.shipped_cache_dirs.push_back(path.substr(a, b - a));
    a = b + 1;
  }
  return o;
}

}  // namespace normjit
