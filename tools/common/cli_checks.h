// CLI11 checks shared by the tools.
#pragma once

#include <CLI/CLI.hpp>
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

}  // namespace sparsereduce::tools
