// Tuned-cache files: reading with schema checks, the device fingerprint,
// and locked atomic merging.
#include "tuning/cache_file.hpp"

#include "core/atomic_file.hpp"
#include "device/device_facts.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace normjit::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

std::string errno_text(int err) { return std::generic_category().message(err); }

// A file that breaks the schema; what() is the reason given in the warning.
struct SchemaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using TypeTest = bool (json::*)() const noexcept;

// obj[name], which must exist and pass `is_type`; `where` names obj in messages.
const json& field(const json& obj, const std::string& where, const char* name, TypeTest is_type,
                  const char* type_name) {
  const std::string what = where.empty() ? std::string(name) : where + "." + name;
  const auto it = obj.find(name);
  if (it == obj.end()) throw SchemaError(what + " is missing");
  if (!((*it).*is_type)()) throw SchemaError(fmt::format("{} is not {}", what, type_name));
  return *it;
}

std::string get_string(const json& obj, const std::string& where, const char* name) {
  return field(obj, where, name, &json::is_string, "a string").get<std::string>();
}

double get_number(const json& obj, const std::string& where, const char* name) {
  return field(obj, where, name, &json::is_number, "a number").get<double>();
}

// The parser stores every non-negative integer as unsigned, negative ones as signed.
std::int64_t get_count(const json& obj, const std::string& where, const char* name, std::int64_t max) {
  const json& v = field(obj, where, name, &json::is_number_unsigned, "a non-negative integer");
  if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(max))
    throw SchemaError(fmt::format("{}.{} = {} is out of range", where, name, v.dump()));
  return static_cast<std::int64_t>(v.get<std::uint64_t>());
}

LaunchConfig get_config(const json& obj, const std::string& where, const char* name) {
  const std::string text = get_string(obj, where, name);
  try {
    return LaunchConfig::parse(text);
  } catch (const Error& e) {
    throw SchemaError(fmt::format("{}.{}: {}", where, name, e.message()));
  }
}

TunedEntry parse_entry(const json& e, const std::string& where) {
  if (!e.is_object()) throw SchemaError(where + " is not an object");
  TunedEntry entry;
  entry.shape = get_string(e, where, "shape");
  entry.kernel_hash = get_string(e, where, "kernel_hash");
  entry.winner = get_config(e, where, "winner");
  entry.winner_us = get_number(e, where, "winner_us");
  entry.tuned_at = get_string(e, where, "tuned_at");
  const json& candidates = field(e, where, "candidates", &json::is_array, "an array");
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const std::string cw = fmt::format("{}.candidates[{}]", where, i);
    const json& c = candidates[i];
    if (!c.is_object()) throw SchemaError(cw + " is not an object");
    CandidateTiming t;
    t.config = get_config(c, cw, "config");
    t.median_us = get_number(c, cw, "median_us");
    if (c.contains("rejected")) t.rejected = get_string(c, cw, "rejected");
    entry.candidates.push_back(std::move(t));
  }
  return entry;
}

TunedCacheFile parse_cache_file(const std::string& path, const json& doc) {
  if (!doc.is_object()) throw SchemaError("the top level is not a JSON object");
  // Checked first, so a file of another schema is reported as such.
  const json& version = field(doc, "", "schema_version", &json::is_number_integer, "an integer");
  if (version != kTunedCacheSchemaVersion)
    throw SchemaError(fmt::format("schema_version {} is not the supported {}", version.dump(),
                                  kTunedCacheSchemaVersion));
  TunedCacheFile file;
  file.path = path;

  const json& dev = field(doc, "", "device", &json::is_object, "an object");
  file.device.name = get_string(dev, "device", "name");
  static const std::regex cc_re(R"((\d{1,4})\.(\d{1,4}))");
  const std::string cc = get_string(dev, "device", "compute_capability");
  std::smatch m;
  if (!std::regex_match(cc, m, cc_re))
    throw SchemaError(fmt::format("device.compute_capability '{}' is not of the form <major>.<minor>", cc));
  file.device.cc_major = std::stoi(m[1]);
  file.device.cc_minor = std::stoi(m[2]);
  file.device.sm_count = static_cast<int>(get_count(dev, "device", "sm_count", INT_MAX));
  file.device.l2_bytes = get_count(dev, "device", "l2_bytes", INT64_MAX);
  if (dev.contains("memory_gbps")) {
    const json& bw = dev["memory_gbps"];
    if (!bw.is_number() || !(bw.get<double>() > 0 && bw.get<double>() < 1e6))
      throw SchemaError(fmt::format("device.memory_gbps {} is not a bandwidth in GB/s", bw.dump()));
    file.device.memory_gbps = bw.get<double>();
  }
  // The key is what matching compares; it must agree with the fields it summarises.
  const std::string key = get_string(dev, "device", "key");
  if (key != file.device.key())
    throw SchemaError(fmt::format("device.key '{}' does not match the device fields ('{}')", key,
                                  file.device.key()));

  const json& meta = field(doc, "", "metadata", &json::is_object, "an object");
  file.metadata.engine_version = get_string(meta, "metadata", "engine_version");
  file.metadata.kernel_source_hash = get_string(meta, "metadata", "kernel_source_hash");
  file.metadata.nvrtc_version = get_string(meta, "metadata", "nvrtc_version");
  file.metadata.driver_version = static_cast<int>(get_count(meta, "metadata", "driver_version", INT_MAX));

  const json& entries = field(doc, "", "entries", &json::is_object, "an object");
  for (auto it = entries.begin(); it != entries.end(); ++it)
    file.entries.emplace(it.key(), parse_entry(it.value(), fmt::format("entries[\"{}\"]", it.key())));
  return file;
}

json to_json(const DeviceFingerprint& device, const CacheMetadata& metadata,
             const std::map<std::string, TunedEntry>& entries) {
  json doc;
  doc["schema_version"] = kTunedCacheSchemaVersion;
  doc["device"] = {{"key", device.key()},
                   {"name", device.name},
                   {"compute_capability", fmt::format("{}.{}", device.cc_major, device.cc_minor)},
                   {"sm_count", device.sm_count},
                   {"l2_bytes", device.l2_bytes}};
  if (device.memory_gbps > 0) doc["device"]["memory_gbps"] = static_cast<std::int64_t>(std::round(device.memory_gbps));
  doc["metadata"] = {{"engine_version", metadata.engine_version},
                     {"kernel_source_hash", metadata.kernel_source_hash},
                     {"nvrtc_version", metadata.nvrtc_version},
                     {"driver_version", metadata.driver_version}};
  json& out = doc["entries"] = json::object();
  for (const auto& [key, entry] : entries) {
    json candidates = json::array();
    for (const CandidateTiming& c : entry.candidates) {
      json jc = {{"config", c.config.str()}, {"median_us", c.median_us}};
      if (!c.rejected.empty()) jc["rejected"] = c.rejected;
      candidates.push_back(std::move(jc));
    }
    out[key] = {{"shape", entry.shape},
                {"kernel_hash", entry.kernel_hash},
                {"winner", entry.winner.str()},
                {"winner_us", entry.winner_us},
                {"tuned_at", entry.tuned_at},
                {"candidates", std::move(candidates)}};
  }
  return doc;
}

// Reads the whole file into `out`; returns 0 or the errno of the failing call.
int read_whole_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[65536];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      err = errno;
      break;
    }
  }
  ::close(fd);
  return err;
}

// Replaces `path` with `text` (write_file_atomically); a failure is an error.
void write_atomically(const std::string& path, const std::string& text) {
  if (auto why = write_file_atomically(path, text))
    throw Error(ErrorKind::Cache, fmt::format("cannot write tuned cache {}: {}", path, *why));
}

// An exclusive flock on `lock_path`, held until destruction (closing the
// descriptor releases it). The lock file stays: deleting it would let two
// writers lock different inodes of the same name.
class FileLock {
 public:
  FileLock(const std::string& lock_path, int timeout_ms) {
    fd_ = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(ErrorKind::Cache, fmt::format("cannot open lock file {}: {}", lock_path, errno_text(errno)));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    // Polled rather than blocking, so the wait can time out.
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
        ::close(fd_);
        throw Error(ErrorKind::Cache,
                    err == EWOULDBLOCK
                        ? fmt::format("timed out after {} ms waiting for the lock {}", timeout_ms, lock_path)
                        : fmt::format("cannot lock {}: {}", lock_path, errno_text(err)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

DeviceFacts DeviceFingerprint::facts() const {
  return DeviceFacts::of(cc_major, cc_minor, sm_count, l2_bytes, memory_gbps);
}

std::string DeviceFingerprint::key() const {
  return fmt::format("{}|cc{}.{}|{}sm|{}MiB", name, cc_major, cc_minor, sm_count, l2_bytes / kMiB);
}

std::string DeviceFingerprint::slug() const {
  // ASCII only, independent of the locale.
  std::string s;
  for (char c : name) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
      s += c;
    else if (!s.empty() && s.back() != '-')
      s += '-';
  }
  if (!s.empty() && s.back() == '-') s.pop_back();
  return fmt::format("{}.cc{}{}.{}sm.{}mib", s, cc_major, cc_minor, sm_count, l2_bytes / kMiB);
}

std::optional<TunedCacheFile> read_tuned_cache_file(const std::string& path, const WarnFn& warn) {
  std::string text;
  std::string reason;
  if (const int err = read_whole_file(path, text)) {
    if (err == ENOENT) return std::nullopt;
    reason = fmt::format("cannot read it: {}", errno_text(err));
  } else if (text.empty()) {
    reason = "the file is empty";
  } else {
    // Anything thrown here means a bad file, never a bug worth crashing for.
    try {
      return parse_cache_file(path, json::parse(text));
    } catch (const json::parse_error& e) {
      reason = fmt::format("not valid JSON ({})", e.what());
    } catch (const std::exception& e) {
      reason = e.what();
    }
  }
  warn(fmt::format("ignoring tuned cache {}: {}", path, reason));
  return std::nullopt;
}

std::vector<TunedCacheFile> list_tuned_cache_files(const std::string& dir, const WarnFn& warn) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::error_code type_ec; it->path().extension() == ".json" && it->is_regular_file(type_ec))
      paths.push_back(it->path().string());
  if (ec && ec != std::errc::no_such_file_or_directory)
    warn(fmt::format("cannot list tuned caches in {}: {}", dir, ec.message()));
  std::sort(paths.begin(), paths.end());
  std::vector<TunedCacheFile> files;
  for (const std::string& p : paths)
    if (auto f = read_tuned_cache_file(p, warn)) files.push_back(std::move(*f));
  return files;
}

void merge_into_tuned_cache_file(const std::string& path, const DeviceFingerprint& device,
                                 const CacheMetadata& metadata,
                                 const std::map<std::string, TunedEntry>& entries, int lock_timeout_ms) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec)
      throw Error(ErrorKind::Cache, fmt::format("cannot create directory {}: {}", parent.string(), ec.message()));
  }
  FileLock lock(path + ".lock", lock_timeout_ms);
  std::map<std::string, TunedEntry> merged;
  if (auto old = read_tuned_cache_file(path, default_warn); old && old->device.key() == device.key())
    merged = std::move(old->entries);
  for (const auto& [key, entry] : entries) merged[key] = entry;
  // Replacing invalid UTF-8 (e.g. in a compiler log quoted in `rejected`) keeps dump() from throwing.
  write_atomically(path, to_json(device, metadata, merged).dump(1, ' ', false, json::error_handler_t::replace) + "\n");
}

std::size_t remove_from_tuned_cache_file(const std::string& path, const std::set<std::string>& keys,
                                         int lock_timeout_ms) {
  FileLock lock(path + ".lock", lock_timeout_ms);
  auto file = read_tuned_cache_file(path, default_warn);
  if (!file) throw Error(ErrorKind::Cache, fmt::format("cannot read tuned cache {}", path));
  std::size_t removed = 0;
  for (const auto& k : keys) removed += file->entries.erase(k);
  if (removed)
    write_atomically(path, to_json(file->device, file->metadata, file->entries)
                               .dump(1, ' ', false, json::error_handler_t::replace) + "\n");
  return removed;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void default_warn(const std::string& text) {
  static std::mutex mu;
  static std::set<std::string> printed;
  std::lock_guard<std::mutex> lock(mu);
  if (printed.insert(text).second) fmt::print(stderr, "normjit: warning: {}\n", text);
}

}  // namespace normjit::detail
