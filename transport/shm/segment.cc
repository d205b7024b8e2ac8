#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace sparsereduce::shm {
namespace {

constexpr char kMagic[8] = {'S', 'R', 'S', 'H', 'M', 'S', 'E', 'G'};

// At the start of the segment; written once by the creator before the descriptors are handed over.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t ring_capacity;
};

Status Errno(const std::string& what) {
  return Status(StatusCode::kUnavailable, what + ": " + std::strerror(errno));
}

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

}  // namespace

Result<Segment::Created> Segment::Create(uint64_t ring_capacity) {
  if (Status st = transport::ByteRing::CheckCapacity(ring_capacity); !st.ok()) return st;
  SegmentFds fds;
  std::array<UniqueFd, 4> peer_events;
  fds.memory = UniqueFd(memfd_create("sparsereduce-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fds.memory.valid()) return Errno("memfd_create");
  const uint64_t size = SizeFor(ring_capacity);
  if (ftruncate(fds.memory.get(), static_cast<off_t>(size)) != 0) return Errno("ftruncate of the shm segment");
  // The worker maps it too: sealed, it cannot shrink the file under the daemon's mapping (which would SIGBUS it).
  if (fcntl(fds.memory.get(), F_ADD_SEALS, kSeals) != 0) return Errno("sealing the shm segment");
  // Socket pairs, not eventfds: an eventfd handed over is the same open file description on both sides, whose
  // O_NONBLOCK the worker could clear, blocking the daemon's thread in read(2) or write(2).
  for (size_t i = 0; i < fds.events.size(); ++i) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
      return Errno("socketpair for the shm wake-ups");
    }
    fds.events[i] = UniqueFd(pair[0]);
    peer_events[i] = UniqueFd(pair[1]);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds.memory.get(), 0);
  if (base == MAP_FAILED) return Errno("mmap of the shm segment (" + std::to_string(size) + " bytes)");
  std::shared_ptr<Segment> segment(new Segment(static_cast<std::byte*>(base), size, ring_capacity));
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kVersion;
  header.ring_capacity = ring_capacity;
  std::memcpy(base, &header, sizeof header);
  for (Direction d : {Direction::kToAggregator, Direction::kToWorker}) {
    new (&segment->control(d)) RingControl{};  // fresh pages are zero; this makes the atomics' lifetime explicit
  }
  return Created{std::move(segment), std::move(fds), std::move(peer_events)};
}

Result<std::shared_ptr<Segment>> Segment::Attach(const SegmentFds& fds) {
  // Every check of docs/PROTOCOL.md §10.3 fails as a protocol violation of the offering aggregator, also where
  // the descriptor cannot be examined (F_GET_SEALS fails on anything but a memfd): an UNAVAILABLE would make a
  // worker on transport "auto" take it for an unreachable socket and stay on TCP without a word.
  const int seals = fcntl(fds.memory.get(), F_GET_SEALS);
  if (seals < 0) return ProtocolError(std::string("the shm segment carries no seals: ") + std::strerror(errno));
  if ((seals & kSeals) != kSeals) {  // docs/PROTOCOL.md §10.3
    return ProtocolError("the shm segment is not sealed against resizing (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL)");
  }
  struct stat st {};
  if (fstat(fds.memory.get(), &st) != 0) {
    return ProtocolError(std::string("fstat of the shm segment: ") + std::strerror(errno));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes) return ProtocolError("the shm segment is too small for its header");
  Header header{};
  if (pread(fds.memory.get(), &header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) {
    return ProtocolError("the shm segment's header cannot be read");
  }
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0 || header.version != kVersion) {
    return ProtocolError("the shm segment header has the wrong magic or version");
  }
  if (Status check = transport::ByteRing::CheckCapacity(header.ring_capacity); !check.ok()) {
    return ProtocolError("the shm segment's header: " + check.message());
  }
  if (size != SizeFor(header.ring_capacity)) {
    return ProtocolError("the shm segment has " + std::to_string(size) + " bytes, its rings need " +
                         std::to_string(SizeFor(header.ring_capacity)));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds.memory.get(), 0);
  if (base == MAP_FAILED) return Errno("mmap of the shm segment");
  return std::shared_ptr<Segment>(new Segment(static_cast<std::byte*>(base), size, header.ring_capacity));
}

Segment::~Segment() { munmap(base_, size_); }

RingControl& Segment::control(Direction d) const {
  const uint64_t offset = kHeaderBytes + static_cast<uint64_t>(d) * (kControlBytes + ring_.capacity());
  return *std::launder(reinterpret_cast<RingControl*>(base_ + offset));
}

std::byte* Segment::data(Direction d) const {
  return base_ + kHeaderBytes + static_cast<uint64_t>(d) * (kControlBytes + ring_.capacity()) + kControlBytes;
}

}  // namespace sparsereduce::shm
