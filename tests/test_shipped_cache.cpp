// The tuned caches shipped in autotune_cache/ must be usable: they parse, and
// they were tuned for the kernel sources in this tree (a stale file would be
// ignored at run time, silently shipping nothing). After a kernel change,
// re-tune on the GPU (tools/main.sh) and copy the new file in, or remove it.
#include <doctest/doctest.h>

#include <filesystem>

#include "kernel_sources.hpp"
#include "tuned_cache.hpp"

using namespace normjit;
using namespace normjit::detail;

TEST_CASE("shipped tuned caches parse and match the current kernel sources") {
  std::vector<std::string> warnings;
  const auto files = list_tuned_cache_files(NORMJIT_SHIPPED_CACHE_DIR, [&](const std::string& w) { warnings.push_back(w); });
  CHECK(warnings.empty());
  for (const auto& f : files) {
    CAPTURE(f.path);
    CHECK_MESSAGE(f.metadata.kernel_source_hash == kernel_source_hash(),
                  "stale: tuned for kernel sources " << f.metadata.kernel_source_hash << ", the tree has "
                                                     << kernel_source_hash());
    CHECK(f.path.find(f.device.slug()) != std::string::npos);  // named after its device
    CHECK(!f.entries.empty());
    for (const auto& [key, e] : f.entries) {
      CAPTURE(key);
      CHECK(e.winner_us > 0);
      CHECK(!e.candidates.empty());
    }
  }
}
