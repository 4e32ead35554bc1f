// The tuned caches shipped in autotune_cache/ must be usable: they parse, and
// every entry was tuned for the kernel it names as the tree now builds it
// (a stale entry is skipped at run time, silently shipping nothing for its
// shape). After a kernel change, re-tune the stale entries on the GPU
// (tools/tune_grid.sh) and copy the new files in.
#include <doctest/doctest.h>

#include <filesystem>

#include "tuning/tuned_cache.hpp"

using namespace normjit;
using namespace normjit::detail;

TEST_CASE("shipped tuned caches parse and match the current kernel sources") {
  std::vector<std::string> warnings;
  const auto files = list_tuned_cache_files(NORMJIT_SHIPPED_CACHE_DIR, [&](const std::string& w) { warnings.push_back(w); });
  CHECK(warnings.empty());
  // A file may hold no entries, only its device's facts (the config model's
  // inputs): its entries removed as stale until that GPU is re-tuned. But
  // some GPU's entries are shipped.
  std::size_t entries = 0;
  for (const auto& f : files) {
    CAPTURE(f.path);
    std::size_t stale = 0;
    CHECK(f.path.find(f.device.slug()) != std::string::npos);  // named after its device
    CHECK(f.device.sm_count > 0);
    entries += f.entries.size();
    for (const auto& [key, e] : f.entries) {
      CAPTURE(key);
      CHECK(e.winner_us > 0);
      CHECK(!e.candidates.empty());
      const std::string why = entry_staleness(key, e);
      if (!why.empty() && stale++ < 5) MESSAGE("stale: " << key << ": " << why);
    }
    CHECK_MESSAGE(stale == 0, stale << " of " << f.entries.size() << " entries of " << f.path << " are stale");
  }
  CHECK(files.size() >= 2);
  CHECK(entries > 0);
}
