// Carrying tuned entries across edits of the kernel templates that leave the
// tuned kernels' machine code as it was.
#pragma once

#include <string>
#include <vector>

#include "compile/kernel_sources.hpp"
#include "tuning/tuned_cache.hpp"

namespace normjit::detail {

struct MigrationReport {
  int entries = 0;   ///< in the file
  int current = 0;   ///< already describe the current sources
  int migrated = 0;  ///< same machine code from the current sources: hash renewed
  int changed = 0;   ///< the machine code changed: left stale (re-tune them)
  int foreign = 0;   ///< not tuned from `old_files` (their hash matches neither): left alone
  std::vector<std::string> changed_keys;
};

/// A tuned entry records the source hash of its winner's kernel, so any edit
/// of a template it includes makes it stale, although an edit often leaves
/// the compiled kernel as it was (a comment, a new variant's code behind
/// `if constexpr`). For each entry of the file at `path` whose hash is its
/// winner's source hash under `old_files` (the templates it was tuned with),
/// this compiles the winner from `old_files` and from the current sources
/// for `arch`; where machine_code_fingerprint is equal for every kernel the
/// entry's launches run (the row kernel, and the spec's one-launch and q
/// transpose kernels where it has them), the tuned time still describes the
/// kernels and the entry gets the current hash. With `write`,
/// the file is rewritten (atomically) with the renewed entries and the
/// current kernel_source_hash. Needs NVRTC, no GPU. Throws Error(Cache) for
/// a file that cannot be read.
MigrationReport migrate_tuned_cache_file(const std::string& path, const SourceMap& old_files, const std::string& arch,
                                         bool write, const WarnFn& warn);

}  // namespace normjit::detail
