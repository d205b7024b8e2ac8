// A peer played by hand over plain sockets, for integration tests that must send what a real Worker or aggregator
// never would (a Goodbye before the job forms, an offer after JobReady, a Hello of another version) or read what
// the daemon answers byte for byte. Every read is bounded, so a silent daemon fails a test instead of hanging it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "proto/control.pb.h"
#include "protocol/frame.h"
#include "sparsereduce/worker.h"

namespace sparsereduce::testing {

// A TCP connection to 127.0.0.1:`port`, or -1. A `receive_buffer` > 0 sets SO_RCVBUF first (a peer that reads
// slowly).
int ConnectToLoopback(uint16_t port, int receive_buffer = 0);
// The same for a local daemon's address "127.0.0.1:PORT" (only the port is read).
int ConnectToLoopback(const std::string& address, int receive_buffer = 0);

// A listening socket on 127.0.0.1 (an aggregator played by hand), or -1; sets `port`. A `receive_buffer` > 0 sets
// SO_RCVBUF, which accepted sockets inherit.
int ListenOnLoopback(uint16_t* port, int receive_buffer = 0);
// The next connection on `listener`, or -1 if none comes within `timeout` (a worker that failed before connecting
// must fail the test, not hang it).
int AcceptWithin(int listener, std::chrono::milliseconds timeout = std::chrono::seconds(10));

// A connection to, or a listening socket on, the abstract Unix socket `name` (without its leading NUL, as in a
// TransportOffer's shm_socket), or -1.
int ConnectToAbstract(const std::string& name);
int ListenOnAbstract(const std::string& name);

// Writes all of `bytes` (blocking); false on an error or a closed connection.
bool WriteAll(int fd, std::span<const std::byte> bytes);
bool SendControl(int fd, const proto::ControlMessage& message);

// A Hello as a Worker with `shape`'s slots, blocks per message and window would send it.
proto::ControlMessage RawHello(uint64_t job, uint32_t rank, uint32_t world_size, uint32_t num_aggregators,
                               const WorkerOptions& shape = WorkerOptions{});

// A JobReady as an aggregator answers a Hello on `transport` ("tcp", "shm", "rdma").
proto::ControlMessage RawJobReady(const std::string& transport);

// Reads exactly `n` bytes; false on EOF, an error, or `idle_timeout` without data.
bool ReadExactly(int fd, void* out, size_t n, std::chrono::milliseconds idle_timeout = std::chrono::seconds(20));

struct RawFrame {
  FrameHeader header;
  std::vector<std::byte> payload;
};
// Reads one whole frame; nullopt when the stream ended, stalled (20 s) or the header does not decode.
std::optional<RawFrame> ReadFrame(int fd);
// Reads one frame that must be a CONTROL frame; nullopt as ReadFrame, or when it is another frame or does not decode.
std::optional<proto::ControlMessage> ReadControlFrame(int fd);

// Everything read until the peer closes the connection; nullopt if it has not closed within `timeout`.
std::optional<std::string> ReadUntilClosed(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace sparsereduce::testing
