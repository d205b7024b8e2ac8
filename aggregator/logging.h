// Log setup of the daemon: level, and text or JSON lines (one object per line: time, level, instance, message).
#pragma once

#include <string>

namespace sparsereduce::aggregator {

// `level` and `format` were validated by the config parser.
void ConfigureLogging(const std::string& level, const std::string& format, const std::string& instance);

// `text` as the body of a JSON string (quotes, backslashes and control characters escaped).
std::string JsonEscape(std::string_view text);

}  // namespace sparsereduce::aggregator
