// Fits the config model's constants (engine/src/config_model.cpp) to
// full-grid timings: every candidate of random shapes timed on a GPU, as
// `tools/heldout.py run` records them (rows with "all"). For each op, a
// random search over the constants minimises the mean log of (time of the
// model's pick / fastest time) over the shapes; a pick the row did not time
// (rejected there) counts 2. Prints the fit per op and GPU, and with
// --write replaces the fitted-params block of config_model.cpp.
//
// Two kinds of files: the positional ones were timed with every config
// launched as it is (before staged kernels existed): they fit the
// constants `v`, every config priced by them. --launched files were timed
// with each config launched as the engine launches it (staged where
// staged_for_launch stages it), kernel durations read with CUPTI: they fit
// the forward's one-wave constants, `v` held.
//
//   normjit_fit_model autotune_cache/model/*.json --launched autotune_cache/model/launched/*.json
//   normjit_fit_model --write engine/src/config_model.cpp --iters 3000 autotune_cache/model/*.json \
//     --launched autotune_cache/model/launched/*.json
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/config_model.hpp"
#include "core/shape_spec.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/atomic_file.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace {

struct Row {
  std::string gpu, shape;
  Op op;
  NormDesc desc;
  DeviceFacts dev;
  std::vector<LaunchConfig> grid;
  std::vector<double> ratio;  // per config of `grid` (the timed ones): its time / the fastest
  bool as_launched = false;   // timed as launches run each config (staged where they stage)
};

// The constants a row is priced with: rows timed unstaged price one-wave
// launches with `v` too, as their kernels ran (unstaged).
ModelParams params_for(const Row& r, const ModelParams& p) {
  if (r.as_launched) return p;
  ModelParams q = p;
  q.one_wave.reset();
  return q;
}

// The facts of a GPU by name: the tuned-cache file of that device (shipped).
DeviceFacts facts_by_name(const std::string& gpu, const std::string& shipped_dir) {
  for (const auto& f : list_tuned_cache_files(shipped_dir, [](const std::string&) {}))
    if (f.device.name == gpu) return f.device.facts();
  throw std::runtime_error(fmt::format("no tuned-cache file in {} for the GPU '{}'", shipped_dir, gpu));
}

std::vector<Row> load(const std::vector<std::string>& files, const std::string& shipped_dir, bool as_launched) {
  std::vector<Row> rows;
  int stale = 0;
  for (const auto& path : files) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    const nlohmann::json doc = nlohmann::json::parse(in);
    const std::string gpu = doc.at("gpu").get<std::string>();
    DeviceFacts dev = facts_by_name(gpu, shipped_dir);
    for (const auto& r : doc.at("rows")) {
      if (!r.contains("all") || r["all"].size() < 2) continue;
      Row row;
      row.gpu = gpu;
      row.as_launched = as_launched;
      row.shape = r.at("draw").at("shape").get<std::string>();
      row.op = r["draw"]["op"].get<std::string>() == "fwd" ? Op::Forward : Op::Backward;
      row.desc = parse_shape_spec(row.shape).desc;
      row.dev = dev;
      std::map<std::string, double> t;
      double best = 1e30;
      for (const auto& c : r["all"]) {
        t[c[0].get<std::string>()] = c[1].get<double>();
        best = std::min(best, c[1].get<double>());
      }
      // The model chooses among the grid's configs that were timed: configs
      // the grid gained later (a new kernel path) are no part of this row.
      std::set<int> timed_vecs, grid_vecs;
      for (const auto& c : candidate_grid(row.op, row.desc, dev.max_cluster)) {
        auto it = t.find(c.str());
        grid_vecs.insert(c.vec);
        if (it == t.end()) continue;
        timed_vecs.insert(c.vec);
        row.grid.push_back(c);
        row.ratio.push_back(it->second / best);
      }
      // Timed on another grid (odd rows peel since, with whole vectors): the
      // times no longer describe this grid.
      if (timed_vecs != grid_vecs) {
        ++stale;
        continue;
      }
      rows.push_back(std::move(row));
    }
  }
  if (stale) fmt::print("{} rows skipped: timed on a grid of other vector widths\n", stale);
  return rows;
}

double pick_ratio(const Row& r, const ModelParams& p) {
  return r.ratio[fastest_of(r.op, r.desc, r.grid, r.dev, params_for(r, p))];
}

double objective(const std::vector<const Row*>& rows, const ModelParams& p) {
  double s = 0;
  for (const Row* r : rows) s += std::log(pick_ratio(*r, p));
  return rows.empty() ? 0 : s / rows.size();
}

// Prints the fit per GPU; returns the largest geometric mean.
double report(const std::vector<const Row*>& rows, const ModelParams& p, const std::string& label, bool each) {
  std::map<std::string, std::vector<double>> by_gpu;
  for (const Row* r : rows) {
    const double x = pick_ratio(*r, p);
    by_gpu[r->gpu].push_back(x);
    if (each && x > 1.05)
      fmt::print("  {} {} {}: model {} {:.3f}\n", r->gpu, r->op == Op::Forward ? "fwd" : "bwd", r->shape,
                 r->grid[fastest_of(r->op, r->desc, r->grid, r->dev, params_for(*r, p))].str(), x);
  }
  double worst = 0;
  for (auto& [gpu, v] : by_gpu) {
    std::sort(v.begin(), v.end());
    double lg = 0;
    for (double x : v) lg += std::log(x);
    worst = std::max(worst, std::exp(lg / v.size()));
    fmt::print("{} {}: {} shapes, model/fastest median {:.3f}, geomean {:.3f}, max {:.3f}, <= 1.02: {}, <= 1.05: {}\n",
               label, gpu, v.size(), v[v.size() / 2], std::exp(lg / v.size()), v.back(),
               std::count_if(v.begin(), v.end(), [](double x) { return x <= 1.02; }),
               std::count_if(v.begin(), v.end(), [](double x) { return x <= 1.05; }));
  }
  return worst;
}

// Coordinate descent over the constants (each scaled by a few factors, the
// best kept), then random perturbations of the best, for `iters` objective
// evaluations in all.
ModelParams fit(Op op, const std::vector<const Row*>& rows, ModelParams p, bool one_wave, int iters, unsigned seed) {
  if (one_wave && !p.one_wave) p.one_wave = p.v;  // the search starts from v
  auto arr = [&](ModelParams& m) -> std::array<double, ModelParams::kCount>& { return one_wave ? *m.one_wave : m.v; };
  std::mt19937 rng(seed);
  std::normal_distribution<double> step(0.0, 0.6);
  auto clamp = [&](int i, double x) {
    const std::string name = ModelParams::name(i);
    // Physical ranges: a streaming kernel draws most of DRAM's bandwidth
    // (a device copy reaches ~90% of 2 x clock x bus width); one SM alone
    // moves tens of bytes a clock.
    if (name == "bw_eff") return std::clamp(x, 0.6, 1.0);
    if (name == "sm_bw") return std::clamp(x, 16.0, 128.0);
    if (name == "tail" || name == "clpack" || name == "add") return std::clamp(x, 0.02, 1.0);
    if (name == "two_pass" && op == Op::Forward) return std::clamp(x, 0.02, 4.0);
    if (name == "reg0") return std::clamp(std::round(x), 16.0, 64.0);
    return std::clamp(x, 1e-2, 1e5);
  };
  double best = objective(rows, p);
  int evals = 0;
  while (evals < iters) {
    bool moved = false;
    for (int i = 0; i < ModelParams::kCount && evals < iters; ++i)
      for (double f : {0.25, 0.5, 0.8, 1.25, 2.0, 4.0}) {
        ModelParams q = p;
        arr(q)[i] = clamp(i, arr(q)[i] * f);
        if (arr(q)[i] == arr(p)[i]) continue;
        const double s = objective(rows, q);
        ++evals;
        if (s < best - 1e-12) {
          best = s;
          p = q;
          moved = true;
        }
      }
    if (!moved)  // a local optimum: try a random jump of several constants
      for (int t = 0; t < 40 && evals < iters; ++t) {
        ModelParams q = p;
        for (int i = 0; i < ModelParams::kCount; ++i)
          if (rng() % 3 == 0) arr(q)[i] = clamp(i, arr(q)[i] * std::exp(step(rng)));
        const double s = objective(rows, q);
        ++evals;
        if (s < best - 1e-12) {
          best = s;
          p = q;
          break;
        }
      }
  }
  return p;
}

std::string params_line(const char* var, const ModelParams& p, bool one_wave) {
  auto list = [](const std::array<double, ModelParams::kCount>& a) {
    std::string s = "{";
    for (int i = 0; i < ModelParams::kCount; ++i) s += fmt::format("{}{:.4g}", i ? ", " : "", a[i]);
    return s + "}";
  };
  return fmt::format("  static const ModelParams {}{{{}{}}};\n", var, list(p.v), one_wave && p.one_wave ? ", " + list(*p.one_wave) : ", std::nullopt");
}

std::string names_of(const std::array<double, ModelParams::kCount>& a) {
  std::string names;
  for (int i = 0; i < ModelParams::kCount; ++i) names += fmt::format("{}{}={:.4g}", i ? " " : "", ModelParams::name(i), a[i]);
  return names;
}

// The command line.
struct FitOptions {
  std::vector<std::string> files, launched_files;
  std::string write_path, shipped = NORMJIT_SHIPPED_CACHE_DIR;
  int iters = 0;
  unsigned seed = 1;
  bool each = false;
  bool one_wave_only = false;  // fit only the forward's one-wave constants (v held)
  double max_geomean = 0, max_geomean_launched = 0;
  std::vector<double> start_fwd, start_bwd, start_one_wave;
  std::vector<std::string> show;
  std::string dump;
};

void add_options(CLI::App& app, FitOptions& o) {
  app.add_option("--show", o.show, "Shapes (as in the files, e.g. rms:bf16:4096x65536) whose every candidate to print: "
                                   "predicted and measured time, fastest measured first");
  app.add_option("--dump", o.dump, "Write every row's candidates (measured / fastest, predicted ns, shape of the "
                                   "row slice) as JSON lines, for fitting outside this tool");
  app.add_option("files", o.files, "heldout.py run JSON files (rows with every candidate's time), timed unstaged")->check(CLI::ExistingFile);
  app.add_option("--launched", o.launched_files, "heldout.py run JSON files timed as launches run each config (staged where "
                                               "they stage): they fit the forward's one-wave constants")->check(CLI::ExistingFile);
  app.add_option("--iters", o.iters, "Random-search steps per op (0: only report the current constants)");
  app.add_option("--seed", o.seed, "Random seed of the search");
  app.add_option("--write", o.write_path, "Replace the fitted-params block of this config_model.cpp")->check(CLI::ExistingFile);
  app.add_option("--shipped", o.shipped, "Tuned-cache directory whose files give each GPU's facts");
  app.add_flag("--one-wave-only", o.one_wave_only,
               "Fit only the forward's one-wave constants on the --launched rows; v (both ops) is held");
  app.add_flag("--each", o.each, "List every shape the model misses by more than 5%");
  app.add_option("--max-geomean", o.max_geomean,
                 "Exit 1 when the model's geometric mean over the fastest, of an op on a GPU, exceeds this");
  app.add_option("--max-geomean-launched", o.max_geomean_launched,
                 "The same for the --launched rows (CUPTI kernel durations carry no launch time, so their ratios "
                 "run larger than event-timed ones)");
  app.add_option("--start-fwd", o.start_fwd, "Constants to start the forward's search from (ModelParams order)")->delimiter(',')->expected(ModelParams::kCount);
  app.add_option("--start-bwd", o.start_bwd, "Constants to start the backward's search from")->delimiter(',')->expected(ModelParams::kCount);
  app.add_option("--start-one-wave", o.start_one_wave, "Constants to start the forward's one-wave search from")->delimiter(',')->expected(ModelParams::kCount);
}

// Reports (and with --iters fits) each op's constants on its rows; true when
// a geometric mean exceeds its bound.
bool fit_and_report(const std::vector<Row>& rows, ModelParams (&fitted)[2], const FitOptions& o) {
  bool failed = false;
  for (Op op : {Op::Forward, Op::Backward}) {
    const char* label = op == Op::Forward ? "fwd" : "bwd";
    ModelParams& p = fitted[op == Op::Forward ? 0 : 1];
    // Every row fits v; as-launched rows the forward's one-wave constants.
    for (bool launched : {false, true}) {
      if (launched && op != Op::Forward) continue;
      std::vector<const Row*> sel;
      for (const auto& r : rows)
        if (r.op == op && (r.as_launched || !launched)) sel.push_back(&r);
      if (sel.empty()) continue;
      const std::string what = fmt::format("{}{}", label, launched ? " as launched" : " all rows");
      const double worst = report(sel, p, what + " (current)", o.each && o.iters == 0);
      const double bound = launched ? o.max_geomean_launched : o.max_geomean;
      if (bound > 0 && worst > bound) {
        fmt::print("{}: the model's geometric mean {:.3f} exceeds {}\n", what, worst, bound);
        failed = true;
      }
      if (o.iters > 0 && (launched || !o.one_wave_only)) {
        p = fit(op, sel, p, launched, o.iters, o.seed);
        report(sel, p, what + " (fitted)", o.each);
        fmt::print("{} constants: {}\n", what, names_of(launched ? *p.one_wave : p.v));
      }
    }
  }
  return failed;
}

// --show: every candidate of the named shapes, measured and predicted.
void show_candidates(const std::vector<Row>& rows, const ModelParams (&fitted)[2], const std::vector<std::string>& show) {
  for (const auto& r : rows) {
    if (std::find(show.begin(), show.end(), r.shape) == show.end()) continue;
    const ModelParams& p = fitted[r.op == Op::Forward ? 0 : 1];
    const std::size_t pick = fastest_of(r.op, r.desc, r.grid, r.dev, params_for(r, p));
    std::vector<std::size_t> order(r.grid.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return r.ratio[a] < r.ratio[b]; });
    fmt::print("{} {} {}: measured/fastest, predicted us (* the model's pick)\n", r.gpu,
               r.op == Op::Forward ? "fwd" : "bwd", r.shape);
    for (std::size_t i : order)
      fmt::print("  {:1}{:22} {:6.3f} {:9.2f}\n", i == pick ? "*" : "", r.grid[i].str(), r.ratio[i],
                 predicted_ns(r.op, r.desc, r.grid[i], r.dev, params_for(r, p)) / 1000);
  }
}

// --dump: one JSON line a row, every timed candidate with its measured
// ratio, the model's predicted time and the terms of its row slice, and the
// model's pick (its rules applied).
void dump_rows(const std::vector<Row>& rows, const ModelParams (&fitted)[2], const std::string& path) {
  std::string text;
  for (const auto& r : rows) {
    const ModelParams p = params_for(r, fitted[r.op == Op::Forward ? 0 : 1]);
    nlohmann::json c = nlohmann::json::array();
    for (std::size_t i = 0; i < r.grid.size(); ++i) {
      const LaunchConfig& g = r.grid[i];
      const bool peel = peeled(r.op, r.desc, g.vec);
      const std::int64_t slice = slice_columns(row_span(r.op, r.desc, g), g);
      c.push_back({{"cfg", g.str()},
                   {"ratio", r.ratio[i]},
                   {"pred_ns", predicted_ns(r.op, r.desc, g, r.dev, p)},
                   {"peel", peel},
                   {"k", (slice / g.vec + g.threads_per_row - 1) / g.threads_per_row},
                   {"launched", (r.op == Op::Forward ? staged_for_launch(r.op, r.desc, g, r.dev) : g).str()}});
    }
    const std::size_t pick = fastest_of(r.op, r.desc, r.grid, r.dev, p);
    text += nlohmann::json{{"gpu", r.gpu},
                           {"shape", r.shape},
                           {"op", r.op == Op::Forward ? "fwd" : "bwd"},
                           {"as_launched", r.as_launched},
                           {"sms", r.dev.sm_count},
                           {"pick", r.grid[pick].str()},
                           {"cands", c}}
                .dump() +
            "\n";
  }
  if (auto why = write_file_atomically(path, text)) throw std::runtime_error("cannot write " + path + ": " + *why);
}

// --write: the fitted-params block of config_model.cpp replaced (atomically).
void write_params(const std::string& path, const ModelParams (&fitted)[2]) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  const std::string begin = "// fitted-params:begin\n", end = "  // fitted-params:end";
  const auto a = s.find(begin), b = s.find(end);
  if (a == std::string::npos || b == std::string::npos || b < a)
    throw std::runtime_error(path + " has no fitted-params block");
  s = s.substr(0, a + begin.size()) + params_line("fwd", fitted[0], true) + params_line("bwd", fitted[1], false) + s.substr(b);
  if (auto why = write_file_atomically(path, s)) throw std::runtime_error("cannot write " + path + ": " + *why);
  fmt::print("wrote the fitted constants into {}\n", path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fit the config model's constants to full-grid timings (tools/heldout.py run output)"};
  FitOptions o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<Row> rows = load(o.files, o.shipped, false);
    for (auto& r : load(o.launched_files, o.shipped, true)) rows.push_back(std::move(r));
    if (rows.empty()) throw std::runtime_error("no rows: give files, --launched files or both");
    ModelParams fitted[2] = {fitted_params(Op::Forward), fitted_params(Op::Backward)};
    for (int i = 0; i < ModelParams::kCount; ++i) {
      if (!o.start_fwd.empty()) fitted[0].v[i] = o.start_fwd[i];
      if (!o.start_bwd.empty()) fitted[1].v[i] = o.start_bwd[i];
      if (!o.start_one_wave.empty()) {
        if (!fitted[0].one_wave) fitted[0].one_wave.emplace();
        (*fitted[0].one_wave)[i] = o.start_one_wave[i];
      }
    }
    const bool failed = fit_and_report(rows, fitted, o);
    show_candidates(rows, fitted, o.show);
    if (!o.dump.empty()) dump_rows(rows, fitted, o.dump);
    if (!o.write_path.empty()) write_params(o.write_path, fitted);
    if (failed) return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "normjit_fit_model: {}\n", e.what());
    return 1;
  }
  return 0;
}
