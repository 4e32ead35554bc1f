// The kernel templates (kernels_src/*.cuh): embedded at build time, or read
// from $NORMJIT_KERNELS_DIR during kernel work.
#pragma once

#include <map>
#include <string>

namespace normjit::detail {

/// File name -> text of every kernel template. Read once per process.
const std::map<std::string, std::string>& kernel_sources();
/// Hash over every template's name and text (32 hex digits): recorded in
/// tuned-cache files and shown by `normjit doctor`. Cached cubins and tuned
/// entries are matched by their own kernel's closure hash
/// (KernelSpec::source_hash), not by this one.
const std::string& kernel_source_hash();
/// "embedded" or the directory they were read from.
const std::string& kernel_sources_origin();

using SourceMap = std::map<std::string, std::string>;
/// The *.cuh files of `dir` by name. Throws Error(InvalidArgument), naming
/// `what` and `dir`, when it holds none or cannot be read.
SourceMap read_kernel_dir(const std::string& dir, const char* what);
/// Hash over `text` and every template it includes (`#include "name"`,
/// transitively, each once): what NVRTC compiles for it, no more. Editing a
/// template outside the closure leaves the hash unchanged. A name missing
/// from `files` is hashed as absent. Memoised per template for the
/// process's own sources.
std::string closure_hash(const std::string& text, const SourceMap& files = kernel_sources());

}  // namespace normjit::detail
