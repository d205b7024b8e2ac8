// Text a peer chose (a Goodbye's or a TransportDecline's reason) on its way into the daemon's log and into the
// Errors other ranks receive, and the bound on an Error as a whole. A peer's text is as long as a CONTROL frame
// allows (64 KiB) and may hold newlines: passed on whole it forged lines of the text log and, quoted in another
// rank's Error, made that Error larger than the CONTROL limit, so the rank failed on an unreadable frame instead of
// learning why.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/cut_text.h"

namespace sparsereduce::aggregator {

inline constexpr size_t kMaxPeerText = 1024;
// An Error's message and ranks stay well within kMaxControlPayload (64 KiB): ranks are varints of at most 3 bytes
// below 2^21.
inline constexpr size_t kMaxErrorMessage = 16 * 1024;
inline constexpr size_t kMaxErrorRanks = 4096;

// A peer's text for logs and messages: control characters (newlines included) and backslashes written as \xNN,
// then cut to `max_bytes` with CutText.
inline std::string PeerText(std::string_view text, size_t max_bytes = kMaxPeerText) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes + 8));
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7F || byte == '\\') {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
    if (out.size() > max_bytes) break;  // enough to know it is cut
  }
  return CutText(out, max_bytes);
}

}  // namespace sparsereduce::aggregator
