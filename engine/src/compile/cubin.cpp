#include "compile/cubin.hpp"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "normjit/normjit.hpp"

namespace normjit::detail {

namespace {

// Little-endian fields of an ELF64 file (cubins are little-endian).
template <class T> T field(const std::string& f, std::uint64_t off) {
  // Written so that no sum can wrap: offsets come from the file.
  if (off > f.size() || f.size() - off < sizeof(T)) throw Error(ErrorKind::InvalidArgument, "cubin: truncated ELF file");
  T v;
  std::memcpy(&v, f.data() + off, sizeof(T));
  return v;
}

struct Section {
  std::string name;
  std::uint64_t flags = 0, offset = 0, size = 0;
  std::uint32_t type = 0, info = 0;
};

// [off, off + size) lies inside a file of `n` bytes (no sum wraps).
bool inside(std::uint64_t off, std::uint64_t size, std::size_t n) { return off <= n && size <= n - off; }

// The section headers of a 64-bit ELF file, names resolved. Throws
// Error(InvalidArgument) when the file or its section table is malformed.
std::vector<Section> sections(const std::string& f) {
  if (f.size() < 64 || f.compare(0, 4, "\x7f" "ELF") != 0 || f[4] != 2)
    throw Error(ErrorKind::InvalidArgument, "cubin: not a 64-bit ELF file");
  const auto shoff = field<std::uint64_t>(f, 0x28);
  const auto shentsize = field<std::uint16_t>(f, 0x3a), shnum = field<std::uint16_t>(f, 0x3c),
             shstrndx = field<std::uint16_t>(f, 0x3e);
  if (shentsize < 64 || shstrndx >= shnum || !inside(shoff, std::uint64_t{shnum} * shentsize, f.size()))
    throw Error(ErrorKind::InvalidArgument, "cubin: bad section table");
  auto header = [&](std::size_t i) {
    const std::uint64_t h = shoff + i * shentsize;  // inside the file: checked above
    Section s;
    s.type = field<std::uint32_t>(f, h + 4);
    s.flags = field<std::uint64_t>(f, h + 8);
    s.offset = field<std::uint64_t>(f, h + 24);
    s.size = field<std::uint64_t>(f, h + 32);
    s.info = field<std::uint32_t>(f, h + 44);
    s.name = std::to_string(field<std::uint32_t>(f, h));  // the name's offset, resolved below
    return s;
  };
  const Section strtab = header(shstrndx);
  std::vector<Section> out;
  for (std::size_t i = 0; i < shnum; ++i) {
    Section s = header(i);
    const std::uint64_t name_off = std::stoull(s.name);
    if (strtab.offset >= f.size() || name_off >= f.size() - strtab.offset)
      throw Error(ErrorKind::InvalidArgument, "cubin: bad section name");
    s.name = std::string(f.c_str() + strtab.offset + name_off);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::string machine_code_fingerprint(const std::string& f, const std::string& kernel) {
  std::string text, shared = "0";
  bool found = false;
  for (const Section& s : sections(f)) {
    if (s.name == ".text." + kernel) {
      if (!inside(s.offset, s.size, f.size())) throw Error(ErrorKind::InvalidArgument, "cubin: truncated .text");
      text = fmt::format("flags={:x} info={:x} ", s.flags, s.info) + f.substr(s.offset, s.size);
      found = true;
    } else if (s.name == ".nv.shared." + kernel) {
      shared = std::to_string(s.size);
    }
  }
  if (!found) throw Error(ErrorKind::InvalidArgument, fmt::format("cubin: no kernel '{}'", kernel));
  return "shared=" + shared + " " + text;
}

CubinResources cubin_resources(const std::string& f) {
  // EIATTR_REGCOUNT and EIATTR_FRAME_SIZE records (format EIFMT_SVAL 0x04,
  // attribute 0x2f or 0x11, 8 bytes: symbol index, value) in the .nv.info
  // sections.
  constexpr unsigned char kSval = 0x04, kRegcount = 0x2f, kFrameSize = 0x11;
  CubinResources r;
  try {
    for (const Section& s : sections(f)) {
      if (s.name.compare(0, 8, ".nv.info") != 0) continue;
      if (!inside(s.offset, s.size, f.size())) return CubinResources{};
      for (std::uint64_t j = s.offset; j + 4 <= s.offset + s.size;) {
        const auto fmt_ = static_cast<unsigned char>(f[j]), attr = static_cast<unsigned char>(f[j + 1]);
        if (fmt_ == kSval) {
          const auto len = field<std::uint16_t>(f, j + 2);
          const int v = len == 8 ? static_cast<int>(field<std::uint32_t>(f, j + 8)) : -1;
          if (attr == kRegcount) r.regs = std::max(r.regs, v);
          if (attr == kFrameSize) r.frame_bytes = std::max(r.frame_bytes, v);
          j += 4 + len;
        } else {
          j += fmt_ == 0x01 ? 2 : 4;  // EIFMT_NVAL: 2 bytes; EIFMT_BVAL, EIFMT_HVAL: 4
        }
      }
    }
    return r;
  } catch (const Error&) {
    return CubinResources{};
  }
}

std::string cubin_problem(const std::string& f, const std::string& kernel) {
  constexpr std::uint16_t kEmCuda = 190;
  constexpr std::uint32_t kShtNobits = 8;  // a section with no bytes in the file (.bss, .nv.shared.*)
  try {
    if (f.size() < 64 || f.compare(0, 4, "\x7f" "ELF") != 0) return "not an ELF file";
    if (f[4] != 2 || f[5] != 1) return "not a 64-bit little-endian ELF file";
    if (field<std::uint16_t>(f, 0x12) != kEmCuda) return "not a CUDA ELF file (e_machine is not EM_CUDA)";
    const auto phoff = field<std::uint64_t>(f, 0x20);
    const auto phentsize = field<std::uint16_t>(f, 0x36), phnum = field<std::uint16_t>(f, 0x38);
    if (phnum > 0 && (phentsize < 56 || !inside(phoff, std::uint64_t{phnum} * phentsize, f.size())))
      return "bad program header table";
    for (std::uint64_t i = 0; i < phnum; ++i) {
      const std::uint64_t h = phoff + i * phentsize;
      if (!inside(field<std::uint64_t>(f, h + 8), field<std::uint64_t>(f, h + 32), f.size()))
        return fmt::format("segment {} lies past the end of the file", i);
    }
    const auto shoff = field<std::uint64_t>(f, 0x28);
    const auto shentsize = field<std::uint16_t>(f, 0x3a), shnum = field<std::uint16_t>(f, 0x3c);
    if (shentsize < 64 || !inside(shoff, std::uint64_t{shnum} * shentsize, f.size())) return "bad section table";
    for (std::uint64_t i = 0; i < shnum; ++i) {
      const std::uint64_t h = shoff + i * shentsize;
      if (field<std::uint32_t>(f, h + 4) != kShtNobits &&
          !inside(field<std::uint64_t>(f, h + 24), field<std::uint64_t>(f, h + 32), f.size()))
        return fmt::format("section {} lies past the end of the file", i);
    }
    machine_code_fingerprint(f, kernel);  // section names, and the kernel's .text
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace normjit::detail
