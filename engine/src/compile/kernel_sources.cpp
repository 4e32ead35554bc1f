#include "compile/kernel_sources.hpp"

#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "core/hash.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

extern const std::pair<std::string_view, std::string_view> kEmbeddedKernelSources[];
extern const int kEmbeddedKernelSourceCount;

SourceMap read_kernel_dir(const std::string& dir, const char* what) {
  namespace fs = std::filesystem;
  SourceMap files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".cuh") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    files[e.path().filename().string()] = ss.str();
  }
  if (ec || files.empty())
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} = '{}' holds no readable *.cuh files{}", what, dir,
                                                        ec ? ": " + ec.message() : ""));
  return files;
}

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
      r.files = read_kernel_dir(dir, "NORMJIT_KERNELS_DIR");
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

namespace {
// The quoted includes of `text`, in order.
std::vector<std::string> includes_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find_first_not_of(" \t");
    if (a == std::string::npos || line.compare(a, 8, "#include") != 0) continue;
    const auto q = line.find('"', a + 8);
    const auto e = q == std::string::npos ? q : line.find('"', q + 1);
    if (e != std::string::npos) out.push_back(line.substr(q + 1, e - q - 1));
  }
  return out;
}

void add_closure(const std::string& name, const SourceMap& files, std::set<std::string>& seen, Hasher& h) {
  if (!seen.insert(name).second) return;
  const auto it = files.find(name);
  h.add(name).add(it == files.end() ? std::string_view("<absent>") : std::string_view(it->second));
  if (it != files.end())
    for (const auto& inc : includes_of(it->second)) add_closure(inc, files, seen, h);
}
}  // namespace

std::string closure_hash(const std::string& text, const SourceMap& files) {
  const auto compute = [&] {
    Hasher h;
    h.add(text);
    std::set<std::string> seen;
    for (const auto& inc : includes_of(text)) add_closure(inc, files, seen, h);
    return h.hex();
  };
  if (&files != &kernel_sources()) return compute();
  // The process's sources never change: memoise by text (a few generated
  // preludes per shape).
  static std::mutex mu;
  static std::map<std::string, std::string> memo;
  std::lock_guard<std::mutex> lock(mu);
  auto it = memo.find(text);
  if (it == memo.end()) it = memo.emplace(text, compute()).first;
  return it->second;
}
const std::string& kernel_source_hash() { return sources().hash; }
const std::string& kernel_sources_origin() { return sources().origin; }

}  // namespace normjit::detail
