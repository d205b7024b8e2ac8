// CLI11 checks shared by the tools.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace sparsereduce::tools {

// For unsigned 64-bit options: CLI11 reads "-1" into a uint64_t as 18446744073709551615 (a uint32_t option refuses
// it: "Could not convert"), so a negative count or timeout ran without end or overflowed a deadline.
inline const CLI::Validator kNotNegative(
    [](std::string& text) -> std::string {
      const size_t first = text.find_first_not_of(" \t\n\v\f\r");
      if (first != std::string::npos && text[first] == '-') return "Value " + text + " is negative; it takes 0 or more";
      return {};
    },
    "NONNEGATIVE");

// For options that take 1 or more: a negative value is refused as kNotNegative does, without its "it takes 0 or
// more" (a check of 0 refuses that).
inline const CLI::Validator kNotNegativeOrZero(
    [](std::string& text) -> std::string {
      if (kNotNegative(text).empty()) return {};
      return "Value " + text + " is negative; it takes 1 or more";
    },
    "POSITIVE");

// The tools' *-timeout-ms options: at most 30 days, as the aggregator's (2^63 ms and more became negative
// milliseconds).
inline constexpr uint64_t kMaxTimeoutMs = 30ull * 24 * 3600 * 1000;

}  // namespace sparsereduce::tools
