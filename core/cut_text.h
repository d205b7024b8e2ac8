// Text cut to a byte budget without splitting a UTF-8 character: messages that travel in protobuf `string` fields
// (an Error's message, a Goodbye's reason) must stay valid UTF-8, or the receiver's parser refuses the whole
// message and the explanation is lost.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sparsereduce {

// `text` cut to at most `max_bytes` on a character boundary, followed by " [...]" when something was cut.
inline std::string CutText(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // not inside a character
  return std::string(text.substr(0, end)) + " [...]";
}

}  // namespace sparsereduce
