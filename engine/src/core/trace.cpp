#include "core/trace.hpp"

#include "core/atomic_file.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace normjit::detail::trace {

namespace {
using Clock = std::chrono::steady_clock;

struct Tracer {
  std::mutex mu;
  std::string path;
  std::vector<nlohmann::json> events;
  std::atomic<bool> on{false};
  const Clock::time_point t0 = Clock::now();

  Tracer() {
    if (const char* p = std::getenv("NORMJIT_TRACE"); p && *p) {
      path = p;
      on = true;
    }
  }
  // At exit: what was recorded reaches the file.
  ~Tracer() { write(); }

  std::string write() {
    std::lock_guard<std::mutex> lk(mu);
    if (path.empty()) return "";
    nlohmann::json doc;
    doc["traceEvents"] = events;
    doc["displayTimeUnit"] = "ms";
    doc["otherData"] = {{"producer", "normjit"}};
    if (write_file_atomically(path, doc.dump())) return "";
    return path;
  }

  void add(nlohmann::json e) {
    e["pid"] = static_cast<long long>(::getpid());
    e["tid"] = static_cast<unsigned long long>(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000);
    std::lock_guard<std::mutex> lk(mu);
    events.push_back(std::move(e));
  }
};

Tracer& tracer() {
  static Tracer t;
  return t;
}
}  // namespace

bool enabled() { return tracer().on.load(std::memory_order_relaxed); }

void open(const std::string& path) {
  Tracer& t = tracer();
  {
    std::lock_guard<std::mutex> lk(t.mu);
    t.path = path;
  }
  t.on = !path.empty();
}

std::string flush() { return tracer().write(); }

double now_us() { return std::chrono::duration<double, std::micro>(Clock::now() - tracer().t0).count(); }

void complete(const char* cat, const std::string& name, double start_us, const std::map<std::string, std::string>& args) {
  if (!enabled()) return;
  tracer().add({{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", start_us}, {"dur", now_us() - start_us},
                {"args", args}});
}

void instant(const char* cat, const std::string& name, const std::map<std::string, std::string>& args) {
  if (!enabled()) return;
  tracer().add({{"name", name}, {"cat", cat}, {"ph", "i"}, {"s", "t"}, {"ts", now_us()}, {"args", args}});
}

}  // namespace normjit::detail::trace
