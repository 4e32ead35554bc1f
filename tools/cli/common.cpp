// The normjit CLI's shared helpers: the --model/--shape options, their shapes and the GPU check.
#include <algorithm>

#include <fmt/format.h>

#include "device/driver.hpp"
#include "cli/cli.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace normjit::cli {

namespace {

std::vector<Op> ops_of(const std::string& op) {
  if (op == "fwd") return {Op::Forward};
  if (op == "bwd") return {Op::Backward};
  return {Op::Forward, Op::Backward};
}

}  // namespace

void add_shape_options(CLI::App* app, ShapeOptions& o) {
  auto* model = app->add_option("--model", o.model, "Hugging Face config.json: every norm its forward and backward call (hidden, fused residual add, QK-norm, MLA, FP8; see tune --list)")
                    ->check(CLI::ExistingFile);
  app->add_option("--shape", o.shapes,
                  "A shape, <rms|ln>:<dtype>:<M>x<N>[:<option>]..., e.g. rms:bf16:8192x4096, ln:fp16:4096x4096, "
                  "rms:bf16:8192x4096:res (fused residual add), rms:bf16:32768x128:heads=32:x_stride=6144 (QK-norm on "
                  "a QKV view); options w= y= res[=] fp32sum dres nw nb off= cast= eps= heads= x_stride= (repeatable)");
  app->add_option("--tokens", o.tokens, "Token counts for --model, e.g. 1,1024,8192 (the default)")->delimiter(',')->needs(model);
  app->add_option("--op", o.op, "Which kernels")->check(CLI::IsMember({"fwd", "bwd", "both"}));
}

Resolved resolve_shapes(const ShapeOptions& o) {
  Resolved r;
  const auto wanted = ops_of(o.op);
  if (!o.model.empty()) {
    r.model = model_norms(o.model, o.tokens);
    for (const auto& n : r.model->norms) {
      std::vector<Op> ops;
      for (Op op : n.ops)
        if (std::find(wanted.begin(), wanted.end(), op) != wanted.end()) ops.push_back(op);
      if (!ops.empty()) r.work.push_back({n.shape, ops, &n});
    }
  }
  for (const auto& s : o.shapes) r.work.push_back({parse_shape_spec(s), wanted, nullptr});
  if (r.work.empty()) {
    if (!o.model.empty()) throw CLI::ValidationError("--op", fmt::format("--model '{}' calls no {} norm", o.model, o.op));
    throw CLI::ValidationError("--model or --shape", "give at least one --model or --shape");
  }
  return r;
}

// Tuning and benchmarks need a GPU: say plainly what is missing.
bool require_gpu(const char* what) {
  std::string why;
  if (gpu_available(&why)) return true;
  fmt::print(stderr, "normjit: {} needs an NVIDIA GPU, and none can be used here: {}\n", what, why);
  return false;
}

// Fastest first; rejected candidates (no time) last, in their order.
void sort_by_time(std::vector<CandidateTiming>& c) {
  std::stable_sort(c.begin(), c.end(), [](const CandidateTiming& a, const CandidateTiming& b) {
    return (a.median_us > 0 ? a.median_us : 1e30) < (b.median_us > 0 ? b.median_us : 1e30);
  });
}

}  // namespace normjit::cli
