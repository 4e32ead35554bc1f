// normjit cache: list, show, clear, migrate and prune the tuned-config and kernel caches.
#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "tuning/cache_migrate.hpp"
#include "config/config_grid.hpp"
#include "compile/kernel_sources.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

namespace normjit::cli {

namespace {

void print_file_summary(const TunedCacheFile& f) {
  const bool current = f.metadata.kernel_source_hash == kernel_source_hash();
  fmt::print("{}\n  device {}\n  {} entries, engine {}, NVRTC {}, kernels {}\n", f.path, f.device.key(), f.entries.size(),
             f.metadata.engine_version, f.metadata.nvrtc_version,
             current ? "current" : "stale (tuned for other kernel sources; ignored)");
}

}  // namespace

int cmd_cache_list(Engine& engine) {
  const std::string user = engine.cache_dir() + "/tuned";
  fmt::print("user cache: {}\n", user);
  for (const auto& f : list_tuned_cache_files(user, default_warn)) print_file_summary(f);
  for (const auto& dir : engine.shipped_cache_dirs()) {
    fmt::print("shipped cache: {}\n", dir);
    for (const auto& f : list_tuned_cache_files(dir, default_warn)) print_file_summary(f);
  }
  std::size_t cubins = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(engine.cache_dir() + "/kernels", ec)) cubins += e.path().extension() == ".cubin";
  fmt::print("compiled kernels: {} in {}/kernels\n", cubins, engine.cache_dir());
  return 0;
}

int cmd_cache_show(Engine& engine, std::string file) {
  std::vector<TunedCacheFile> files;
  if (!file.empty()) {
    auto f = read_tuned_cache_file(file, default_warn);
    if (!f) throw Error(ErrorKind::InvalidArgument, fmt::format("--file '{}' is not a readable tuned cache", file));
    files.push_back(*f);
  } else {
    files = list_tuned_cache_files(engine.cache_dir() + "/tuned", default_warn);
  }
  for (const auto& f : files) {
    print_file_summary(f);
    for (const auto& [key, e] : f.entries) {
      int passed = 0;
      for (const auto& c : e.candidates) passed += c.median_us > 0;
      fmt::print("  {:<52} {:<15} {:>9.2f} us  {}/{} candidates  {}\n", key, e.winner.str(), e.winner_us, passed,
                 e.candidates.size(), e.tuned_at);
    }
  }
  return 0;
}

int cmd_cache_clear(Engine& engine) {
  std::size_t n = 0;
  std::error_code ec;
  for (const char* sub : {"tuned", "kernels"})
    for (const auto& e : fs::directory_iterator(fs::path(engine.cache_dir()) / sub, ec))
      if (e.is_regular_file()) n += fs::remove(e.path(), ec);
  fmt::print("removed {} files from {} (shipped caches are left alone)\n", n, engine.cache_dir());
  return 0;
}

// cache migrate: renews entries whose machine code an edit left alone.
int cmd_cache_migrate(const std::string& old_dir, const std::string& arch, const std::vector<std::string>& files,
                      bool write) {
  const SourceMap old_files = read_kernel_dir(old_dir, "--old-kernels");
  int changed = 0;
  for (const auto& f : files) {
    const MigrationReport r =
        migrate_tuned_cache_file(f, old_files, arch, write, [](const std::string& w) { fmt::print(stderr, "{}\n", w); });
    fmt::print("{}: {} entries: {} current, {} renewed (same machine code on {}), {} changed (stale: re-tune), "
               "{} from other sources{}\n",
               f, r.entries, r.current, r.migrated, arch, r.changed, r.foreign, write ? "" : " (dry run)");
    for (const auto& k : r.changed_keys) fmt::print("  changed: {}\n", k);
    changed += r.changed;
  }
  return changed > 0 ? 1 : 0;
}

// cache prune: keeps only the entries that pay, those whose winner beat the
// config model's config by more than 2% in the entry's own table. An entry
// whose table lacks the model's config is kept (nothing says it does not pay),
// unless it was tuned before its rows could peel (norm_fwd.cuh): a table of
// narrow vectors only, for a row the grid now moves in whole vectors. Stale
// entries (their kernels changed since tuning, and `cache migrate` found
// other machine code) go too: their timings describe code that is gone.
int cmd_cache_prune(const std::vector<std::string>& files, bool write) {
  for (const auto& path : files) {
    const auto file = read_tuned_cache_file(path, default_warn);
    if (!file) throw Error(ErrorKind::Cache, fmt::format("cannot read tuned cache {}", path));
    const DeviceFacts facts = file->device.facts();
    std::set<std::string> drop;
    std::size_t unknown = 0, unpeeled = 0, stale = 0;
    for (const auto& [key, e] : file->entries) {
      if (!entry_staleness(key, e).empty()) {
        drop.insert(key);
        ++stale;
        continue;
      }
      const Op op = shape_key_op(key);
      const NormDesc desc = parse_shape_spec(e.shape).desc;
      if (peeled(op, desc, max_vec(op, desc)) &&
          std::none_of(e.candidates.begin(), e.candidates.end(),
                       [&](const CandidateTiming& c) { return peeled(op, desc, c.config.vec); })) {
        drop.insert(key);
        ++unpeeled;
        continue;
      }
      const LaunchConfig model = heuristic_config(op, desc, facts);
      double model_us = e.winner == model ? e.winner_us : -1;
      for (const auto& c : e.candidates)
        if (c.config == model && c.median_us > 0) model_us = c.median_us;
      if (model_us < 0)
        ++unknown;
      else if (e.winner_us * 1.02 >= model_us)
        drop.insert(key);
    }
    if (write) remove_from_tuned_cache_file(path, drop);
    fmt::print("{}: {} entries: {} no faster than the config model's config by > 2%, {} tuned before their rows "
               "peeled and {} stale ({}), {} pay, {} without the model's config in their table (kept)\n",
               path, file->entries.size(), drop.size() - unpeeled - stale, unpeeled, stale,
               write ? "removed" : "dry run", file->entries.size() - drop.size() - unknown, unknown);
  }
  return 0;
}

}  // namespace normjit::cli
