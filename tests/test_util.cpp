// Helpers shared by the CPU test files (declared in test_util.hpp).
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>

#include <fmt/format.h>

namespace fs = std::filesystem;
using normjit::DType;
using normjit::NormDesc;

namespace normjit_test {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// x and y of dtype `xy`, weight of `w`, contiguous.
NormDesc make_desc(std::int64_t M, std::int64_t N, DType xy, DType w) {
  NormDesc d;
  d.M = M;
  d.N = N;
  d.x_dtype = d.y_dtype = xy;
  d.weight_dtype = w;
  return d;
}

/// A fresh empty directory; removed with its contents when the last copy of
/// the pointer goes.
std::shared_ptr<const fs::path> make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto* dir = new fs::path(fs::temp_directory_path() / fmt::format("normjit-{}-{}-{}", tag, ::getpid(), counter++));
  fs::remove_all(*dir);
  fs::create_directories(*dir);
  return std::shared_ptr<const fs::path>(dir, [](const fs::path* p) {
    std::error_code ec;
    fs::remove_all(*p, ec);
    delete p;
  });
}

/// Writes `text` to `path`, replacing the file.
void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

}  // namespace normjit_test
