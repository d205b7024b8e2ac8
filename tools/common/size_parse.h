// Byte sizes with K/M/G suffixes (powers of 1024), as nccl-tests and perftest accept them.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace sparsereduce::tools {

Result<uint64_t> ParseByteSize(const std::string& text);
std::string FormatByteSize(uint64_t bytes);  // "64M", "4K", "123"

}  // namespace sparsereduce::tools
