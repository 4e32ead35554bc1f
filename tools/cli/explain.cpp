// normjit explain (where each shape's config comes from) and normjit compile (precompiles the kernels).
#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/config_grid.hpp"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "compile/specialization.hpp"
#include "core/atomic_file.hpp"
#include "core/shape_spec.hpp"
#include "device/device_facts.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

namespace normjit::cli {

// Where each shape's config comes from, and the candidates' times when known.
// With --device (a tuned-cache file's device slug) no GPU is needed: the
// device's facts come from that file, and the policy is Never's.
int cmd_explain(Engine& engine, const ShapeOptions& so, const std::string& device) {
  const auto shapes = resolve_shapes(so);
  std::unique_ptr<TunedCache> offline;
  DeviceFacts facts;
  if (!device.empty()) {
    std::vector<std::string> dirs = {engine.cache_dir() + "/tuned"};
    for (const auto& d : engine.shipped_cache_dirs()) dirs.push_back(d);
    std::optional<TunedCacheFile> file;
    std::vector<std::string> known;
    for (const auto& dir : dirs) {
      for (const auto& f : list_tuned_cache_files(dir, [](const std::string&) {}))
        known.push_back(f.device.slug());
      if (!file) file = read_tuned_cache_file((fs::path(dir) / (device + ".json")).string(), default_warn);
    }
    if (!file)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("--device '{}': no tuned-cache file {}.json in the user or shipped caches (known: {})",
                              device, device, known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    offline = std::make_unique<TunedCache>(engine.cache_dir() + "/tuned", engine.shipped_cache_dirs(), file->device,
                                           file->metadata);
    facts = file->device.facts();
  } else if (!require_gpu("explain without --device (the device selects the tuned-cache files)")) {
    return kExitNoGpu;
  }
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NamedShape& s = w.shape;
      const ConfigExplanation x = offline ? config_from_caches(*offline, op, s.desc, facts, TunePolicy::Never, false)
                                          : engine.explain(op, s.desc);
      fmt::print("{} {}\n  key:     {}\n  config:  {}\n  source:  {}\n  reason:  {}\n", op_label(op, s.desc.norm),
                 s.name, x.shape_key, x.config.str(), config_source_name(x.source), x.reason);
      if (!x.from_key.empty() && x.from_key != x.shape_key) fmt::print("  from:    {}\n", x.from_key);
      if (offline) {
        // What a launch of this M runs (the engine stages weights where all CTAs are resident at once).
        const LaunchConfig run = staged_for_launch(op, s.desc, x.config, facts);
        if (run != x.config)
          fmt::print("  launch:  {} (weight and bias staged: every CTA of M = {} is resident at once)\n", run.str(),
                     s.desc.M);
      }
      if (!x.candidates.empty()) {
        fmt::print("  candidates of that entry (tuned times, us):\n");
        auto c = x.candidates;
        sort_by_time(c);
        for (const auto& t : c)
          fmt::print("    {:<20} {}\n", t.config.str(),
                     t.median_us > 0 ? fmt::format("{:9.2f}", t.median_us) : "rejected: " + t.rejected);
      }
    }
  return 0;
}

// ---- compile ----------------------------------------------------------------

int cmd_compile(Engine& engine, const ShapeOptions& so, const std::string& arch) {
  const auto shapes = resolve_shapes(so);
  nvrtc();  // fail early, with the paths tried, when NVRTC is missing
  int total = 0;
  std::vector<std::string> failures;
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NamedShape& s = w.shape;
      const int n = engine.precompile(op, s.desc, arch, &failures);
      fmt::print("{} {:<16} {:<32} {} variants for {}\n", op_label(op, s.desc.norm), s.name, s.desc.str(), n, arch);
      total += n;
    }
  fmt::print("{} kernel variants compiled or found in {}/kernels\n", total, engine.cache_dir());
  for (const auto& f : failures) fmt::print(stderr, "normjit: {}\n", f);
  return failures.empty() ? 0 : 1;
}

int cmd_compile_dump(const ShapeOptions& so, const std::string& config, const std::string& arch,
                     const std::string& dir) {
  const LaunchConfig cfg = LaunchConfig::parse(config);
  const int max_cluster = max_cluster_of_arch(sm_of_arch(arch));
  const auto shapes = resolve_shapes(so);
  // Every shape's config checked before anything is written (the grid's
  // rules; a staged config is valid where it is a grid config's staged variant).
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NormDesc& d = w.shape.desc;
      std::string why;
      if (!config_valid(op, d, cfg, &why, max_cluster))
        throw Error(ErrorKind::InvalidArgument,
                    fmt::format("--config '{}' is not a launch config of {} for {} on {}: {}", config,
                                op_label(op, d.norm), shape_spec(d), arch, why));
    }
  nvrtc();
  fs::create_directories(dir);
  for (const auto& w : shapes.work)
    for (Op op : w.ops) {
      const NormDesc& d = w.shape.desc;
      const KernelSpec spec = make_spec(op, d, cfg);
      const std::string src = spec.source();
      const auto built =
          compile_cubin(src, spec.name() + ".cu", kernel_sources(), nvrtc_options(), spec.kernel_name(), arch);
      const fs::path base = fs::path(dir) / spec.name();
      using File = std::pair<const char*, const std::string*>;
      for (const auto& [ext, bytes] : {File{".cu", &src}, File{".cubin", &built.cubin}})
        if (auto why = write_file_atomically(base.string() + ext, *bytes))
          throw Error(ErrorKind::InvalidArgument,
                      fmt::format("--dump '{}': cannot write {}{}: {}", dir, base.string(), ext, *why));
      fmt::print("{} {} {}: {}.cu, {}.cubin ({} bytes, {})\n", op_label(op, d.norm), w.shape.name, cfg.str(),
                 base.string(), base.string(), built.cubin.size(), arch);
    }
  return 0;
}

}  // namespace normjit::cli
