// Tuned entries go stale exactly when the kernel they describe changes: the
// source hash covers a spec's prelude and the templates it includes, nothing
// else. Also: shape specs round-trip a descriptor's variant.
#include <doctest/doctest.h>

#include <random>
#include <set>

#include "tuning/cache_migrate.hpp"
#include "config/config_grid.hpp"
#include "compile/cubin.hpp"
#include "compile/nvrtc.hpp"
#include "test_util.hpp"
#include "compile/kernel_sources.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"
#include "tuning/tuned_cache.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace {
KernelSpec spec_of(const char* shape, Op op) {
  const NormDesc d = parse_shape_spec(shape).desc;
  return make_spec(op, d, heuristic_config(op, d, normjit_test::test_facts(8)));
}

TunedEntry real_entry(const char* shape, Op op) {
  const NormDesc d = parse_shape_spec(shape).desc;
  TunedEntry e;
  e.shape = shape;
  e.winner = heuristic_config(op, d, normjit_test::test_facts(8));
  e.kernel_hash = tuned_kernel_hash(op, d, e.winner);
  e.winner_us = 1;
  return e;
}
}  // namespace

TEST_CASE("kernel hash: an edit reaches exactly the kernels that include the edited template") {
  const KernelSpec fwd = spec_of("rms:bf16:8192x4096", Op::Forward);
  const KernelSpec bwd = spec_of("rms:bf16:8192x4096", Op::Backward);
  const KernelSpec fin = finalize_spec(parse_shape_spec("rms:bf16:8192x4096").desc);
  SourceMap files = kernel_sources();
  REQUIRE(fwd.source_hash(files) == fwd.source_hash());
  REQUIRE(files.count("norm_bwd.cuh") == 1);
  REQUIRE(files.count("common.cuh") == 1);

  SUBCASE("editing the backward template: backward stale, forward and finalize still current") {
    files["norm_bwd.cuh"] += "\n// an edit\n";
    CHECK(bwd.source_hash(files) != bwd.source_hash());
    CHECK(fwd.source_hash(files) == fwd.source_hash());
    CHECK(fin.source_hash(files) == fin.source_hash());
  }
  SUBCASE("editing the forward template: forward stale only") {
    files["norm_fwd.cuh"] += "\n// an edit\n";
    CHECK(fwd.source_hash(files) != fwd.source_hash());
    CHECK(bwd.source_hash(files) == bwd.source_hash());
  }
  SUBCASE("a template every kernel includes: all stale") {
    files["common.cuh"] += "\n// an edit\n";
    CHECK(fwd.source_hash(files) != fwd.source_hash());
    CHECK(bwd.source_hash(files) != bwd.source_hash());
    CHECK(fin.source_hash(files) != fin.source_hash());
  }
  SUBCASE("adding a template (a new variant) leaves every hash alone") {
    files["norm_fp8.cuh"] = "#include \"common.cuh\"\n__global__ void k() {}\n";
    CHECK(fwd.source_hash(files) == fwd.source_hash());
    CHECK(bwd.source_hash(files) == bwd.source_hash());
  }
  SUBCASE("an include the template gains is followed") {
    files["extra.cuh"] = "// v1\n";
    files["norm_fwd.cuh"] = "#include \"extra.cuh\"\n" + files["norm_fwd.cuh"];
    const std::string with_v1 = fwd.source_hash(files);
    files["extra.cuh"] = "// v2\n";
    CHECK(fwd.source_hash(files) != with_v1);
    CHECK(bwd.source_hash(files) == bwd.source_hash());
  }
  SUBCASE("the FP8 templates: only the kernels that use them go stale") {
    const KernelSpec qfwd = spec_of("rms:bf16:8192x4096:quant=e4m3/group128", Op::Forward);
    const KernelSpec xbwd = spec_of("rms:bf16:8192x4096:x=e4m3/group16", Op::Backward);
    files["quant.cuh"] += "\n// an edit\n";
    CHECK(qfwd.source_hash(files) != qfwd.source_hash());
    CHECK(xbwd.source_hash(files) == xbwd.source_hash());
    CHECK(fwd.source_hash(files) == fwd.source_hash());
    files["fp8.cuh"] += "\n// an edit\n";
    CHECK(xbwd.source_hash(files) != xbwd.source_hash());
    CHECK(fwd.source_hash(files) == fwd.source_hash());
    CHECK(bwd.source_hash(files) == bwd.source_hash());
  }
  SUBCASE("the config is part of the hash") {
    KernelSpec other = fwd;
    other.cfg.threads_per_row *= 2;
    CHECK(other.source_hash() != fwd.source_hash());
  }
}

TEST_CASE("entry_staleness: current entries pass, changed kernels and inconsistent entries do not") {
  for (Op op : {Op::Forward, Op::Backward}) {
    for (const char* shape : {"rms:bf16:8192x4096", "ln:fp16:3x20000:res", "rms:fp32:77x100003:nw"}) {
      CAPTURE(shape);
      const TunedEntry e = real_entry(shape, op);
      const std::string key = shape_key(op, parse_shape_spec(shape).desc);
      CHECK(entry_staleness(key, e) == "");
      TunedEntry changed = e;
      changed.kernel_hash[0] = changed.kernel_hash[0] == '0' ? '1' : '0';
      CHECK(entry_staleness(key, changed).find("changed") != std::string::npos);
      TunedEntry moved = e;
      moved.shape = "rms:bf16:8192x4104";  // another N than its key
      CHECK(entry_staleness(key, moved) != "");
      TunedEntry garbage = e;
      garbage.shape = "not a shape";
      CHECK(entry_staleness(key, garbage) != "");
    }
  }
  CHECK(entry_staleness("nonsense", real_entry("rms:bf16:8x64", Op::Forward)) != "");
  // Any M of the bucket gives the same entry hash (64-bit offsets are not a new kernel).
  const NormDesc small = parse_shape_spec("rms:bf16:65536x4096").desc;
  NormDesc huge = small;
  huge.M = 1 << 20;
  const LaunchConfig c = heuristic_config(Op::Forward, small, normjit_test::test_facts(8));
  CHECK(make_spec(Op::Forward, huge, c).index64);
  CHECK(tuned_kernel_hash(Op::Forward, small, c) == tuned_kernel_hash(Op::Forward, huge, c));
}

TEST_CASE("shape_spec round-trips a descriptor's variant, N and M") {
  std::mt19937 rng(7);
  const DType dts[] = {DType::F32, DType::F16, DType::BF16};
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  for (int i = 0; i < 500; ++i) {
    NormDesc d;
    d.norm = pick(2) ? NormKind::LayerNorm : NormKind::RMSNorm;
    d.x_dtype = dts[pick(3)];
    d.y_dtype = dts[pick(3)];
    d.weight_dtype = dts[pick(3)];
    d.N = 1 + pick(262144);
    d.heads = pick(4) == 0 ? 1 + pick(8) : 1;
    d.M = d.heads * (1 + pick(1000));
    d.has_weight = pick(5) != 0;
    d.has_bias = d.norm == NormKind::LayerNorm && pick(2);
    d.weight_offset = d.has_weight && pick(4) == 0 ? 1.f : 0.f;
    d.residual = d.heads == 1 && pick(2);
    if (d.residual) {
      d.residual_dtype = dts[pick(3)];
      d.residual_out_dtype = dts[pick(3)];
      d.store_residual_out = pick(3) != 0;
      d.residual_rounding = pick(2) ? ResidualRounding::Fp32 : ResidualRounding::ResidualDtype;
    }
    d.has_dresidual = d.residual && pick(2);
    d.cast_mode = pick(3) == 0 ? CastMode::Llama : CastMode::Default;
    d.store_rstd = pick(4) != 0;
    d.store_mean = pick(4) != 0;
    try {
      d.validate();
    } catch (const Error&) {
      continue;  // a combination the engine refuses anyway
    }
    const std::string spec = shape_spec(d);
    CAPTURE(spec);
    const NormDesc back = parse_shape_spec(spec).desc;
    CHECK(back.M == d.M);
    for (Op op : {Op::Forward, Op::Backward}) CHECK(shape_key(op, back) == shape_key(op, d));
  }
}

TEST_CASE("shape_spec round-trips every FP8 variant") {
  for (const auto& v : normjit_test::fp8_variants(512, 4096, DType::BF16)) {
    CAPTURE(v.name);
    const std::string spec = shape_spec(v.desc);
    CAPTURE(spec);
    const NormDesc back = parse_shape_spec(spec).desc;
    CHECK(back.M == v.desc.M);
    for (Op op : {Op::Forward, Op::Backward}) CHECK(shape_key(op, back) == shape_key(op, v.desc));
    CHECK(back.scale_ub == v.desc.scale_ub);
  }
}

TEST_CASE("kernel hash: FP8 constants appear only in FP8 variants' preludes") {
  // Variants without FP8 compile the same sources as before FP8 existed, so
  // their tuned entries and cubins carry over.
  for (const char* plain : {"rms:bf16:8192x4096", "ln:fp16:4096x1000:res"})
    for (Op op : {Op::Forward, Op::Backward}) {
      const std::string src = spec_of(plain, op).source();
      CHECK(src.find("XGROUP") == std::string::npos);
      CHECK(src.find("QUANT") == std::string::npos);
      CHECK(src.find("#include \"common.cuh\"") != std::string::npos);
    }
  CHECK(spec_of("rms:bf16:8192x4096:quant=e4m3/token", Op::Forward).source().find("QUANT = 3") != std::string::npos);
  CHECK(spec_of("rms:bf16:8192x4096:x=e4m3/group16", Op::Backward).source().find("XGROUP = 16") != std::string::npos);
}

TEST_CASE("cache migrate: entries whose kernels compile to the same machine code are renewed, others stay stale") {
  const char* shape = "rms:bf16:4096x4096";
  const NormDesc d = parse_shape_spec(shape).desc;
  KernelSpec s = spec_of(shape, Op::Forward);
  // An edit that leaves the code alone (a comment) and one that changes it.
  SourceMap comment = kernel_sources(), code = kernel_sources();
  comment["norm_fwd.cuh"] += "\n// a comment\n";
  const std::size_t at = code["norm_fwd.cuh"].find("rsqrtf(");
  REQUIRE(at != std::string::npos);
  code["norm_fwd.cuh"].replace(at, 7, "1.f / sqrtf(");
  const std::string fp_now = machine_code_fingerprint(
      compile_cubin(s.source(), "a.cu", kernel_sources(), nvrtc_options(), s.kernel_name(), "sm_90").cubin, s.kernel_name());
  CHECK(machine_code_fingerprint(compile_cubin(s.source(), "b.cu", comment, nvrtc_options(), s.kernel_name(), "sm_90").cubin,
                                 s.kernel_name()) == fp_now);
  CHECK(machine_code_fingerprint(compile_cubin(s.source(), "c.cu", code, nvrtc_options(), s.kernel_name(), "sm_90").cubin,
                                 s.kernel_name()) != fp_now);
  CHECK_THROWS_AS(machine_code_fingerprint("not an elf", "k"), Error);

  const auto dir = normjit_test::make_temp_dir("migrate");
  const std::string path = (*dir / "cache.json").string();
  const DeviceFingerprint dev{"NVIDIA H100 80GB HBM3", 9, 0, 132, 50 * 1024 * 1024};
  const CacheMetadata md{"0.1.0", "old", "13.0", 13000};
  // Entries tuned "with" the edited sources: their hashes are those sources'.
  auto entry = [&](const SourceMap& files, std::int64_t M) {
    NormDesc dm = d;
    dm.M = M;
    TunedEntry e = real_entry(shape, Op::Forward);
    e.shape = shape_spec(dm);
    KernelSpec sm = make_spec(Op::Forward, dm, e.winner);
    sm.index64 = false;
    e.kernel_hash = sm.source_hash(files);
    return std::pair{shape_key(Op::Forward, dm), e};
  };
  const auto [k1, e1] = entry(comment, 4096);
  const auto [k2, e2] = entry(code, 1);
  const auto [k3, e3] = entry(kernel_sources(), 256);
  merge_into_tuned_cache_file(path, dev, md, {{k1, e1}, {k2, e2}, {k3, e3}});
  CHECK_FALSE(entry_staleness(k1, e1).empty());

  SUBCASE("from the comment edit: one renewed, one from other sources, one current") {
    const MigrationReport r = migrate_tuned_cache_file(path, comment, "sm_90", true, [](const std::string&) {});
    CHECK(r.entries == 3);
    CHECK(r.migrated == 1);
    CHECK(r.foreign == 1);
    CHECK(r.current == 1);
    const auto f = read_tuned_cache_file(path, [](const std::string&) {});
    REQUIRE(f);
    CHECK(entry_staleness(k1, f->entries.at(k1)).empty());
    CHECK_FALSE(entry_staleness(k2, f->entries.at(k2)).empty());
  }
  SUBCASE("from the code edit: the changed kernel stays stale and nothing is written") {
    const MigrationReport r = migrate_tuned_cache_file(path, code, "sm_90", true, [](const std::string&) {});
    CHECK(r.changed == 1);
    CHECK(r.migrated == 0);
    REQUIRE(r.changed_keys.size() == 1);
    CHECK(r.changed_keys[0] == k2);
    const auto f = read_tuned_cache_file(path, [](const std::string&) {});
    REQUIRE(f);
    CHECK_FALSE(entry_staleness(k2, f->entries.at(k2)).empty());
  }
}

TEST_CASE("cache migrate: an edit of only the one-launch kernel leaves a tensor-scaled entry stale") {
  // Tensor scaling at decode runs normjit_norm_fwd_once, a kernel of the
  // same module as the row kernel: its timing is the entry's too.
  const char* shape = "rms:bf16:1x4096:quant=e4m3/tensor";
  const NormDesc d = parse_shape_spec(shape).desc;
  TunedEntry e = real_entry(shape, Op::Forward);
  const KernelSpec s = tuned_spec(Op::Forward, d, e.winner);
  REQUIRE(s.once_kernel_name() != nullptr);
  SourceMap once = kernel_sources();
  const std::string sync = "__syncthreads();  // amax is visible to the block";
  const std::size_t at = once["norm_fwd.cuh"].find(sync);
  REQUIRE(at != std::string::npos);
  once["norm_fwd.cuh"].replace(at, sync.size(), "__syncthreads();\n  __syncthreads();");
  const std::string now =
      compile_cubin(s.source(), "a.cu", kernel_sources(), nvrtc_options(), s.kernel_name(), "sm_90").cubin;
  const std::string old = compile_cubin(s.source(), "b.cu", once, nvrtc_options(), s.kernel_name(), "sm_90").cubin;
  CHECK(machine_code_fingerprint(now, s.kernel_name()) == machine_code_fingerprint(old, s.kernel_name()));
  CHECK(machine_code_fingerprint(now, s.once_kernel_name()) != machine_code_fingerprint(old, s.once_kernel_name()));

  const auto dir = normjit_test::make_temp_dir("migrate-once");
  const std::string path = (*dir / "cache.json").string();
  const DeviceFingerprint dev{"NVIDIA H100 80GB HBM3", 9, 0, 132, 50 * 1024 * 1024};
  e.kernel_hash = s.source_hash(once);  // tuned "with" the edited sources
  const std::string key = shape_key(Op::Forward, d);
  merge_into_tuned_cache_file(path, dev, CacheMetadata{"0.1.0", "old", "13.0", 13000}, {{key, e}});
  const MigrationReport r = migrate_tuned_cache_file(path, once, "sm_90", true, [](const std::string&) {});
  CHECK(r.changed == 1);
  CHECK(r.migrated == 0);
  REQUIRE(r.changed_keys.size() == 1);
  CHECK(r.changed_keys[0] == key);
}

// The hand-kept keys cover every field: a Variant field changes the shape key
// (Variant::tags) and the kernel's source (its prelude), and a KernelSpec
// field its name (the cubin cache's file) and source hash (tuned entries).
// The static_asserts on sizeof(Variant) and sizeof(KernelSpec) send a new
// field here.
TEST_CASE("keys: every Variant and KernelSpec field reaches the shape key, the name and the source") {
  KernelSpec fwd;  // a forward with a fused residual add, LayerNorm: the fields that matter there
  fwd.kind = KernelKind::Forward;
  fwd.N = 4096;
  fwd.cfg = LaunchConfig{8, 256, 1, false};
  fwd.v.norm = NormKind::LayerNorm;
  fwd.v.has_b = true;
  fwd.v.residual = fwd.v.store_res = true;
  fwd.v.h = DType::F32;
  fwd.v.store_rstd = fwd.v.store_mean = true;
  KernelSpec quant = fwd;  // a quantized forward: its FP8 fields
  quant.v.residual = quant.v.store_res = false;
  quant.v.h = DType::BF16;
  quant.v.y = DType::E4M3;
  quant.v.quant = QuantScaling::Group;
  quant.v.qgroup = 128;
  KernelSpec bwd = fwd;  // a backward with dresidual
  bwd.kind = KernelKind::Backward;
  bwd.v.residual = bwd.v.store_res = false;
  bwd.v.dres = true;
  struct Field {
    const char* name;
    const KernelSpec* base;
    void (*change)(KernelSpec&);
  };
  const Field fields[] = {
      {"norm", &fwd, [](KernelSpec& s) { s.v.norm = NormKind::RMSNorm; s.v.has_b = false; s.v.store_mean = false; }},
      {"x", &fwd, [](KernelSpec& s) { s.v.x = DType::F16; }},
      {"y", &fwd, [](KernelSpec& s) { s.v.y = DType::F32; }},
      {"w", &fwd, [](KernelSpec& s) { s.v.w = DType::F32; }},
      {"r", &fwd, [](KernelSpec& s) { s.v.r = DType::F32; }},
      {"ro", &fwd, [](KernelSpec& s) { s.v.ro = DType::F32; }},
      {"h", &fwd, [](KernelSpec& s) { s.v.h = DType::BF16; s.v.round_res = true; }},
      {"dx", &bwd, [](KernelSpec& s) { s.v.dx = DType::F32; }},
      {"has_w", &fwd, [](KernelSpec& s) { s.v.has_w = false; }},
      {"has_b", &fwd, [](KernelSpec& s) { s.v.has_b = false; }},
      {"w_offset", &fwd, [](KernelSpec& s) { s.v.w_offset = 1.f; }},
      {"residual", &fwd, [](KernelSpec& s) { s.v.residual = s.v.store_res = false; s.v.h = DType::BF16; }},
      {"store_res", &fwd, [](KernelSpec& s) { s.v.store_res = false; }},
      {"round_res", &fwd, [](KernelSpec& s) { s.v.round_res = true; }},
      {"llama", &fwd, [](KernelSpec& s) { s.v.llama = true; }},
      {"heads", &fwd, [](KernelSpec& s) { s.v.heads = true; }},
      {"dres", &bwd, [](KernelSpec& s) { s.v.dres = false; }},
      {"store_rstd", &fwd, [](KernelSpec& s) { s.v.store_rstd = false; }},
      {"store_mean", &fwd, [](KernelSpec& s) { s.v.store_mean = false; }},
      {"quant", &quant, [](KernelSpec& s) { s.v.quant = QuantScaling::Token; s.v.qgroup = 0; }},
      {"qgroup", &quant, [](KernelSpec& s) { s.v.qgroup = 64; }},
      {"ue8m0", &quant, [](KernelSpec& s) { s.v.ue8m0 = true; }},
      {"colmajor", &quant, [](KernelSpec& s) { s.v.colmajor = true; }},
      {"store_yhp", &quant, [](KernelSpec& s) { s.v.store_yhp = true; }},
      {"store_yt", &quant, [](KernelSpec& s) { s.v.quant = QuantScaling::Tensor; s.v.qgroup = 0; s.v.store_yt = true; }},
      {"yt_by_rows", &quant, [](KernelSpec& s) {
         s.v.quant = QuantScaling::Tensor;
         s.v.qgroup = 0;
         s.v.store_yt = s.v.yt_by_rows = true;
       }},
      {"yhp", &quant, [](KernelSpec& s) { s.v.store_yhp = true; s.v.yhp = DType::F32; }},
      {"store_amax", &quant, [](KernelSpec& s) { s.v.quant = QuantScaling::TensorStatic; s.v.qgroup = 0; s.v.store_amax = true; }},
      {"xgroup", &fwd, [](KernelSpec& s) { s.v.x = DType::E4M3; s.v.xgroup = 32; s.v.residual = s.v.store_res = false; }},
  };
  for (const Field& f : fields) {
    CAPTURE(f.name);
    KernelSpec changed = *f.base;
    f.change(changed);
    CHECK(changed.v.tags(changed.kind) != f.base->v.tags(f.base->kind));
    CHECK(changed.source() != f.base->source());
  }
  // KernelSpec's own fields: each changes the name and the source hash.
  const KernelSpec base = fwd;
  const std::pair<const char*, void (*)(KernelSpec&)> spec_fields[] = {
      {"kind", [](KernelSpec& s) { s.kind = KernelKind::Backward; s.v.residual = s.v.store_res = false; }},
      {"N", [](KernelSpec& s) { s.N = 4104; }},
      {"cfg", [](KernelSpec& s) { s.cfg.threads_per_row = 128; }},
      {"index64", [](KernelSpec& s) { s.index64 = true; }},
      {"dw_smem", [](KernelSpec& s) { s.kind = KernelKind::Backward; s.v.residual = s.v.store_res = false; s.dw_smem = true; }},
      {"peel", [](KernelSpec& s) { s.peel = true; s.N = 4095; }},
  };
  for (const auto& [name, change] : spec_fields) {
    CAPTURE(name);
    KernelSpec changed = base;
    change(changed);
    CHECK(changed.name() != base.name());
    CHECK(changed.source_hash() != base.source_hash());
  }
  // min_blocks is derived from the others (forward_min_blocks), so it is in
  // the source (its __launch_bounds__) and not in the name.
  KernelSpec mb = base;
  mb.min_blocks = 2;
  CHECK(mb.source_hash() != base.source_hash());
}
