// Byte sizes with K/M/G suffixes (powers of 1024), as nccl-tests and perftest accept them.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace sparsereduce::tools {

// Fails on anything but digits with an optional K/M/G suffix, and on sizes that do not fit in 64 bits.
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace sparsereduce::tools
