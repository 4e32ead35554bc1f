// The normjit CLI's shared declarations: shape options, shared helpers and the subcommands main() dispatches to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "models/model_norms.hpp"
#include "normjit/normjit.hpp"

namespace normjit::cli {

constexpr int kExitNoGpu = 3;

struct ShapeOptions {
  std::string model;
  std::vector<std::string> shapes;
  std::vector<std::int64_t> tokens = detail::default_token_counts();
  std::string op = "both";
};

void add_shape_options(CLI::App* app, ShapeOptions& o);

// A shape and the ops to run on it: --op's for a --shape; for a --model
// shape, those of --op that the model calls (hidden_res and hidden_fp8 are
// forward only).
struct Work {
  detail::NamedShape shape;
  std::vector<Op> ops;
  const detail::ModelNorm* norm = nullptr;  // the model's norm, for --model shapes
};

struct Resolved {
  std::optional<detail::ModelNorms> model;
  std::vector<Work> work;
};

Resolved resolve_shapes(const ShapeOptions& o);

bool require_gpu(const char* what);

void sort_by_time(std::vector<CandidateTiming>& c);

// The subcommands: each returns the exit code. tune.cpp and tune_grid.cpp.
// devices: tune --devices (empty: the current device only); workers: shapes
// tuned at once a device.
int cmd_tune(Engine& engine, const ShapeOptions& so, bool vs_untuned, const std::string& json_path, bool retune,
             bool list, bool whole_grid, const std::vector<int>& devices, int workers);
int cmd_tune_grid(Engine& engine, const std::string& grid_path, bool list, double max_seconds, int workers,
                  const std::vector<int>& devices);
// tune --devices: every ordinal names a device of this machine, once (else
// Error(InvalidArgument) naming it and the device count).
void check_devices(const std::vector<int>& devices);

// explain.cpp.
int cmd_explain(Engine& engine, const ShapeOptions& so, const std::string& device);
int cmd_compile(Engine& engine, const ShapeOptions& so, const std::string& arch);
// compile --dump: the kernel of `config` for each shape and op as source and
// cubin files in `dir`. Error(InvalidArgument) names a config the grid's
// rules (config_valid) exclude, and nothing is written.
int cmd_compile_dump(const ShapeOptions& so, const std::string& config, const std::string& arch,
                     const std::string& dir);

// bench.cpp.
int cmd_bench(Engine& engine, const ShapeOptions& so, const std::string& json_path, int reps, bool check);

// cache.cpp.
int cmd_cache_list(Engine& engine);
int cmd_cache_show(Engine& engine, std::string file);
int cmd_cache_clear(Engine& engine);
int cmd_cache_migrate(const std::string& old_dir, const std::string& arch, const std::vector<std::string>& files,
                      bool write);
int cmd_cache_prune(const std::vector<std::string>& files, bool write);

// doctor.cpp.
int cmd_doctor(Engine& engine);

}  // namespace normjit::cli
