#include "tuning/cache_migrate.hpp"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/parallel.hpp"
#include "compile/cubin.hpp"
#include "compile/nvrtc.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"

namespace normjit::detail {

namespace {
// The machine code of every kernel of `s`'s module that a tuned entry's
// launches run: the row kernel, and the one-launch (tensor scaling at
// decode) and q transpose kernels where the spec has them (an edit of only
// the one-launch kernel changes what a decode call runs).
std::string module_fingerprint(const std::string& cubin, const KernelSpec& s) {
  std::string f = machine_code_fingerprint(cubin, s.kernel_name());
  for (const char* k : {s.once_kernel_name(), s.transpose_kernel_name()})
    if (k) f += fmt::format("|{}:", k) + machine_code_fingerprint(cubin, k);
  return f;
}
}  // namespace

MigrationReport migrate_tuned_cache_file(const std::string& path, const SourceMap& old_files, const std::string& arch,
                                         bool write, const WarnFn& warn) {
  auto file = read_tuned_cache_file(path, warn);
  if (!file) throw Error(ErrorKind::Cache, fmt::format("{}: not a readable tuned-cache file", path));
  MigrationReport r;
  r.entries = static_cast<int>(file->entries.size());
  // The entries to check, and each distinct kernel once (the M buckets of a
  // shape often share their winner).
  std::map<std::string, KernelSpec> specs;                  // spec name -> spec
  std::vector<std::pair<std::string, std::string>> pending;  // key -> spec name
  for (auto& [key, e] : file->entries) {
    const Op op = shape_key_op(key);
    const KernelSpec s = tuned_spec(op, parse_shape_spec(e.shape).desc, e.winner);
    if (e.kernel_hash == s.source_hash()) {
      ++r.current;
    } else if (e.kernel_hash != s.source_hash(old_files)) {
      ++r.foreign;
    } else {
      specs.emplace(s.name(), s);
      pending.emplace_back(key, s.name());
    }
  }
  std::vector<const KernelSpec*> list;
  for (const auto& [name, s] : specs) list.push_back(&s);
  std::map<std::string, bool> same;
  std::mutex mu;
  parallel_for(static_cast<int>(list.size()), [&](int i) {
    const KernelSpec& s = *list[i];
    const std::string src = s.source();
    const auto before = compile_cubin(src, s.name() + ".cu", old_files, nvrtc_options(), s.kernel_name(), arch);
    const auto after = compile_cubin(src, s.name() + ".cu", kernel_sources(), nvrtc_options(), s.kernel_name(), arch);
    const bool eq = module_fingerprint(before.cubin, s) == module_fingerprint(after.cubin, s);
    std::lock_guard<std::mutex> lk(mu);
    same[s.name()] = eq;
  });
  for (const auto& [key, name] : pending) {
    if (same.at(name)) {
      file->entries[key].kernel_hash = specs.at(name).source_hash();
      ++r.migrated;
    } else {
      ++r.changed;
      r.changed_keys.push_back(key);
    }
  }
  if (write && r.migrated > 0) {
    CacheMetadata md = file->metadata;
    md.kernel_source_hash = kernel_source_hash();
    merge_into_tuned_cache_file(path, file->device, md, file->entries);
  }
  return r;
}

}  // namespace normjit::detail
