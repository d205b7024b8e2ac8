// Which parts of a receive ring are lent out (RingChannel::ReadPayloadLent hands a frame's payload to its reader
// in place, as a ByteBuffer over the ring's own memory). The ring's consumer may give the producer back only the
// bytes before the first part still lent: loans are taken in ring order but come back in any order. Pure
// bookkeeping of positions (byte_ring.h), no memory and no I/O.
#pragma once

#include <cstdint>
#include <deque>

namespace sparsereduce::transport {

class LoanLedger {
 public:
  // Lends the bytes from `begin` on (less than a ring's capacity); `begin` is at or after the end of every
  // earlier loan.
  void Lend(uint64_t begin);
  // The loan that begins at a position p with p mod `capacity` == `offset` comes back. Loans span less than a
  // ring, so at most one outstanding loan matches. False if none does (nothing changes then).
  bool Return(uint64_t offset, uint64_t capacity);
  // What the consumer may report as consumed once it has read up to `read`: `read`, or the start of the first
  // loan still out.
  uint64_t ConsumableUpTo(uint64_t read) const { return loans_.empty() ? read : loans_.front().begin; }
  // Loans given and not yet back.
  uint64_t outstanding() const { return outstanding_; }

 private:
  struct Loan {
    uint64_t begin = 0;
    bool returned = false;
  };
  std::deque<Loan> loans_;  // in ring order; the front one is still out (returned ones at the front are dropped)
  uint64_t outstanding_ = 0;
};

}  // namespace sparsereduce::transport
