#include "cubin.hpp"

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "normjit/normjit.hpp"

namespace normjit::detail {

namespace {

// Little-endian fields of an ELF64 file (cubins are little-endian).
template <class T> T field(const std::string& f, std::size_t off) {
  if (off + sizeof(T) > f.size()) throw Error(ErrorKind::InvalidArgument, "cubin: truncated ELF file");
  T v;
  std::memcpy(&v, f.data() + off, sizeof(T));
  return v;
}

struct Section {
  std::string name;
  std::uint64_t flags = 0, offset = 0, size = 0;
  std::uint32_t type = 0, info = 0;
};

}  // namespace

std::string machine_code_fingerprint(const std::string& f, const std::string& kernel) {
  if (f.size() < 64 || f.compare(0, 4, "\x7f" "ELF") != 0 || f[4] != 2)
    throw Error(ErrorKind::InvalidArgument, "cubin: not a 64-bit ELF file");
  const auto shoff = field<std::uint64_t>(f, 0x28);
  const auto shentsize = field<std::uint16_t>(f, 0x3a), shnum = field<std::uint16_t>(f, 0x3c),
             shstrndx = field<std::uint16_t>(f, 0x3e);
  if (shentsize < 64 || shstrndx >= shnum) throw Error(ErrorKind::InvalidArgument, "cubin: bad section table");
  auto header = [&](std::size_t i) {
    const std::size_t h = shoff + i * shentsize;
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
  std::string text, shared = "0";
  bool found = false;
  for (std::size_t i = 0; i < shnum; ++i) {
    Section s = header(i);
    const std::size_t at = strtab.offset + std::stoull(s.name);
    if (at >= f.size()) throw Error(ErrorKind::InvalidArgument, "cubin: bad section name");
    s.name = std::string(f.c_str() + at);
    if (s.name == ".text." + kernel) {
      if (s.offset + s.size > f.size()) throw Error(ErrorKind::InvalidArgument, "cubin: truncated .text");
      text = fmt::format("flags={:x} info={:x} ", s.flags, s.info) + f.substr(s.offset, s.size);
      found = true;
    } else if (s.name == ".nv.shared." + kernel) {
      shared = std::to_string(s.size);
    }
  }
  if (!found) throw Error(ErrorKind::InvalidArgument, fmt::format("cubin: no kernel '{}'", kernel));
  return "shared=" + shared + " " + text;
}

}  // namespace normjit::detail
