#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace normjit::detail {

std::optional<std::string> write_file_atomically(const std::string& path, const std::string& text) {
  // Unique per process and call: concurrent writers never share a temporary
  // file. No O_EXCL: a leftover of the same name belongs to a dead process
  // that had our pid.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  const auto fail = [&](const char* step, int err) -> std::optional<std::string> {
    ::unlink(tmp.c_str());
    return fmt::format("{} failed: {}", step, std::generic_category().message(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("creating the temporary file", errno);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return fail("write", err);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("fsync", err);
  }
  if (::close(fd) != 0) return fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename", errno);
  // Makes the rename durable. Best effort: the new file is already in place,
  // and some file systems refuse fsync on directories.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return std::nullopt;
}

}  // namespace normjit::detail
