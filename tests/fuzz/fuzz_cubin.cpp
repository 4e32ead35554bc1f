// libFuzzer target: the checks on a cubin read from the kernel cache. The
// input edits a real cubin (compiled once by NVRTC): bytes 0-3 a length to
// truncate to (when bit 31 is set), then 5-byte records (offset, value) that
// overwrite one byte each, so the fuzzer reaches the ELF header, the header
// tables and the sections. cubin_problem and machine_code_fingerprint must
// return or throw normjit::Error; and the cache reader must serve the file
// only when cubin_problem accepts it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "compile/cubin.hpp"
#include "fuzz_common.hpp"
#include "compile/jit.hpp"
#include "compile/specialization.hpp"

using namespace normjit;
using namespace normjit::detail;

namespace {
struct Original {
  KernelSpec spec;
  std::string cubin, kernel, dir, file;
};
const Original& original() {
  static const Original o = [] {
    Original r;
    NormDesc d;
    d.M = 64;
    d.N = 128;
    d.x_dtype = d.y_dtype = d.weight_dtype = DType::BF16;
    r.spec = make_spec(Op::Forward, d, LaunchConfig::parse("v8.t16.r2"));
    r.dir = normjit_fuzz::scratch_dir() + "/kernels";
    const KernelBinary b = compile_spec(r.spec, "sm_90", r.dir);
    r.cubin = b.cubin;
    r.kernel = r.spec.kernel_name();
    r.file = r.dir + "/" + b.cache_key + ".cubin";
    return r;
  }();
  return o;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  original();
  std::string trunc(4, '\0'), header;
  const std::uint32_t half = 0x80000000u | static_cast<std::uint32_t>(original().cubin.size() / 2);
  std::memcpy(trunc.data(), &half, 4);
  for (std::uint32_t off : {0x28u, 0x3au, 0x3cu, 0x20u}) {  // e_shoff, e_shentsize, e_shnum, e_phoff
    header.append(reinterpret_cast<const char*>(&off), 4);
    header += '\xff';
  }
  normjit_fuzz::write_seeds({std::string(4, '\0'), trunc, std::string(4, '\0') + header});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Original& o = original();
  std::string c = o.cubin;
  if (size >= 4) {
    std::uint32_t t;
    std::memcpy(&t, data, 4);
    if (t & 0x80000000u) c.resize(std::min<std::size_t>(c.size(), t & 0x7fffffffu));
  }
  for (std::size_t i = 4; i + 5 <= size; i += 5) {
    std::uint32_t off;
    std::memcpy(&off, data + i, 4);
    if (!c.empty()) c[off % c.size()] = static_cast<char>(data[i + 4]);
  }
  const std::string why = cubin_problem(c, o.kernel);
  try {
    machine_code_fingerprint(c, o.kernel);
  } catch (const Error&) {
    if (why.empty()) __builtin_trap();  // the check accepted what the fingerprint rejects
  }
  // The reader (every 16th input: it recompiles what it rejects).
  if (size % 16 == 0) {
    normjit_fuzz::write_file(o.file, c);
    const KernelBinary b = compile_spec(o.spec, "sm_90", o.dir);
    if (b.from_disk != why.empty() || (b.from_disk && b.cubin != c)) __builtin_trap();
  }
  return 0;
}
