// The shared memory of one shm connection: a sealed memfd with a header and two byte rings, one per direction,
// plus four socket pairs to wake a side that sleeps (docs/PROTOCOL.md §10). The aggregator creates it and hands the
// memfd and its peer's socket ends to the worker (handoff.h); both map it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>  // offsetof
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "transport/ring/byte_ring.h"
#include "transport/shm/unique_fd.h"

namespace sparsereduce::shm {

enum class Direction : int { kToAggregator = 0, kToWorker = 1 };

// The shared state of one ring. Each field is written by one side only; the other side only reads it, and checks
// what it reads (the peer may be broken).
struct RingControl {
  alignas(64) std::atomic<uint64_t> head;  // producer: bytes written
  alignas(64) std::atomic<uint64_t> tail;  // consumer: bytes consumed
  // Set by a side just before it sleeps on its wake-up socket; the other side signals only when set.
  alignas(64) std::atomic<uint32_t> consumer_waiting;  // written by the consumer
  alignas(64) std::atomic<uint32_t> producer_waiting;  // written by the producer
  std::atomic<uint32_t> producer_closed;               // producer: nothing follows `head`
};
// The layout docs/PROTOCOL.md §10.3 gives.
static_assert(offsetof(RingControl, head) == 0 && offsetof(RingControl, tail) == 64 &&
              offsetof(RingControl, consumer_waiting) == 128 && offsetof(RingControl, producer_waiting) == 192 &&
              offsetof(RingControl, producer_closed) == 196 && sizeof(RingControl) <= 4096);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory rings need lock-free atomics");

// One side's descriptors of a segment: the memfd and, per direction, its end of the `data` socket pair (producer
// wakes consumer) and of the `space` socket pair (consumer wakes producer). Each side has its own end of each pair,
// so neither shares an open file description (and its O_NONBLOCK) with the other (docs/PROTOCOL.md §10.1).
struct SegmentFds {
  UniqueFd memory;
  std::array<UniqueFd, 4> events;  // [2·direction] data, [2·direction + 1] space

  UniqueFd& data(Direction d) { return events[2 * static_cast<int>(d)]; }
  UniqueFd& space(Direction d) { return events[2 * static_cast<int>(d) + 1]; }
};

class Segment {
 public:
  static constexpr uint64_t kHeaderBytes = 4096;
  static constexpr uint64_t kControlBytes = 4096;
  static constexpr uint32_t kVersion = 1;

  struct Created {
    std::shared_ptr<Segment> segment;
    SegmentFds fds;                         // the creator's
    std::array<UniqueFd, 4> peer_events;    // the other ends of the socket pairs, for the peer (SegmentFds order)
  };
  // A new segment with rings of `ring_capacity` bytes (ByteRing::CheckCapacity), sealed against resizing, and its
  // descriptors.
  static Result<Created> Create(uint64_t ring_capacity);
  // Maps a segment received from its creator after checking its seals, size and header.
  static Result<std::shared_ptr<Segment>> Attach(const SegmentFds& fds);

  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  static uint64_t SizeFor(uint64_t ring_capacity) { return kHeaderBytes + 2 * (kControlBytes + ring_capacity); }

  const transport::ByteRing& ring() const { return ring_; }
  RingControl& control(Direction d) const;
  std::byte* data(Direction d) const;

 private:
  Segment(std::byte* base, uint64_t size, uint64_t ring_capacity) : base_(base), size_(size), ring_(ring_capacity) {}

  std::byte* base_;
  uint64_t size_;
  transport::ByteRing ring_;
};

}  // namespace sparsereduce::shm
