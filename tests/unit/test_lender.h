// A BufferLender for tests of code that holds lent payloads (ColumnEngine). Header-only: the fuzzers use it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/byte_buffer.h"

namespace sparsereduce::testing {

// Lends CONTRIBUTION payloads to ColumnEngines as a shared-memory ring does (the protocol simulation, the column
// engine fuzzer): counts what each (aggregator, rank) still holds, and scribbles over a payload's memory when it
// comes back (and keeps it until the lender goes), so an engine that read a payload after giving it back (or kept
// pointers into it after ReturnLoans) sums garbage and fails the bit-exact checks.
class TestLender final : public BufferLender, public std::enable_shared_from_this<TestLender> {
 public:
  ByteBuffer Lend(uint32_t aggregator, uint32_t rank, std::span<const std::byte> bytes) {
    auto* data = new std::byte[bytes.size() + 1];  // never empty, so every loan has its own address
    if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
    out_[data] = {aggregator, rank};
    return ByteBuffer::Borrowed(data, bytes.size(), shared_from_this(), bytes.size() + 1, /*on_loan=*/true);
  }
  void Return(std::byte* data, size_t capacity) override {
    out_.erase(data);
    std::memset(data, 0xA5, capacity);
    returned_.emplace_back(data);
  }
  size_t Outstanding(uint32_t aggregator, uint32_t rank) const {
    size_t n = 0;
    for (const auto& [data, owner] : out_) n += owner == std::pair{aggregator, rank} ? 1 : 0;
    return n;
  }
  size_t outstanding() const { return out_.size(); }

 private:
  std::map<std::byte*, std::pair<uint32_t, uint32_t>> out_;
  std::vector<std::unique_ptr<std::byte[]>> returned_;
};

}  // namespace sparsereduce::testing
