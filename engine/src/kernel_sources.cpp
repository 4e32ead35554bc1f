#include "kernel_sources.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "hash.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

extern const std::pair<std::string_view, std::string_view> kEmbeddedKernelSources[];
extern const int kEmbeddedKernelSourceCount;

namespace {
struct Sources {
  std::map<std::string, std::string> files;
  std::string hash, origin;
};

const Sources& sources() {
  static const Sources s = [] {
    Sources r;
    const char* dir = std::getenv("NORMJIT_KERNELS_DIR");
    if (dir && *dir) {
      namespace fs = std::filesystem;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() != ".cuh") continue;
        std::ifstream in(e.path(), std::ios::binary);
        std::ostringstream ss;
        ss << in.rdbuf();
        r.files[e.path().filename().string()] = ss.str();
      }
      if (ec || r.files.empty())
        throw Error(ErrorKind::InvalidArgument,
                    fmt::format("NORMJIT_KERNELS_DIR = '{}' holds no readable *.cuh files{}", dir,
                                ec ? ": " + ec.message() : ""));
      r.origin = dir;
    } else {
      for (int i = 0; i < kEmbeddedKernelSourceCount; ++i)
        r.files.emplace(std::string(kEmbeddedKernelSources[i].first),
                        std::string(kEmbeddedKernelSources[i].second));
      r.origin = "embedded";
    }
    Hasher h;
    for (const auto& [name, text] : r.files) h.add(name).add(text);
    r.hash = h.hex();
    return r;
  }();
  return s;
}
}  // namespace

const std::map<std::string, std::string>& kernel_sources() { return sources().files; }
const std::string& kernel_source_hash() { return sources().hash; }
const std::string& kernel_sources_origin() { return sources().origin; }

}  // namespace normjit::detail
