// The tuner's decision rule, without a GPU: the fastest wins unless a
// simpler candidate (earlier in grid order) is within 2%.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "tuning/autotune.hpp"
#include "device/kernel_clock.hpp"

using namespace normjit;
using normjit::detail::pick_winner;

namespace {
CandidateTiming timed(double us) { return {LaunchConfig{}, us, {}}; }
CandidateTiming rejected() { return {LaunchConfig{}, -1, "mismatch"}; }
}  // namespace

TEST_CASE("pick_winner: fastest, ties within 2% to the simpler, rejected never") {
  CHECK(pick_winner({timed(10.0), timed(9.0), timed(9.5)}) == 1);
  CHECK(pick_winner({timed(10.0), timed(9.9), timed(9.85)}) == 0);   // 10.0 <= 9.85 * 1.02
  CHECK(pick_winner({timed(10.1), timed(9.85), timed(9.9)}) == 1);   // 10.1 > 9.85 * 1.02 = 10.047
  CHECK(pick_winner({rejected(), timed(5.0)}) == 1);
  CHECK(pick_winner({rejected(), rejected()}) == -1);
  CHECK(pick_winner({}) == -1);
  // Same times in any run give the same answer.
  const std::vector<CandidateTiming> c = {timed(3.0), timed(2.95), timed(2.0)};
  CHECK(pick_winner(c) == pick_winner(c));
  CHECK(pick_winner(c) == 2);
}

TEST_CASE("a library process leaves CUPTI to its profilers unless asked") {
  // This process never called prefer_cupti (the CLI does): unless the
  // environment asks for CUPTI, timing uses events and registers nothing.
  const char* t = std::getenv("NORMJIT_TIMER");
  if (t && std::string(t) == "cupti") return;
  CHECK(normjit::detail::KernelClock::get() == nullptr);
  CHECK(normjit::detail::timing_method().rfind("events (", 0) == 0);
}
