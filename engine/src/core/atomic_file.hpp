// The one way the engine replaces a file (tuned caches, cached cubins, the
// trace): a temporary file of a name unique to the process and the call,
// written, fsynced, then renamed over the target, so that readers see the
// old file or the whole new one, never a partial one, even across a crash.
#pragma once

#include <optional>
#include <string>

namespace normjit::detail {

/// Replaces `path` with `text` atomically (its folder must exist). Returns
/// nothing on success, else which step failed and why ("fsync failed: No
/// space left on device"); the temporary file is removed then. Callers
/// decide whether a failure is an error (a tuned cache) or not (a cubin
/// cache is an optimisation).
std::optional<std::string> write_file_atomically(const std::string& path, const std::string& text);

}  // namespace normjit::detail
