// A Chrome trace (Trace Event Format, JSON) of where start-up time goes:
// NVRTC compiles and cubin-cache reads, module loads, config lookups (cache
// hit or miss, and where the config came from), tuning and its candidates,
// plan builds and launches. Off unless $NORMJIT_TRACE names a file (or
// trace::open() is called, e.g. by `normjit --trace FILE`); written
// atomically at process exit. Open it in chrome://tracing or Perfetto.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace normjit::detail::trace {

/// Whether events are recorded (one relaxed load: cheap on hot paths).
bool enabled();
/// Starts recording into `path` (replaces $NORMJIT_TRACE's file).
void open(const std::string& path);
/// Writes the events recorded so far (also done at exit). Returns the path, or "" when off.
std::string flush();

/// Microseconds since the trace clock's start.
double now_us();
/// A complete event ("ph": "X") of category `cat`, from `start_us` to now.
void complete(const char* cat, const std::string& name, double start_us,
              const std::map<std::string, std::string>& args = {});
/// An instant event ("ph": "i").
void instant(const char* cat, const std::string& name, const std::map<std::string, std::string>& args = {});

/// Records a complete event over its lifetime, when tracing is on.
class Span {
 public:
  Span(const char* cat, std::string name) : on_(enabled()), cat_(cat), name_(std::move(name)) {
    if (on_) start_ = now_us();
  }
  ~Span() {
    if (on_) complete(cat_, name_, start_, args);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  std::map<std::string, std::string> args;

 private:
  bool on_;
  const char* cat_;
  std::string name_;
  double start_ = 0;
};

}  // namespace normjit::detail::trace
