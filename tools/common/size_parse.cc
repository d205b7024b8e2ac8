#include "tools/common/size_parse.h"

#include <charconv>
#include <limits>

namespace sparsereduce::tools {

Result<uint64_t> ParseByteSize(const std::string& text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return InvalidArgument("bad size '" + text + "'");
  const std::string suffix(end, text.data() + text.size());
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1ull << 10;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1ull << 20;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1ull << 30;
  } else if (!suffix.empty()) {
    return InvalidArgument("bad size suffix in '" + text + "' (use K, M or G)");
  }
  if (value > std::numeric_limits<uint64_t>::max() / scale) {
    return InvalidArgument("size '" + text + "' does not fit in 64 bits");
  }
  return value * scale;
}

}  // namespace sparsereduce::tools
