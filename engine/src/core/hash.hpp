// xxHash (XXH3-128) behind a tiny streaming wrapper; header-only use of
// libxxhash so binaries do not depend on libxxhash.so at load time.
#pragma once

#include <string>
#include <string_view>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace normjit::detail {

class Hasher {
 public:
  Hasher() { state_ = XXH3_createState(); XXH3_128bits_reset(state_); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  /// Adds `s` and a separator, so ("ab","c") and ("a","bc") differ.
  Hasher& add(std::string_view s) {
    const unsigned long long n = s.size();
    XXH3_128bits_update(state_, &n, sizeof n);
    XXH3_128bits_update(state_, s.data(), s.size());
    return *this;
  }
  /// 32 lowercase hex digits.
  std::string hex() const {
    XXH128_hash_t h = XXH3_128bits_digest(state_);
    static const char* d = "0123456789abcdef";
    std::string out(32, '0');
    for (int i = 0; i < 16; ++i) {
      unsigned long long w = i < 8 ? h.high64 : h.low64;
      unsigned b = (w >> (8 * (7 - (i % 8)))) & 0xff;
      out[2 * i] = d[b >> 4];
      out[2 * i + 1] = d[b & 15];
    }
    return out;
  }

 private:
  XXH3_state_t* state_;
};

inline std::string hash_hex(std::string_view s) { return Hasher().add(s).hex(); }

}  // namespace normjit::detail
