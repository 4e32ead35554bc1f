// Tuned-config cache: keys, the JSON format, rejection of bad files, the
// lookup chain, and locked atomic merging from many threads and processes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"

namespace fs = std::filesystem;
using namespace normjit;
using namespace normjit::detail;
using nlohmann::json;

namespace {

// A fresh directory, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() / fmt::format("normjit-test-{}-{}", ::getpid(), counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Records warnings instead of printing them; thread-safe.
class Warnings {
 public:
  WarnFn fn() {
    return [this](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(s);
    };
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

DeviceFingerprint h100() { return {"NVIDIA H100 80GB HBM3", 9, 0, 132, 50LL << 20}; }
DeviceFingerprint a100() { return {"NVIDIA A100-SXM4-80GB", 8, 0, 108, 40LL << 20}; }

const std::string kHash = "00112233445566778899aabbccddeeff";
const std::string kOtherHash = "ffeeddccbbaa99887766554433221100";

CacheMetadata meta(const std::string& hash = kHash) { return {"0.1.0", hash, "13.0", 13000}; }

std::string slug_file(const TempDir& dir) { return dir.file(h100().slug() + ".json"); }

// Entries of these tests are current when tuned for kHash (the real rule,
// entry_staleness, is tested with real kernel specs below).
std::string by_hash(const std::string&, const TunedEntry& e) {
  return e.kernel_hash == kHash ? "" : "kernel changed (source hash " + e.kernel_hash + ")";
}

// An entry with a winner, a slower candidate and a rejected one.
TunedEntry make_entry(const std::string& winner, double us, const std::string& hash = kHash) {
  TunedEntry e;
  e.shape = "rms:bf16:1024x64";
  e.kernel_hash = hash;
  e.winner = LaunchConfig::parse(winner);
  e.winner_us = us;
  e.tuned_at = "2026-11-21T06:00:00Z";
  e.candidates = {{e.winner, us, ""},
                  {LaunchConfig::parse("v4.t128.r2"), us * 1.5 + 0.125, ""},
                  {LaunchConfig::parse("v8.t1024.r1.2p"), -1, "mismatch: max abs error 0.5 at row 3"}};
  return e;
}

void check_same(const TunedEntry& got, const TunedEntry& want) {
  CHECK(got.shape == want.shape);
  CHECK(got.kernel_hash == want.kernel_hash);
  CHECK(got.winner == want.winner);
  CHECK(got.winner_us == want.winner_us);
  CHECK(got.tuned_at == want.tuned_at);
  REQUIRE(got.candidates.size() == want.candidates.size());
  for (std::size_t i = 0; i < want.candidates.size(); ++i) {
    CAPTURE(i);
    CHECK(got.candidates[i].config == want.candidates[i].config);
    CHECK(got.candidates[i].median_us == want.candidates[i].median_us);
    CHECK(got.candidates[i].rejected == want.candidates[i].rejected);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

int temp_files_in(const TempDir& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir.str()))
    if (contains(e.path().filename().string(), ".tmp.")) ++n;
  return n;
}

// A distinct shape key per index.
std::string key_n(int n) {
  NormDesc d;
  d.M = 1024;
  d.N = 64 + n;
  return shape_key(Op::Forward, d);
}

}  // namespace

TEST_CASE("tuned_cache: m_bucket rounds up to a power of two, capped") {
  CHECK(m_bucket(0) == 0);
  CHECK(m_bucket(1) == 1);
  CHECK(m_bucket(2) == 2);
  CHECK(m_bucket(3) == 4);
  CHECK(m_bucket(4096) == 4096);
  CHECK(m_bucket(4097) == 8192);
  CHECK(m_bucket(65535) == 65536);
  CHECK(m_bucket(65536) == 65536);
  CHECK(m_bucket(65537) == 65536);
  CHECK(m_bucket(std::int64_t{1} << 40) == 65536);
}

TEST_CASE("tuned_cache: shape_key format") {
  NormDesc d;
  d.M = 8192;
  d.N = 4096;
  CHECK(shape_key(Op::Forward, d) == "rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=8192");
  d.store_rstd = false;
  CHECK(shape_key(Op::Forward, d) == "rms_fwd:x=bf16:y=bf16:w=bf16:N=4096:M<=8192");
  d.store_rstd = true;
  CHECK(shape_key(Op::Backward, d) == "rms_bwd:x=bf16:y=bf16:w=bf16:N=4096:M<=8192");

  d.M = 5000;
  d.N = 5120;
  d.x_dtype = DType::F32;
  d.y_dtype = DType::F16;
  d.weight_dtype = DType::F32;
  d.x_stride = 6000;  // strides are not part of the key
  CHECK(shape_key(Op::Forward, d) == "rms_fwd:x=fp32:y=fp16:w=fp32:rstd:N=5120:M<=8192");
  d.M = 0;
  CHECK(shape_key(Op::Backward, d) == "rms_bwd:x=fp32:y=fp16:w=fp32:N=5120:M<=0");
  d.M = 1000000;
  CHECK(shape_key(Op::Backward, d) == "rms_bwd:x=fp32:y=fp16:w=fp32:N=5120:M<=65536");
}

TEST_CASE("tuned_cache: device fingerprint key and slug") {
  CHECK(h100().key() == "NVIDIA H100 80GB HBM3|cc9.0|132sm|50MiB");
  CHECK(h100().slug() == "nvidia-h100-80gb-hbm3.cc90.132sm.50mib");
  CHECK(a100().slug() == "nvidia-a100-sxm4-80gb.cc80.108sm.40mib");
  // L2 rounds down to whole MiB; runs of punctuation collapse; no '-' at the ends.
  DeviceFingerprint odd{"  Tesla V100--SXM2 (16GB)!", 7, 0, 80, (6LL << 20) + 1023};
  CHECK(odd.key() == "  Tesla V100--SXM2 (16GB)!|cc7.0|80sm|6MiB");
  CHECK(odd.slug() == "tesla-v100-sxm2-16gb.cc70.80sm.6mib");
}

TEST_CASE("tuned_cache: JSON round trip keeps every field") {
  TempDir dir;
  const std::string path = dir.file("sub/dir/" + h100().slug() + ".json");  // parents are created
  const std::map<std::string, TunedEntry> entries = {{key_n(1), make_entry("v8.t512.r1", 12.3)},
                                                     {key_n(2), make_entry("v2.t32.r4", 0.1 + 0.2)}};
  merge_into_tuned_cache_file(path, h100(), meta(), entries);

  Warnings w;
  const auto f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  CHECK(w.lines().empty());
  CHECK(f->path == path);
  CHECK(f->device.name == h100().name);
  CHECK(f->device.cc_major == 9);
  CHECK(f->device.cc_minor == 0);
  CHECK(f->device.sm_count == 132);
  CHECK(f->device.l2_bytes == h100().l2_bytes);
  CHECK(f->metadata.engine_version == "0.1.0");
  CHECK(f->metadata.kernel_source_hash == kHash);
  CHECK(f->metadata.nvrtc_version == "13.0");
  CHECK(f->metadata.driver_version == 13000);
  REQUIRE(f->entries.size() == 2);
  for (const auto& [key, want] : entries) {
    CAPTURE(key);
    REQUIRE(f->entries.count(key) == 1);
    check_same(f->entries.at(key), want);
  }

  // The layout on disk, as documented in tuning/cache_file.hpp.
  const json doc = json::parse(read_text(path));
  CHECK(doc["schema_version"] == kTunedCacheSchemaVersion);
  CHECK(doc["device"]["key"] == h100().key());
  CHECK(doc["device"]["compute_capability"] == "9.0");
  const json& cands = doc["entries"][key_n(1)]["candidates"];
  REQUIRE(cands.size() == 3);
  CHECK_FALSE(cands[0].contains("rejected"));
  CHECK(cands[2]["median_us"] == -1.0);
  CHECK(cands[2]["rejected"] == "mismatch: max abs error 0.5 at row 3");
  CHECK(doc["entries"][key_n(1)]["winner"] == "v8.t512.r1");
  CHECK(doc["entries"][key_n(1)]["winner_us"].is_number_float());
  CHECK(temp_files_in(dir) == 0);
  CHECK(fs::directory_iterator(dir.file("sub/dir")) != fs::directory_iterator());
}

TEST_CASE("tuned_cache: missing file is silently absent") {
  TempDir dir;
  Warnings w;
  CHECK_FALSE(read_tuned_cache_file(dir.file("nope.json"), w.fn()));
  CHECK(w.lines().empty());
  TunedCache cache(dir.file("no/such/dir"), {dir.file("neither")}, h100(), meta(), w.fn(), by_hash);
  CHECK_FALSE(cache.lookup(key_n(1)));
  CHECK(w.lines().empty());
}

TEST_CASE("tuned_cache: merge keeps, overwrites and drops entries") {
  TempDir dir;
  const std::string path = slug_file(dir);
  const TunedEntry a = make_entry("v8.t256.r1", 10), b = make_entry("v8.t512.r1", 11),
                   b2 = make_entry("v4.t64.r4", 9), c = make_entry("v1.t32.r1", 30);
  merge_into_tuned_cache_file(path, h100(), meta(), {{"A", a}, {"B", b}});
  merge_into_tuned_cache_file(path, h100(), meta(), {{"B", b2}, {"C", c}});
  Warnings w;
  auto f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  REQUIRE(f->entries.size() == 3);
  check_same(f->entries.at("A"), a);
  check_same(f->entries.at("B"), b2);
  check_same(f->entries.at("C"), c);

  // Other kernel sources: entries are kept (each is checked on lookup by its
  // own kernel hash), the file records the new sources.
  merge_into_tuned_cache_file(path, h100(), meta(kOtherHash), {{"D", a}});
  f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  CHECK(f->metadata.kernel_source_hash == kOtherHash);
  REQUIRE(f->entries.size() == 4);
  CHECK(f->entries.count("D") == 1);

  // Another device: dropped as well.
  merge_into_tuned_cache_file(path, a100(), meta(kOtherHash), {{"E", b}});
  f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  CHECK(f->device.key() == a100().key());
  REQUIRE(f->entries.size() == 1);
  CHECK(f->entries.count("E") == 1);
  CHECK(w.lines().empty());
  CHECK(temp_files_in(dir) == 0);
}

TEST_CASE("tuned_cache: bad files are ignored with one warning and rebuilt by store") {
  // A valid document to damage.
  std::string valid;
  {
    TempDir scratch;
    merge_into_tuned_cache_file(scratch.file("v.json"), h100(), meta(),
                                {{key_n(1), make_entry("v8.t512.r1", 12)}, {key_n(2), make_entry("v4.t256.r1", 7)}});
    valid = read_text(scratch.file("v.json"));
  }
  const json doc = json::parse(valid);
  const auto edited = [&](const std::function<void(json&)>& edit) {
    json d = doc;
    edit(d);
    return d.dump(1);
  };
  std::string random_bytes(512, '\0');
  std::mt19937 rng(1234);
  for (char& ch : random_bytes) ch = static_cast<char>(rng());

  struct Case {
    const char* name;
    std::string text;
    const char* reason;  // expected in the warning
  };
  const std::vector<Case> cases = {
      {"random bytes", random_bytes, "not valid JSON"},
      {"truncated", valid.substr(0, valid.size() / 2), "not valid JSON"},
      {"empty", "", "empty"},
      {"top-level array", "[1, 2, 3]", "not a JSON object"},
      {"foreign schema", edited([](json& d) { d["schema_version"] = 999; }), "schema_version 999"},
      {"schema_version string", edited([](json& d) { d["schema_version"] = "1"; }), "schema_version is not"},
      {"no schema_version", edited([](json& d) { d.erase("schema_version"); }), "schema_version is missing"},
      {"winner_us string", edited([&](json& d) { d["entries"][key_n(2)]["winner_us"] = "fast"; }),
       "winner_us is not a number"},
      {"bad winner config", edited([&](json& d) { d["entries"][key_n(1)]["winner"] = "v3.t7.r1"; }), "v3.t7.r1"},
      {"winner number", edited([&](json& d) { d["entries"][key_n(1)]["winner"] = 5; }), "winner is not a string"},
      {"candidates object", edited([&](json& d) { d["entries"][key_n(1)]["candidates"] = json::object(); }),
       "candidates is not an array"},
      {"candidate config null", edited([&](json& d) { d["entries"][key_n(1)]["candidates"][1]["config"] = nullptr; }),
       "candidates[1].config"},
      {"entry is a list", edited([&](json& d) { d["entries"][key_n(1)] = json::array(); }), "is not an object"},
      {"entries missing", edited([](json& d) { d.erase("entries"); }), "entries is missing"},
      {"no kernel hash", edited([](json& d) { d["metadata"].erase("kernel_source_hash"); }),
       "metadata.kernel_source_hash is missing"},
      {"negative sm_count", edited([](json& d) { d["device"]["sm_count"] = -1; }), "device.sm_count"},
      {"bad compute capability", edited([](json& d) { d["device"]["compute_capability"] = "nine"; }), "nine"},
      {"key disagrees with fields", edited([](json& d) { d["device"]["key"] = "some other GPU"; }),
       "does not match"},
  };

  for (const Case& c : cases) {
    CAPTURE(c.name);
    TempDir dir;
    const std::string path = slug_file(dir);
    write_text(path, c.text);

    Warnings w;
    std::optional<TunedCacheFile> f;
    CHECK_NOTHROW(f = read_tuned_cache_file(path, w.fn()));
    CHECK_FALSE(f);
    const auto lines = w.lines();
    REQUIRE(lines.size() == 1);
    CHECK(contains(lines[0], path));
    CHECK(contains(lines[0], c.reason));

    // The lookup chain reads the file once and warns once.
    Warnings cw;
    TunedCache cache(dir.str(), {}, h100(), meta(), cw.fn(), by_hash);
    CHECK_FALSE(cache.lookup(key_n(1)));
    CHECK_FALSE(cache.lookup(key_n(2)));
    CHECK(cw.lines().size() == 1);

    // store() replaces the bad file with a valid one holding just the new entry.
    const TunedEntry fresh = make_entry("v2.t64.r2", 3.5);
    cache.store(key_n(3), fresh);
    Warnings rw;
    const auto rebuilt = read_tuned_cache_file(path, rw.fn());
    REQUIRE(rebuilt);
    CHECK(rw.lines().empty());
    REQUIRE(rebuilt->entries.size() == 1);
    check_same(rebuilt->entries.at(key_n(3)), fresh);
    CHECK(temp_files_in(dir) == 0);
  }
}

TEST_CASE("tuned_cache: list_tuned_cache_files reads *.json files in name order") {
  TempDir dir;
  merge_into_tuned_cache_file(dir.file("b.json"), h100(), meta(), {{"K", make_entry("v8.t512.r1", 1)}});
  merge_into_tuned_cache_file(dir.file("a.json"), a100(), meta(), {{"K", make_entry("v8.t256.r1", 2)}});
  write_text(dir.file("c.json"), "{ not json");
  write_text(dir.file("notes.txt"), "hello");
  fs::create_directories(dir.file("d.json"));  // a directory, not a file

  Warnings w;
  const auto files = list_tuned_cache_files(dir.str(), w.fn());
  REQUIRE(files.size() == 2);
  CHECK(files[0].path == dir.file("a.json"));
  CHECK(files[0].device.key() == a100().key());
  CHECK(files[1].path == dir.file("b.json"));
  REQUIRE(w.lines().size() == 1);
  CHECK(contains(w.lines()[0], dir.file("c.json")));

  Warnings none;
  CHECK(list_tuned_cache_files(dir.file("missing"), none.fn()).empty());
  CHECK(none.lines().empty());
}

TEST_CASE("tuned_cache: lookup order is memory, user, shipped; mismatched files are ignored") {
  TempDir user, stale, other_gpu, shipped;
  const std::string k1 = key_n(1), k2 = key_n(2), k3 = key_n(3);
  merge_into_tuned_cache_file(slug_file(stale), h100(), meta(kOtherHash),
                              {{k1, make_entry("v1.t32.r1", 50, kOtherHash)}, {k3, make_entry("v1.t32.r1", 50, kOtherHash)}});
  // Named for our device, but written for another.
  merge_into_tuned_cache_file(slug_file(other_gpu), a100(), meta(), {{k1, make_entry("v2.t32.r1", 40)}});
  merge_into_tuned_cache_file(slug_file(shipped), h100(), meta(),
                              {{k1, make_entry("v8.t256.r1", 10)}, {k2, make_entry("v8.t512.r1", 20)}});
  merge_into_tuned_cache_file(slug_file(user), h100(), meta(), {{k2, make_entry("v4.t512.r1", 15)}});

  Warnings w;
  TunedCache cache(user.str(), {stale.str(), other_gpu.str(), shipped.str()}, h100(), meta(), w.fn(), by_hash);
  CHECK(cache.user_file() == slug_file(user));

  ConfigSource src = ConfigSource::Heuristic;
  auto e = cache.lookup(k1, &src);
  REQUIRE(e);
  CHECK(src == ConfigSource::ShippedCache);
  CHECK(e->winner == LaunchConfig::parse("v8.t256.r1"));
  auto lines = w.lines();
  REQUIRE(lines.size() == 2);
  CHECK(contains(lines[0], slug_file(stale)));
  CHECK(contains(lines[0], "2 of 2 entries are stale"));
  CHECK(contains(lines[0], kOtherHash));
  CHECK(contains(lines[1], slug_file(other_gpu)));
  CHECK(contains(lines[1], a100().key()));

  src = ConfigSource::Heuristic;
  e = cache.lookup(k2, &src);
  REQUIRE(e);
  CHECK(src == ConfigSource::UserCache);
  CHECK(e->winner == LaunchConfig::parse("v4.t512.r1"));

  CHECK_FALSE(cache.lookup(k3, &src));
  CHECK(w.lines().size() == 2);  // files are read once

  const TunedEntry tuned = make_entry("v2.t1024.r1", 9);
  cache.store(k2, tuned);
  src = ConfigSource::Heuristic;
  e = cache.lookup(k2, &src);
  REQUIRE(e);
  CHECK(src == ConfigSource::Memory);
  check_same(*e, tuned);

  // A new process (here: a new cache) finds the stored entry in the user file.
  Warnings w2;
  TunedCache again(user.str(), {shipped.str()}, h100(), meta(), w2.fn(), by_hash);
  e = again.lookup(k2, &src);
  REQUIRE(e);
  CHECK(src == ConfigSource::UserCache);
  check_same(*e, tuned);
  e = again.lookup(k1, &src);
  REQUIRE(e);
  CHECK(src == ConfigSource::ShippedCache);
  CHECK(w2.lines().empty());
}

TEST_CASE("tuned_cache: concurrent merges from several processes keep every entry") {
  TempDir dir;
  const std::string path = slug_file(dir);
  constexpr int kProcs = 8, kKeys = 25;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int k = 0; k < kKeys; ++k)
          merge_into_tuned_cache_file(path, h100(), meta(),
                                      {{key_n(p * kKeys + k), make_entry("v8.t512.r1", p * kKeys + k)}}, 60000);
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);  // no doctest teardown in the child
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  Warnings w;
  const auto f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  CHECK(w.lines().empty());
  CHECK(f->entries.size() == kProcs * kKeys);
  for (int n = 0; n < kProcs * kKeys; ++n) {
    CAPTURE(n);
    const auto it = f->entries.find(key_n(n));
    REQUIRE(it != f->entries.end());
    CHECK(it->second.winner_us == n);
  }
  CHECK(temp_files_in(dir) == 0);
}

TEST_CASE("tuned_cache: concurrent stores from threads through one TunedCache") {
  TempDir dir;
  constexpr int kThreads = 8, kKeys = 25;
  Warnings w;
  TunedCache cache(dir.str(), {}, h100(), meta(), w.fn(), by_hash);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        try {
          const int n = t * kKeys + k;
          cache.store(key_n(n), make_entry("v4.t128.r1", n));
          if (!cache.lookup(key_n(n))) ++failures;
        } catch (...) {
          ++failures;
        }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(w.lines().empty());

  TunedCache reader(dir.str(), {}, h100(), meta(), w.fn(), by_hash);
  for (int n = 0; n < kThreads * kKeys; ++n) {
    CAPTURE(n);
    ConfigSource src = ConfigSource::Heuristic;
    const auto e = reader.lookup(key_n(n), &src);
    REQUIRE(e);
    CHECK(src == ConfigSource::UserCache);
    CHECK(e->winner_us == n);
  }
  CHECK(temp_files_in(dir) == 0);
}

TEST_CASE("tuned_cache: a held lock makes merge time out with a Cache error") {
  TempDir dir;
  const std::string path = slug_file(dir);
  merge_into_tuned_cache_file(path, h100(), meta(), {{"A", make_entry("v8.t512.r1", 1)}});
  const std::string before = read_text(path);

  // flock locks belong to the open file description: a second open conflicts
  // even within this process.
  const int fd = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  bool threw = false;
  try {
    merge_into_tuned_cache_file(path, h100(), meta(), {{"B", make_entry("v8.t256.r1", 2)}}, 200);
  } catch (const Error& e) {
    threw = true;
    CHECK(e.kind() == ErrorKind::Cache);
    CHECK(contains(e.what(), path + ".lock"));
    CHECK(contains(e.what(), "200 ms"));
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(threw);
  CHECK(waited >= std::chrono::milliseconds(200));
  CHECK(read_text(path) == before);
  ::close(fd);

  merge_into_tuned_cache_file(path, h100(), meta(), {{"B", make_entry("v8.t256.r1", 2)}}, 200);
  Warnings w;
  const auto f = read_tuned_cache_file(path, w.fn());
  REQUIRE(f);
  CHECK(f->entries.size() == 2);
}

TEST_CASE("tuned_cache: a failed write throws a Cache error and leaves no temp file") {
  TempDir dir;
  // rename() cannot replace a non-empty directory with a file.
  const std::string path = dir.file("blocked.json");
  fs::create_directories(path + "/inside");
  bool threw = false;
  try {
    merge_into_tuned_cache_file(path, h100(), meta(), {{"A", make_entry("v8.t512.r1", 1)}});
  } catch (const Error& e) {
    threw = true;
    CHECK(e.kind() == ErrorKind::Cache);
    CHECK(contains(e.what(), path));
  }
  CHECK(threw);
  CHECK(fs::is_directory(path + "/inside"));
  CHECK(temp_files_in(dir) == 0);
}

