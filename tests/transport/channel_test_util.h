// What the transport tests share: socket pairs, a bounded event loop, shm connections made through the real
// handoff, and frame exchanges checked byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "protocol/frame.h"
#include "protocol/frame_format.h"
#include "transport/shm/channel.h"
#include "transport/shm/handoff.h"

namespace sparsereduce::testing {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;
using shm::ShmAttachment;
using shm::ShmOffer;
using shm::Segment;
using shm::AttachShm;

// A connected pair of TCP sockets on 127.0.0.1 (the liveness connections of the two ends).
inline std::pair<tcp::socket, tcp::socket> TcpPair(asio::io_context& io) {
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket server = acceptor.accept();
  return {std::move(server), std::move(client)};
}

// Runs `io` until `done()` holds or the bound passes.
template <typename Done>
void RunUntil(asio::io_context& io, Done done, std::chrono::seconds bound = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(10ms);
  }
  ASSERT_TRUE(done()) << "not finished within " << bound.count() << " s";
}
inline void RunUntil(asio::io_context& io, const bool& done, std::chrono::seconds bound = 20s) {
  RunUntil(io, [&done] { return done; }, bound);
}

// The two sides of a finished shm handoff, before either has made its channel: the aggregator's offer and the
// worker's attachment (its segment and descriptors).
struct Handover {
  std::unique_ptr<ShmOffer> offer;
  ShmAttachment attachment;
};

inline Handover HandOverShm(asio::io_context& io, uint64_t ring_capacity) {
  static shm::PendingOffers pending(shm::PendingOffers::kDefaultCap);  // outlives every io_context of the binary
  auto offer = ShmOffer::Create(io.get_executor(), ring_capacity, pending);
  EXPECT_TRUE(offer.ok()) << offer.status().ToString();
  bool handed = false, attached_done = false;
  std::optional<ShmAttachment> attachment;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Status st = co_await (*offer)->Handoff(std::chrono::steady_clock::now() + 10s);
    EXPECT_TRUE(st.ok()) << st.ToString();
    handed = true;
  }, asio::detached);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    auto a = co_await AttachShm(io.get_executor(), (*offer)->socket_name(), (*offer)->token(),
                                std::chrono::steady_clock::now() + 10s);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (a.ok()) attachment = std::move(*a);
    attached_done = true;
  }, asio::detached);
  RunUntil(io, [&] { return handed && attached_done; });
  return Handover{std::move(*offer), std::move(*attachment)};
}

// Both ends of a fresh shm connection, set up through the real handoff.
struct Pair {
  std::unique_ptr<transport::Channel> aggregator, worker;
  std::shared_ptr<Segment> segment;  // the worker's mapping, for tests that tamper with it
};

inline Pair ConnectShm(asio::io_context& io, uint64_t ring_capacity) {
  Handover handover = HandOverShm(io, ring_capacity);
  auto [a_socket, w_socket] = TcpPair(io);
  Pair pair;
  pair.segment = handover.attachment.segment;
  pair.aggregator = handover.offer->MakeChannel(std::move(a_socket), io.get_executor());
  pair.worker = handover.attachment.MakeChannel(std::move(w_socket), io.get_executor());
  return pair;
}

// A frame of `payload` bytes (header + bytes) whose job field is `seed` and whose payload bytes derive from it.
inline std::vector<std::byte> MakeFrame(uint32_t seed, uint32_t payload) {
  std::vector<std::byte> frame(kFrameHeaderSize + payload);
  const FrameHeader h{FrameType::kContribution, payload, 0, seed, 1, 0};
  EncodeFrameHeader(h, frame.data());
  std::mt19937 random(seed);
  for (uint32_t i = 0; i < payload; ++i) frame[kFrameHeaderSize + i] = static_cast<std::byte>(random());
  return frame;
}

// Sends `count` frames of random sizes up to `max_payload` as gather parts of up to `max_part` bytes each, and
// checks on the other end that every byte arrives, in order.
inline void ExchangeFrames(asio::io_context& io, transport::Channel& from, transport::Channel& to, int count,
                    uint32_t max_payload, bool* received_all, size_t max_part = 4096) {
  std::mt19937 sizes(count);
  std::vector<uint32_t> payloads;
  for (int i = 0; i < count; ++i) payloads.push_back(sizes() % (max_payload + 1));
  for (int i = 0; i < count; ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, payloads[i]));
    std::vector<asio::const_buffer> parts;
    for (size_t at = 0; at < frame->size();) {  // parts of 1..max_part bytes
      const size_t n = std::min<size_t>(frame->size() - at, 1 + (at * 7919 + i) % max_part);
      parts.push_back(asio::buffer(frame->data() + at, n));
      at += n;
    }
    from.Send(std::move(parts), frame);
  }
  asio::co_spawn(io, [&to, payloads, count, received_all]() -> asio::awaitable<void> {
    for (int i = 0; i < count; ++i) {
      Result<FrameHeader> header = co_await to.ReadHeader();
      EXPECT_TRUE(header.ok()) << header.status().ToString();
      if (!header.ok()) co_return;
      EXPECT_EQ(header->payload_length, payloads[i]);
      EXPECT_EQ(header->job, static_cast<uint64_t>(i));
      Result<ByteBuffer> payload = co_await to.ReadPayload(header->payload_length, nullptr);
      EXPECT_TRUE(payload.ok()) << payload.status().ToString();
      if (!payload.ok()) co_return;
      const std::vector<std::byte> expected = MakeFrame(i, payloads[i]);
      EXPECT_TRUE(payloads[i] == 0 ||  // an empty ByteBuffer has no data pointer
                  std::memcmp(payload->data(), expected.data() + kFrameHeaderSize, payloads[i]) == 0)
          << "frame " << i;
    }
    *received_all = true;
  }, asio::detached);
}

}  // namespace sparsereduce::testing
