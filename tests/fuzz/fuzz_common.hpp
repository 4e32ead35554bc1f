// Shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp, built with
// -DNORMJIT_FUZZERS=ON by clang; tools/fuzz.sh runs them).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace normjit_fuzz {

/// A private directory for the target's files, made once, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "normjit-libfuzzer-XXXXXX").string();
    if (!::mkdtemp(t.data())) std::abort();
    return t;
  }();
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return true;
  }();
  (void)cleanup;
  return dir;
}

/// Writes `bytes` to `path`, replacing it.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// With $NORMJIT_FUZZ_SEED_DIR set, writes `seeds` there (seed0, seed1, ...):
/// tools/fuzz.sh starts each corpus with them.
inline void write_seeds(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("NORMJIT_FUZZ_SEED_DIR");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  for (std::size_t i = 0; i < seeds.size(); ++i) write_file(std::string(dir) + "/seed" + std::to_string(i), seeds[i]);
}

}  // namespace normjit_fuzz
