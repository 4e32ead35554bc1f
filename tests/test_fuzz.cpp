// Fuzzed inputs for every reader of text or files that normjit does not
// write itself, or that may be damaged on disk: the shape-spec parser, the
// model-config reader, the tuned-cache JSON reader (and the lookups, the
// neighbour search and the store that heals a bad file) and the cubin-cache
// reader. Valid seeds are mutated (bit and byte flips, truncation, deleted
// and repeated ranges, splices of two inputs, dictionary tokens, JSON values
// replaced by values of other types, long repetitions) from fixed seeds, so a
// run is reproducible; accepted inputs join the corpus.
//
// Every input must either be accepted or throw normjit::Error with a
// message naming what was read; no other exception, no crash (a handler
// prints the input and writes it to $TMPDIR/normjit-fuzz-crash-<pid>.bin),
// no hang (a watchdog aborts after NORMJIT_FUZZ_HANG_SECONDS, default 20, on
// one input, printing it). Accepted inputs must satisfy properties (a shape
// spec round-trips through shape_spec; a tuned cache file's store heals it).
//
// Time: NORMJIT_FUZZ_SECONDS in all (default 12; shapes 25%, model configs
// 20%, tuned caches 30%, cubins 25%, plus one NVRTC compile);
// NORMJIT_FUZZ_SEED changes the inputs; an input slower than
// NORMJIT_FUZZ_SLOW_SECONDS (default 5) fails.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "compile/cubin.hpp"
#include "compile/jit.hpp"
#include "models/model_norms.hpp"
#include "compile/specialization.hpp"
#include "test_util.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/parallel.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::detail;
using normjit_test::contains;
using normjit_test::make_desc;
using normjit_test::make_temp_dir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return end && *end == 0 && d > 0 ? d : fallback;
}

double total_seconds() { return std::min(env_number("NORMJIT_FUZZ_SECONDS", 12), 24 * 3600.0); }
std::uint64_t base_seed() {
  const char* v = std::getenv("NORMJIT_FUZZ_SEED");
  return v && *v ? std::strtoull(v, nullptr, 0) : 0x6e6a2d66757a7aULL;
}

// A printable form of an input: C-style escapes, at most `max` bytes shown.
std::string escaped(const std::string& s, std::size_t max = 300) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\' || c == '"') out += fmt::format("\\{}", static_cast<char>(c));
    else if (c >= 32 && c < 127) out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max) out += fmt::format("... ({} bytes in all)", s.size());
  return "\"" + out + "\"";
}

// ---- crash and hang reporting ----------------------------------------------

// The input being run, for the signal handler and the watchdog.
struct InFlight {
  std::mutex mu;
  std::string target, input;
  Clock::time_point start;
  bool active = false;
};
InFlight& in_flight() {
  static InFlight f;
  return f;
}
// Copies for the signal handler (it must not take locks or allocate).
std::atomic<const char*> g_crash_target{nullptr};
std::atomic<const std::string*> g_crash_input{nullptr};
char g_crash_path[512];
std::atomic<int> g_report_fd{2};  // stderr, also while QuietStderr silences fd 2

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
void write_str(int fd, const char* s) { write_all(fd, s, std::strlen(s)); }

extern "C" void fuzz_crash_handler(int sig) {
  const char* target = g_crash_target.load();
  const std::string* input = g_crash_input.load();
  const int out = g_report_fd.load();
  write_str(out, "\nnormjit fuzz: signal ");
  char num[16];
  int n = 0;
  for (int v = sig; v > 0 && n < 15; v /= 10) num[n++] = static_cast<char>('0' + v % 10);
  while (n > 0) write_all(out, &num[--n], 1);
  if (target && input) {
    write_str(out, " while the ");
    write_str(out, target);
    write_str(out, " target ran an input; it is in ");
    write_str(out, g_crash_path);
    write_str(out, "\n");
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      write_all(fd, input->data(), input->size());
      ::close(fd);
    }
  } else {
    write_str(out, "\n");
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Installs the crash handler (on an alternate stack: a stack overflow must
// still be reported) and the watchdog for one test case; restores doctest's
// handlers afterwards.
class Guard {
 public:
  explicit Guard(const std::string& target) : target_(target) {
    std::snprintf(g_crash_path, sizeof g_crash_path, "%s/normjit-fuzz-crash-%d.bin",
                  fs::temp_directory_path().c_str(), static_cast<int>(::getpid()));
    alt_.resize(1 << 16);
    stack_t ss{};
    ss.ss_sp = alt_.data();
    ss.ss_size = alt_.size();
    ::sigaltstack(&ss, &old_stack_);
    struct sigaction sa {};
    sa.sa_handler = fuzz_crash_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~Guard() {
    {
      std::lock_guard<std::mutex> lk(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    watchdog_.join();
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    ::sigaltstack(&old_stack_, nullptr);
    g_crash_target = nullptr;
    g_crash_input = nullptr;
  }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

  // Marks `input` as running (for the handler and the watchdog).
  void begin(const std::string& input) {
    InFlight& f = in_flight();
    std::lock_guard<std::mutex> lk(f.mu);
    f.target = target_;
    f.input = input;
    f.start = Clock::now();
    f.active = true;
    g_crash_target = target_.c_str();
    g_crash_input = &f.input;
  }
  void end() {
    InFlight& f = in_flight();
    std::lock_guard<std::mutex> lk(f.mu);
    f.active = false;
  }

 private:
  static constexpr int kSignals[5] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

  void watch() {
    const double limit = env_number("NORMJIT_FUZZ_HANG_SECONDS", 20);
    std::unique_lock<std::mutex> lk(stop_mu_);
    while (!stop_cv_.wait_for(lk, std::chrono::milliseconds(100), [this] { return stop_; })) {
      InFlight& f = in_flight();
      std::lock_guard<std::mutex> flk(f.mu);
      if (!f.active || std::chrono::duration<double>(Clock::now() - f.start).count() < limit) continue;
      const std::string msg =
          fmt::format("\nnormjit fuzz: the {} target ran one input for more than {:.0f} s (a hang): {}\n"
                      "normjit fuzz: the input is in {}\n",
                      f.target, limit, escaped(f.input, 2000), g_crash_path);
      std::ofstream(g_crash_path, std::ios::binary) << f.input;
      write_all(g_report_fd.load(), msg.data(), msg.size());
      g_crash_target = nullptr;  // the abort below is not a crash of the input's
      std::abort();
    }
  }

  std::string target_;
  std::vector<char> alt_;
  stack_t old_stack_{};
  struct sigaction old_[5] {};
  std::thread watchdog_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
};

// ---- mutation -------------------------------------------------------------

class Mutator {
 public:
  Mutator(std::uint64_t seed, std::vector<std::string> seeds, std::vector<std::string> tokens)
      : rng_(seed), pool_(std::move(seeds)), seeds_(pool_.size()), tokens_(std::move(tokens)) {}

  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(rng_() % n) : 0; }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }
  const std::string& token() { return tokens_[below(tokens_.size())]; }
  std::mt19937_64& rng() { return rng_; }

  // A corpus member: a seed half of the time, else any (seeds and kept inputs).
  const std::string& pick() { return chance(50) ? pool_[below(seeds_)] : pool_[below(pool_.size())]; }

  // 1 to 4 byte-level mutations of `s`.
  std::string mutate(std::string s) {
    const int n = 1 + static_cast<int>(below(4));
    for (int i = 0; i < n; ++i) mutate_once(s);
    return s;
  }
  std::string next() { return mutate(pick()); }

  // An accepted input joins the corpus (bounded; the oldest kept input goes).
  void keep(const std::string& s) {
    if (s.size() > 4096) return;
    if (pool_.size() < seeds_ + 512) pool_.push_back(s);
    else pool_[seeds_ + below(512)] = s;
  }

 private:
  void mutate_once(std::string& s) {
    static const char interesting[] = {0, '\xff', '\x7f', '\x80', ':', '=', 'x', '/', '.', '-', '+', '"', '{', '}',
                                       '[', ']', ',', '0', '9', ' ', '\n', 'e'};
    const std::size_t at = below(s.size() + 1);
    switch (below(10)) {
      case 0:  // flip a bit
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1:  // set a byte
        if (!s.empty()) s[below(s.size())] = interesting[below(sizeof interesting)];
        break;
      case 2:  // truncate
        s.resize(below(s.size() + 1));
        break;
      case 3: {  // delete a range
        const std::size_t len = 1 + below(std::min<std::size_t>(16, s.size() - std::min(at, s.size()) + 1));
        if (at < s.size()) s.erase(at, len);
        break;
      }
      case 4:  // insert a token
        s.insert(at, token());
        break;
      case 5: {  // replace a range with a token
        const std::size_t len = below(12);
        s.replace(std::min(at, s.size()), len, token());
        break;
      }
      case 6: {  // repeat a range
        if (s.empty()) break;
        const std::size_t from = below(s.size()), len = 1 + below(std::min<std::size_t>(32, s.size() - from));
        const std::string part = s.substr(from, len);
        const std::size_t times = chance(10) ? 200 + below(5000) : 1 + below(4);
        std::string rep;
        for (std::size_t k = 0; k < times; ++k) rep += part;
        s.insert(at, rep);
        break;
      }
      case 7: {  // splice with another corpus member
        const std::string& o = pool_[below(pool_.size())];
        s = s.substr(0, at) + o.substr(below(o.size() + 1));
        break;
      }
      case 8: {  // replace a run of digits with an interesting number
        static const char* numbers[] = {"0", "1", "-1", "2147483647", "2147483648", "4294967296", "9223372036854775807",
                                        "9223372036854775808", "18446744073709551616", "99999999999999999999999",
                                        "1e308", "1e-320", "nan", "inf", "0x10", "007", "65537", "262144", "262145"};
        std::size_t b = s.find_first_of("0123456789", at < s.size() ? at : 0);
        if (b == std::string::npos) break;
        std::size_t e = s.find_first_not_of("0123456789", b);
        if (e == std::string::npos) e = s.size();
        s.replace(b, e - b, numbers[below(std::size(numbers))]);
        break;
      }
      default: {  // a long run of one token (parsers that recurse or backtrack)
        std::string rep;
        const std::string& t = token();
        const std::size_t times = 100 + below(20000 / (t.size() + 1));
        for (std::size_t k = 0; k < times; ++k) rep += t;
        s.insert(at, rep);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> pool_;
  std::size_t seeds_;
  std::vector<std::string> tokens_;
};

// Replaces, removes or renames one node of `j` (a structure-aware mutation).
void mutate_json(json& j, Mutator& m) {
  struct Node {
    json* node;
    json* parent;
    std::string key;  // object member name, or "" in an array
    std::size_t index = 0;
  };
  std::vector<Node> nodes;
  std::function<void(json&, json*, const std::string&, std::size_t, int)> walk = [&](json& v, json* parent,
                                                                                    const std::string& key,
                                                                                    std::size_t idx, int depth) {
    nodes.push_back({&v, parent, key, idx});
    if (depth > 64) return;
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) walk(it.value(), &v, it.key(), 0, depth + 1);
    else if (v.is_array())
      for (std::size_t i = 0; i < v.size(); ++i) walk(v[i], &v, "", i, depth + 1);
  };
  walk(j, nullptr, "", 0, 0);
  const Node n = nodes[m.below(nodes.size())];
  static const std::vector<json> values = {
      json(nullptr), json(true), json(false), json(0), json(-1), json(1), json(3), json(64), json(128), json(4096),
      json(2147483648LL), json(-9223372036854775807LL - 1), json(9223372036854775807LL),
      json(18446744073709551615ULL), json(1e308), json(-0.0), json(0.5), json(1e-30), json(""), json("x"),
      json("bf16"), json("float8_e4m3fn"), json("qwen3"), json("gemma3"), json("olmo2"), json("deepseek_v3"),
      json("gpt2"), json("fp8"), json("rms:bf16:8x8"), json("ln:fp16:1x262144:nb"), json("v8.t512.r1"),
      json("v0.t0.r0"), json("v9999.t9999.r9999.c99.2p.s9999.p9999"), json("v1.t1024.r1.c16"),
      json("rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=0:M<=0"), json("9.0"), json("99999.99999"),
      json(std::string(3000, 'a')), json::array(), json::object(), json::array({1, 2}), json::array({128, 128}),
      json::object({{"a", 1}}), json::array({json::object()})};
  switch (m.below(4)) {
    case 0:
    case 1:
      *n.node = values[m.below(values.size())];
      break;
    case 2:  // remove it from its parent
      if (n.parent && n.parent->is_object()) n.parent->erase(n.key);
      else if (n.parent && n.parent->is_array() && n.index < n.parent->size()) n.parent->erase(n.index);
      break;
    default:  // rename (objects), or append a copy (arrays)
      if (n.parent && n.parent->is_object()) {
        json v = *n.node;
        const std::string key = m.mutate(n.key);
        n.parent->erase(n.key);
        (*n.parent)[key] = std::move(v);
      } else if (n.parent && n.parent->is_array()) {
        n.parent->push_back(json(*n.node));
      }
  }
}

// A JSON text mutated structurally, then (sometimes) byte by byte.
std::string mutate_json_text(Mutator& m) {
  const std::string& base = m.pick();
  json j;
  try {
    j = json::parse(base);
  } catch (const std::exception&) {
    return m.mutate(base);
  }
  const int n = 1 + static_cast<int>(m.below(3));
  for (int i = 0; i < n; ++i) mutate_json(j, m);
  std::string text = j.dump(m.chance(50) ? 1 : -1, ' ', false, json::error_handler_t::replace);
  return m.chance(30) ? m.mutate(text) : text;
}

// ---- running inputs ---------------------------------------------------------

struct Stats {
  std::size_t inputs = 0, accepted = 0, rejected = 0, bytes = 0;
  double seconds = 0, slowest = 0;
  std::string slowest_input;
  std::size_t failures = 0;
  std::vector<std::string> messages;  // the first failures, with their inputs

  void fail(const std::string& what, const std::string& input) {
    ++failures;
    if (messages.size() < 8) messages.push_back(fmt::format("{}\n  input: {}", what, escaped(input)));
  }
  void report(const char* target) {
    for (const auto& m : messages) FAIL_CHECK(m);
    CHECK(failures == 0);
    // The watchdog aborts a hang; this catches inputs that are merely slow
    // (typical inputs take well under 100 ms).
    const double slow_limit = env_number("NORMJIT_FUZZ_SLOW_SECONDS", 5);
    if (slowest > slow_limit)
      FAIL_CHECK(fmt::format("one input took {:.1f} s (limit {} s): {}", slowest, slow_limit, escaped(slowest_input)));
    MESSAGE(fmt::format("fuzz {}: {} inputs ({:.1f} MB) in {:.1f} s: {} accepted, {} rejected with normjit::Error, "
                        "{} failures; slowest input {:.1f} ms ({} bytes)",
                        target, inputs, bytes / 1e6, seconds, accepted, rejected, failures, slowest * 1e3,
                        slowest_input.size()));
  }
};

enum class Outcome { Accepted, Rejected, Failed };

// Runs `fn(input)` under the guard, timed; classifies what it threw.
// `rejection_ok(e)` says whether the reader may throw `e` (and its message
// is clear enough).
Outcome run_one(Guard& g, Stats& st, const std::string& input, const std::function<void(const std::string&)>& fn,
                const std::function<bool(const Error&)>& rejection_ok) {
  ++st.inputs;
  st.bytes += input.size();
  g.begin(input);
  const auto t0 = Clock::now();
  Outcome o = Outcome::Accepted;
  std::string failure;
  try {
    fn(input);
  } catch (const Error& e) {
    o = Outcome::Rejected;
    if (e.message().empty() || !rejection_ok(e)) {
      o = Outcome::Failed;
      failure = fmt::format("a normjit::Error this reader must not throw, or without a clear message: '{}'", e.what());
    }
  } catch (const std::exception& e) {
    o = Outcome::Failed;
    failure = fmt::format("an exception other than normjit::Error ({}): {}", typeid(e).name(), e.what());
  } catch (...) {
    o = Outcome::Failed;
    failure = "an exception of an unknown type";
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  g.end();
  if (secs > st.slowest) {
    st.slowest = secs;
    st.slowest_input = input;
  }
  if (o == Outcome::Accepted) ++st.accepted;
  if (o == Outcome::Rejected) ++st.rejected;
  if (o == Outcome::Failed) st.fail(failure, input);
  return o;
}

// Runs inputs from `next` until `seconds` pass (at least `min_inputs`).
void run_for(double seconds, std::size_t min_inputs, Stats& st, const std::function<bool()>& one) {
  const auto t0 = Clock::now();
  for (std::size_t i = 0;; ++i) {
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= min_inputs && el >= seconds) break;
    if (!one()) break;
  }
  st.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- seeds ------------------------------------------------------------------

std::vector<std::string> shape_seeds() {
  std::vector<std::string> s = {
      "rms:bf16:8192x4096",
      "ln:fp16:4096x4096",
      "ln:fp16:4096x4096:nb",
      "rms:bf16:32768x128:heads=32:x_stride=6144",
      "rms:bf16:8192x4096:res",
      "rms:bf16:8x4096:res=fp32:ro=bf16:fp32sum:dres",
      "ln:fp32:1x7:nw:nb:eps=1e-3",
      "rms:bf16:64x4096:off=1:cast=gemma",
      "rms:fp16:3x262144:cast=llama:w=fp32:y=fp32",
      "rms:bf16:16x128:norstd",
      "ln:bf16:16x128:nomean",
      "rms:bf16:1024x7168:quant=e4m3/group128:colmajor",
      "ln:bf16:512x4096:x=e4m3/group16:quant=e4m3/tensor:transpose",
      "rms:bf16:64x4096:quant=e5m2/token:ub=0.00001",
      "rms:bf16:64x4096:x=e4m3/group16:grad=fp32",
      "rms:bf16:0x1",
      "rms:fp32:1x262144:res:noro",
  };
  for (const auto& v : normjit_test::fp8_variants(256, 4096, DType::BF16)) s.push_back(v.name);
  return s;
}

std::vector<std::string> shape_tokens() {
  return {"rms", "ln", ":", "=", "x", "/", "bf16", "fp16", "fp32", "e4m3", "e5m2", "float", ":w=", ":y=", ":res",
          ":res=", ":fp32sum", ":dres", ":nw", ":nb", ":off=", ":cast=", "llama", "gemma", "default", ":eps=",
          ":heads=", ":x_stride=", ":ro=", ":noro", ":norstd", ":nomean", ":quant=", "e4m3/tensor", "e5m2/token",
          "e4m3/tensor-static", "e4m3/group128", "group0", "group999", "mx32", ":x=", "e4m3/group16", ":ue8m0",
          ":colmajor", ":ub=", ":yhp", ":yhp=", ":transpose", ":grad=", "0", "1", "-1", "1e-6", "1e39", "nan", "inf",
          "-0", "4096", "262144", "262145", "9223372036854775807", "99999999999999999999", "0x", "+", ".", "e"};
}

std::vector<std::string> model_seeds() {
  std::vector<std::string> s;
  for (const auto& e : fs::directory_iterator(NORMJIT_TEST_MODELS_DIR))
    if (e.path().extension() == ".json") {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      s.push_back(ss.str());
    }
  std::sort(s.begin(), s.end());  // directory order is not fixed
  s.push_back(R"({"model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "head_dim": 128, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"})");
  s.push_back(R"({"model_type": "olmo2", "hidden_size": 2048, "num_attention_heads": 16, "torch_dtype": "float32"})");
  s.push_back(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                  "head_dim": 256, "num_attention_heads": 8, "num_key_value_heads": 4}, "torch_dtype": "bfloat16"})");
  s.push_back(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "q_lora_rank": 1536, "kv_lora_rank": 512,
                  "qk_rope_head_dim": 64, "torch_dtype": "bfloat16",
                  "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  s.push_back(R"({"model_type": "llama", "hidden_size": 4096, "dtype": "float16",
                  "quantization_config": {"quant_method": "fp8"}})");
  s.push_back(R"({"model_type": "gpt2", "n_embd": 768, "layer_norm_epsilon": 1e-5})");
  return s;
}

std::vector<std::string> json_tokens() {
  return {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "0", "-1", "1e400", "-0", "0.5",
          "9223372036854775807", "18446744073709551615", "\"hidden_size\": 0", "\"num_attention_heads\": 0",
          "\"head_dim\": -1", "\"torch_dtype\": 5", "\"rms_norm_eps\": \"x\"", "\"model_type\": \"qwen3\"",
          "\"model_type\": 7", "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 4294967424]}",
          "\"text_config\": {}", "\"text_config\": {\"hidden_size\": 9223372036854775807}", "\\u0000", "\\ud800",
          "\xff\xfe", "[[[[[[[[", "{\"a\":{\"a\":{\"a\":", "\"entries\"", "\"schema_version\": 2",
          "\"schema_version\": 1", "\"winner\": \"v8.t512.r1\"", "\"candidates\": []", ":N=", ":M<=", "N=0", "M<=0",
          "rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=1", "ln_bwd", "\"median_us\": -1", "1e-300", "NaN"};
}

// Flattens nested arrays and objects into a long chain: deep-nesting inputs.
std::string deep(const std::string& open, const std::string& close, std::size_t depth) {
  std::string s;
  for (std::size_t i = 0; i < depth; ++i) s += open;
  for (std::size_t i = 0; i < depth; ++i) s += close;
  return s;
}

}  // namespace

TEST_CASE("fuzz: shape specs parse or throw normjit::Error; accepted specs round-trip") {
  Guard guard("shape-spec");
  Stats st;
  Mutator m(base_seed() ^ 1, shape_seeds(), shape_tokens());
  const auto check = [&](const std::string& text) {
    const NormDesc d = parse_shape_spec(text).desc;
    m.keep(text);
    // Properties of an accepted spec: shape_spec gives a spec of the same
    // variant, N and M that parses again to the same spec and shape key; the
    // heuristic's forward config is valid. An Error here is a failure.
    std::string canon;
    try {
      canon = shape_spec(d);
      const NormDesc again = parse_shape_spec(canon).desc;
      if (shape_spec(again) != canon)
        st.fail(fmt::format("shape_spec round trip: '{}' -> '{}'", canon, shape_spec(again)), text);
      if (shape_key(Op::Forward, again) != shape_key(Op::Forward, d))
        st.fail(fmt::format("the shape key changed in the round trip: {} -> {}", shape_key(Op::Forward, d),
                            shape_key(Op::Forward, again)),
                text);
      const LaunchConfig h = heuristic_config(Op::Forward, d, normjit_test::test_facts(kMaxCluster));
      std::string why;
      if (!config_valid(Op::Forward, d, h, &why, kMaxCluster))
        st.fail(fmt::format("the heuristic config {} is not valid: {}", h.str(), why), text);
      make_spec(Op::Forward, d, h).name();
    } catch (const Error& e) {
      st.fail(fmt::format("an accepted spec (shape_spec '{}') fails later: {}", canon, e.what()), text);
    }
    try {  // the backward may be refused (e.g. norstd), with an Error
      shape_key(Op::Backward, d);
      heuristic_config(Op::Backward, d, normjit_test::test_facts(kMaxCluster));
    } catch (const Error&) {
    }
  };
  const auto clear = [](const Error& e) { return contains(e.message(), "--shape"); };
  // Fixed inputs first: the seeds, long and odd ones.
  std::vector<std::string> fixed = shape_seeds();
  for (const char* s : {"", ":", "rms", "rms:bf16", "rms:bf16:x", "rms:bf16:1x", "rms:bf16:x1", "rms:bf16:1x1:",
                        "rms:bf16:1x1:=", "rms:bf16:1x1:heads", "rms:bf16:1x1:off=", "rms:bf16:1x1:quant=",
                        "rms:bf16:99999999999999999999x1", "rms:bf16:1x99999999999999999999", "rms:bf16:-1x1"})
    fixed.push_back(s);
  {
    std::string many = "rms:bf16:8x4096";
    for (int i = 0; i < 5000; ++i) many += ":nw";
    fixed.push_back(many);
  }
  fixed.push_back("rms:bf16:8x" + std::string(100000, '9'));
  fixed.push_back("rms:" + std::string(100000, 'b') + ":8x8");
  fixed.push_back("rms:bf16:8x8:eps=" + std::string(50000, '1'));
  std::size_t fi = 0;
  run_for(total_seconds() * 0.25, fixed.size(), st, [&] {
    const std::string in = fi < fixed.size() ? fixed[fi++] : m.next();
    run_one(guard, st, in, check, clear);
    return true;
  });
  st.report("shape-spec");
}

TEST_CASE("fuzz: model configs give shapes or throw normjit::Error naming the file") {
  Guard guard("model-config");
  Stats st;
  std::vector<std::string> seeds = model_seeds();
  Mutator m(base_seed() ^ 2, seeds, json_tokens());
  const auto dir = make_temp_dir("fuzz-model");
  const std::string path = (*dir / "config.json").string();
  const std::vector<std::vector<std::int64_t>> token_sets = {
      {1, 1024, 8192}, {1}, {7}, {0}, {-5}, {INT64_MAX}, {3, std::int64_t{1} << 40}, {}};
  std::vector<std::int64_t> tokens = token_sets[0];
  const auto check = [&](const std::string& text) {
    normjit_test::write_text_file(path, text);
    const auto shapes = shapes_from_model_config(path, tokens);
    m.keep(text);
    for (const auto& s : shapes) {
      if (s.name.empty()) st.fail("a shape without a name", text);
      try {
        s.desc.validate();
        const std::string canon = shape_spec(s.desc);
        if (shape_spec(parse_shape_spec(canon).desc) != canon) st.fail("a model shape's spec does not round-trip", text);
      } catch (const Error& e) {
        st.fail(fmt::format("an accepted model shape {} is not valid: {}", s.name, e.what()), text);
      }
    }
  };
  const auto clear = [&](const Error& e) { return contains(e.message(), path) || contains(e.message(), "--tokens"); };
  std::vector<std::string> fixed = seeds;
  for (const char* s : {"", "null", "[]", "{}", "[1]", "\"x\"", "{\"hidden_size\": 4096, \"torch_dtype\": 5}",
                        "{\"hidden_size\": 4096, \"rms_norm_eps\": \"x\"}", "{\"hidden_size\": 4096, \"model_type\": 7}",
                        "{\"model_type\": \"qwen3\", \"hidden_size\": 4096, \"num_attention_heads\": 0}",
                        "{\"model_type\": \"qwen3\", \"hidden_size\": 4096, \"num_attention_heads\": 4294967296, "
                        "\"head_dim\": 128}",
                        "{\"hidden_size\": 4096, \"quantization_config\": {\"quant_method\": 1}}",
                        "{\"hidden_size\": 4096, \"quantization_config\": {\"quant_method\": \"fp8\", "
                        "\"weight_block_size\": [128, 4294967424]}}"})
    fixed.push_back(s);
  fixed.push_back(deep("[", "]", 100000));
  fixed.push_back(deep("{\"a\":", "}", 100000));
  std::size_t fi = 0;
  run_for(total_seconds() * 0.20, fixed.size(), st, [&] {
    tokens = fi < fixed.size() ? token_sets[0] : token_sets[m.below(token_sets.size())];
    const std::string in = fi < fixed.size() ? fixed[fi++] : (m.chance(60) ? mutate_json_text(m) : m.next());
    const bool bad_tokens = tokens.empty() ? false : *std::min_element(tokens.begin(), tokens.end()) < 1;
    const Outcome o = run_one(guard, st, in, check, clear);
    if (bad_tokens && o == Outcome::Accepted) st.fail("token counts < 1 were accepted", in);
    return true;
  });
  st.report("model-config");
}

namespace {

// A small tuned-cache file whose entries are current (their kernels' hashes
// match): the heuristic's config as winner, a few grid configs as candidates.
std::string current_cache_text(const DeviceFingerprint& dev, const CacheMetadata& md, const fs::path& dir) {
  std::map<std::string, TunedEntry> entries;
  const char* specs[] = {"rms:bf16:1024x4096", "rms:bf16:8192x4096", "ln:fp16:64x768", "rms:bf16:8x128:res",
                         "rms:bf16:256x7168:quant=e4m3/group128:colmajor", "rms:fp32:1x262144"};
  for (const char* spec : specs)
    for (Op op : {Op::Forward, Op::Backward}) {
      if (op == Op::Backward && contains(spec, "quant")) continue;
      const NormDesc d = parse_shape_spec(spec).desc;
      TunedEntry e;
      e.shape = shape_spec(d);
      e.winner = heuristic_config(op, d, normjit_test::test_facts(kMaxCluster));
      e.kernel_hash = tuned_kernel_hash(op, d, e.winner);
      e.winner_us = 10.5;
      e.tuned_at = "2026-11-21T06:00:00Z";
      const auto grid = candidate_grid(op, d, kMaxCluster);
      for (std::size_t i = 0; i < grid.size() && i < 4; ++i) e.candidates.push_back({grid[i], 11.0 + i, ""});
      e.candidates.push_back({grid.back(), -1, "mismatch \xff (invalid UTF-8 in a log)"});
      entries[shape_key(op, d)] = e;
    }
  const fs::path file = dir / "seed.json";
  merge_into_tuned_cache_file(file.string(), dev, md, entries);
  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first `n` entries of a shipped cache file, as a file of their own.
std::string shipped_slice(const std::string& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  json j = json::parse(in);
  json entries = json::object();
  for (auto it = j["entries"].begin(); it != j["entries"].end() && entries.size() < n; ++it) entries[it.key()] = it.value();
  j["entries"] = entries;
  return j.dump(1);
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sends fd 2 to /dev/null while alive (merges warn on stderr about every
// damaged file they replace: thousands of lines here).
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    if (saved_ >= 0) g_report_fd = saved_;
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 2);
      ::close(null);
    }
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      g_report_fd = 2;
      ::close(saved_);
    }
  }

 private:
  int saved_ = -1;
};

}  // namespace

TEST_CASE("fuzz: damaged tuned-cache files are skipped or healed, never crash, and nothing is written elsewhere") {
  const DeviceFingerprint dev{"NVIDIA H100 80GB HBM3", 9, 0, 132, 50 * 1024 * 1024};
  const CacheMetadata md{NORMJIT_VERSION_STRING, "0123456789abcdef0123456789abcdef", "13.0", 13000};
  const auto root = make_temp_dir("fuzz-tuned");
  const fs::path user = *root / "user" / "tuned", shipped = *root / "shipped", work = *root / "work";
  fs::create_directories(work);
  const std::string current = current_cache_text(dev, md, work);
  std::vector<std::string> seeds = {current};
  if (auto slice = shipped_slice(std::string(NORMJIT_SHIPPED_CACHE_DIR) + "/" + dev.slug() + ".json", 12); !slice.empty())
    seeds.push_back(slice);
  const json current_doc = json::parse(current);
  std::vector<std::string> keys;
  for (auto it = current_doc["entries"].begin(); it != current_doc["entries"].end(); ++it) keys.push_back(it.key());
  REQUIRE(!keys.empty());
  const std::string store_key = keys.front();
  const auto parsed = read_tuned_cache_file((work / "seed.json").string(), default_warn);
  REQUIRE(parsed);
  REQUIRE(parsed->entries.size() == keys.size());
  const TunedEntry store_entry = parsed->entries.at(store_key);
  fs::remove_all(work);

  Guard guard("tuned-cache");
  Stats st;
  Mutator m(base_seed() ^ 3, seeds, json_tokens());
  std::vector<std::string> warnings;
  const std::string user_file = (user / (dev.slug() + ".json")).string();
  const std::string other_slug = "nvidia-a100-sxm4-80gb.cc80.108sm.40mib";
  std::size_t n = 0, healed = 0, stores = 0;
  const auto check = [&](const std::string& text) {
    // Where the damaged text goes: the user file, the shipped file of this
    // device, or another device's shipped file (read by the neighbour
    // search), with a valid file beside it sometimes.
    fs::remove_all(user);
    fs::remove_all(shipped);
    fs::create_directories(user);
    fs::create_directories(shipped);
    const std::size_t where = n % 3;
    const bool with_valid = n % 4 == 3;
    std::map<fs::path, std::string> shipped_files;
    if (where == 0) normjit_test::write_text_file(user_file, text);
    if (where == 1) shipped_files[shipped / (dev.slug() + ".json")] = text;
    if (where == 2) shipped_files[shipped / (other_slug + ".json")] = text;
    if (with_valid) {
      if (where == 0) shipped_files[shipped / (dev.slug() + ".json")] = current;
      else normjit_test::write_text_file(user_file, current);
    }
    for (const auto& [p, t] : shipped_files) normjit_test::write_text_file(p, t);
    warnings.clear();
    TunedCache cache(user.string(), {shipped.string()}, dev, md, [&](const std::string& w) { warnings.push_back(w); });
    // Lookups and the explanation never throw.
    std::vector<std::string> probe = {keys[n % keys.size()], "rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=5000:M<=512",
                                      m.mutate(keys[(n / 3) % keys.size()])};
    try {
      const json doc = json::parse(text);
      if (doc.is_object() && doc.contains("entries") && doc["entries"].is_object() && !doc["entries"].empty())
        probe.push_back(doc["entries"].begin().key());
    } catch (const std::exception&) {
    }
    for (const auto& k : probe) {
      cache.lookup(k);
    }
    const NormDesc d = parse_shape_spec("rms:bf16:1024x4096").desc;
    for (TunePolicy p : {TunePolicy::Never, TunePolicy::OnFirstUse})
      for (bool skip : {false, true}) config_from_caches(cache, Op::Forward, d, normjit_test::test_facts(), p, skip);
    list_tuned_cache_files(shipped.string(), [&](const std::string& w) { warnings.push_back(w); });
    // A store heals a damaged user file: afterwards it parses and holds the entry.
    if (n % 4 == 0) {
      ++stores;
      cache.store(store_key, store_entry);
      const auto f = read_tuned_cache_file(user_file, [&](const std::string& w) { warnings.push_back(w); });
      if (!f || !f->entries.count(store_key)) st.fail("a store did not leave a readable user file with its entry", text);
      else if (where == 0) ++healed;
    }
    // Warnings name the file they are about.
    for (const auto& w : warnings)
      if (!contains(w, root->string())) st.fail(fmt::format("a warning that names no file: {}", w), text);
    // Nothing but the user file (and its lock) was written; shipped files are untouched.
    std::set<std::string> allowed = {user_file, user_file + ".lock"};
    for (const auto& [p, t] : shipped_files) {
      allowed.insert(p.string());
      if (read_all(p) != t) st.fail(fmt::format("the shipped file {} changed", p.string()), text);
    }
    for (const auto& e : fs::recursive_directory_iterator(*root))
      if (e.is_regular_file() && !allowed.count(e.path().string()))
        st.fail(fmt::format("an unexpected file was written: {}", e.path().string()), text);
    ++n;
    m.keep(text);
  };
  // Any exception at all is a failure here (a bad file is skipped, not an error).
  const auto never = [](const Error&) { return false; };
  std::vector<std::string> fixed = seeds;
  for (const char* s : {"", "{", "null", "[]", "{}", "{\"schema_version\": 2}", "\xef\xbb\xbf{}"}) fixed.push_back(s);
  fixed.push_back(deep("[", "]", 100000));
  fixed.push_back(current.substr(0, current.size() / 2));
  std::size_t fi = 0;
  {
    QuietStderr quiet;
    run_for(total_seconds() * 0.30, fixed.size(), st, [&] {
      const std::string in = fi < fixed.size() ? fixed[fi++] : (m.chance(70) ? mutate_json_text(m) : m.next());
      run_one(guard, st, in, check, never);
      return true;
    });
  }
  MESSAGE(fmt::format("tuned-cache: {} stores, {} of them over a damaged user file", stores, healed));
  CHECK(stores > 0);
  st.report("tuned-cache");
}

TEST_CASE("fuzz: damaged cubins in the kernel cache are detected and recompiled, never crash") {
  const KernelSpec spec = make_spec(Op::Forward, make_desc(64, 128), LaunchConfig::parse("v8.t16.r2"));
  const auto dir = make_temp_dir("fuzz-cubin");
  const std::string kdir = (*dir / "kernels").string(), arch = "sm_90";
  KernelBinary first;
  try {
    first = compile_spec(spec, arch, kdir);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::LibraryNotFound) throw;
    MESSAGE("skipped: NVRTC is not available: " << e.message());
    return;
  }
  const std::string original = first.cubin, kernel = spec.kernel_name();
  const fs::path file = fs::path(kdir) / (first.cache_key + ".cubin");
  REQUIRE(cubin_problem(original, kernel).empty());
  REQUIRE(fs::exists(file));

  // Offsets worth hitting: the ELF header and the header tables.
  std::vector<std::size_t> hot;
  for (std::size_t i = 0; i < 64; ++i) hot.push_back(i);
  const auto u64 = [&](std::size_t at) {
    std::uint64_t v = 0;
    std::memcpy(&v, original.data() + at, 8);
    return v;
  };
  const auto u16 = [&](std::size_t at) {
    std::uint16_t v = 0;
    std::memcpy(&v, original.data() + at, 2);
    return v;
  };
  for (std::uint64_t i = u64(0x28); i < u64(0x28) + std::uint64_t{u16(0x3c)} * u16(0x3a) && i < original.size(); ++i)
    hot.push_back(i);
  for (std::uint64_t i = u64(0x20); i < u64(0x20) + std::uint64_t{u16(0x38)} * u16(0x36) && i < original.size(); ++i)
    hot.push_back(i);

  Guard guard("cubin");
  Stats st;
  Mutator m(base_seed() ^ 4, {original}, {std::string(8, '\xff'), std::string(8, '\0'), "\x7f" "ELF", "\x02\x01\x01",
                                          std::string("\xbe\x00", 2), std::string("\x00\x00\x00\x80", 4)});
  const auto cubin_mutant = [&] {
    std::string s = original;
    if (m.chance(60)) {  // overwrite header-table bytes with random or extreme values
      const int k = 1 + static_cast<int>(m.below(4));
      for (int i = 0; i < k; ++i) {
        const std::size_t at = hot[m.below(hot.size())];
        s[at] = m.chance(50) ? static_cast<char>(m.below(256)) : (m.chance(50) ? '\xff' : '\0');
      }
      if (m.chance(30)) s = m.mutate(s);
      return s;
    }
    return m.mutate(s);
  };
  // 1. The checks alone, on many mutants: accepted or a named problem.
  std::size_t detected = 0;
  run_for(total_seconds() * 0.25 * 0.6, 200, st, [&] {
    const std::string in = cubin_mutant();
    run_one(
        guard, st, in,
        [&](const std::string& c) {
          const std::string why = cubin_problem(c, kernel);
          if (!why.empty()) {
            ++detected;
            throw Error(ErrorKind::InvalidArgument, "cubin: " + why);  // counted as rejected
          }
          machine_code_fingerprint(c, kernel);  // accepted: its fingerprint exists
        },
        [](const Error& e) { return contains(e.message(), "cubin"); });
    return true;
  });
  // 2. The cache reader on a damaged file: it loads the file only when the
  // check accepts it, else recompiles (a handful, NVRTC is slow) and replaces it.
  std::size_t recompiled = 0, served = 0;
  const std::vector<std::string> damaged = {original.substr(0, original.size() / 2), original.substr(0, 64),
                                            std::string(original).replace(0x28, 8, std::string(8, '\xff')),
                                            std::string(original).replace(0x12, 2, std::string(2, '\0'))};
  std::size_t di = 0;
  run_for(total_seconds() * 0.25 * 0.4, damaged.size(), st, [&] {
    std::string in;
    if (di < damaged.size()) {
      in = damaged[di++];
    } else {
      in = cubin_mutant();
      if (!cubin_problem(in, kernel).empty() && recompiled >= damaged.size() + 2) return true;  // enough compiles
    }
    const bool ok = cubin_problem(in, kernel).empty();
    run_one(
        guard, st, in,
        [&](const std::string& c) {
          normjit_test::write_text_file(file, c);
          const KernelBinary b = compile_spec(spec, arch, kdir);
          if (b.from_disk) {
            ++served;
            if (!ok) st.fail("a cubin the check rejects was served from the disk cache", c);
            if (b.cubin != c) st.fail("the disk cache served other bytes than the file's", c);
          } else {
            ++recompiled;
            if (ok) st.fail("a cubin the check accepts was recompiled", c);
            if (!cubin_problem(b.cubin, kernel).empty()) st.fail("the recompiled cubin fails the check", c);
            if (read_all(file) != b.cubin) st.fail("the damaged file was not replaced by the recompiled cubin", c);
          }
        },
        [](const Error&) { return false; });
    return true;
  });
  MESSAGE(fmt::format("cubin: {} mutants detected by the check (rejected); the reader: {} recompiled, {} served from "
                      "disk (damage inside the machine code passes the check: no checksum is stored)",
                      detected, recompiled, served));
  CHECK(recompiled >= damaged.size());
  st.report("cubin");
}

TEST_CASE("fuzz: the cubin check accepts every kind of kernel, so valid cubins are served from the disk cache") {
  // The other side of the check above: a stricter check must not make the
  // cache recompile good files (forward, backward, finalize, cluster, FP8).
  const NormDesc plain = make_desc(256, 4096), wide = make_desc(1, 65536);
  const NormDesc fp8 = parse_shape_spec("rms:bf16:64x7168:quant=e4m3/group128:colmajor").desc;
  LaunchConfig cluster;
  for (const auto& c : candidate_grid(Op::Forward, wide, kMaxCluster))
    if (c.cluster > 1) {
      cluster = c;
      break;
    }
  REQUIRE(cluster.cluster > 1);
  const std::vector<KernelSpec> specs = {
      make_spec(Op::Forward, plain, heuristic_config(Op::Forward, plain, normjit_test::test_facts(kMaxCluster))),
      make_spec(Op::Backward, plain, heuristic_config(Op::Backward, plain, normjit_test::test_facts(kMaxCluster))),
      finalize_spec(plain),
      make_spec(Op::Forward, wide, cluster),
      make_spec(Op::Forward, fp8, heuristic_config(Op::Forward, fp8, normjit_test::test_facts(kMaxCluster))),
  };
  const auto dir = make_temp_dir("fuzz-cubin-kinds");
  const std::string kdir = (*dir / "kernels").string();
  std::vector<std::string> problems(specs.size());
  try {
    parallel_for(static_cast<int>(specs.size()), [&](int i) {
      const KernelBinary first = compile_spec(specs[i], "sm_90", kdir);
      const KernelBinary again = compile_spec(specs[i], "sm_90", kdir);
      const std::string why = cubin_problem(first.cubin, specs[i].kernel_name());
      if (!why.empty() || !again.from_disk)
        problems[i] = fmt::format("{}: {} (served from disk: {})", specs[i].name(), why, again.from_disk);
    });
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::LibraryNotFound) throw;
    MESSAGE("skipped: NVRTC is not available: " << e.message());
    return;
  }
  for (const auto& p : problems) CHECK_MESSAGE(p.empty(), p);
}
