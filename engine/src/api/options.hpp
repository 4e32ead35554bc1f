// The engine's options from the environment (EngineOptions::from_env, in
// options.cpp) and the default cache location.
#pragma once

#include <string>

#include "normjit/normjit.hpp"

namespace normjit::detail {

/// $NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit,
/// else normjit-cache in the temporary directory.
std::string default_cache_dir();

}  // namespace normjit::detail
