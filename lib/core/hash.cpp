#include "core/hash.hpp"

namespace mtplab {

std::string hex16(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = kDigits[value & 0xf];
  return out;
}

}  // namespace mtplab
