// Which RDMA write an RdmaChannel posts next (docs/PROTOCOL.md §10.4), as logic without verbs: the ring bytes that
// are published but not yet written, a credit to return, and end of stream, with at most `send_queue` writes in
// flight. A write that does not fit waits for completions: the send queue is flow control like ring space, not an
// error. (It was one: a reader that paused while the peer wrote many small frames let the writes pile up past the
// queue, and the connection failed with "RDMA send queue full".)
#pragma once

#include <cstdint>
#include <optional>

namespace sparsereduce::rdma {

class WriteSchedule {
 public:
  enum class Kind : uint8_t { kData = 1, kCredit = 2, kEndOfStream = 3 };
  struct Write {
    Kind kind;
    uint64_t offset = 0;  // kData: into both rings
    uint32_t length = 0;  // kData: bytes, also the immediate (< 2^30)
  };

  // Largest data write: its length is the immediate, whose bits 30 and 31 are the flags.
  static constexpr uint32_t kMaxDataWrite = (1u << 30) - 1;

  // `capacity`: the rings' size, a power of two.
  WriteSchedule(uint64_t capacity, uint32_t send_queue) : capacity_(capacity), send_queue_(send_queue) {}

  // The staging ring holds bytes up to position `to` (never moves back).
  void Publish(uint64_t to);
  // The consumer's tail changed: one credit write is due (it carries the latest tail, whenever it goes).
  void Credit() { credit_due_ = true; }
  // Nothing follows what is published; end of stream goes after all of it.
  void EndOfStream() { end_of_stream_asked_ = true; }

  // The next write to post now, counted in flight; none while nothing is due or the send queue is full. Credits go
  // first (the peer may be waiting for room), then data in order, then end of stream.
  std::optional<Write> Next();
  // A posted write completed (successfully; a failed one fails the connection).
  void Completed();

  // Something waits for a place in the send queue.
  bool due() const { return credit_due_ || written_ < published_ || (end_of_stream_asked_ && !end_of_stream_posted_); }
  // Everything asked for is posted and completed: the peer's memory holds it.
  bool delivered() const { return !due() && in_flight_ == 0; }
  uint32_t in_flight() const { return in_flight_; }

 private:
  const uint64_t capacity_;
  const uint32_t send_queue_;
  uint64_t published_ = 0;  // staging ring position up to which bytes are ready
  uint64_t written_ = 0;    // and up to which they are posted
  bool credit_due_ = false;
  bool end_of_stream_asked_ = false;
  bool end_of_stream_posted_ = false;
  uint32_t in_flight_ = 0;
};

}  // namespace sparsereduce::rdma
