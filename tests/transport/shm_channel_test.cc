// The shared-memory transport in one process: handoff, frames through the rings (also frames larger than a ring),
// end of stream, peer death through the TCP connection, hostile ring positions, segment checks and network
// namespaces. Every test runs its io_context for a bounded time.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <optional>
#include <random>

#include "protocol/frame.h"
#include "protocol/frame_format.h"
#include "transport/shm/channel.h"
#include "transport/shm/handoff.h"

namespace sparsereduce::shm {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;

// A connected pair of TCP sockets on 127.0.0.1 (the liveness connections of the two ends).
std::pair<tcp::socket, tcp::socket> TcpPair(asio::io_context& io) {
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
void RunUntil(asio::io_context& io, const bool& done, std::chrono::seconds bound = 20s) {
  RunUntil(io, [&done] { return done; }, bound);
}

// Both ends of a fresh shm connection, set up through the real handoff.
struct Pair {
  std::unique_ptr<transport::Channel> aggregator, worker;
  std::shared_ptr<Segment> segment;  // the worker's mapping, for tests that tamper with it
};

Pair Connect(asio::io_context& io, uint64_t ring_capacity) {
  auto offer = ShmOffer::Create(io.get_executor(), ring_capacity);
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
  auto [a_socket, w_socket] = TcpPair(io);
  Pair pair;
  pair.segment = attachment->segment;
  pair.aggregator = (*offer)->MakeChannel(std::move(a_socket), io.get_executor());
  pair.worker = attachment->MakeChannel(std::move(w_socket), io.get_executor());
  return pair;
}

// A frame of `payload` bytes (header + bytes) whose job field is `seed` and whose payload bytes derive from it.
std::vector<std::byte> MakeFrame(uint32_t seed, uint32_t payload) {
  std::vector<std::byte> frame(kFrameHeaderSize + payload);
  const FrameHeader h{FrameType::kContribution, payload, 0, seed, 1, 0};
  EncodeFrameHeader(h, frame.data());
  std::mt19937 random(seed);
  for (uint32_t i = 0; i < payload; ++i) frame[kFrameHeaderSize + i] = static_cast<std::byte>(random());
  return frame;
}

// Sends `count` frames of random sizes (some larger than the ring) as several gather parts each, and checks on the
// other end that every byte arrives, in order.
void ExchangeFrames(asio::io_context& io, transport::Channel& from, transport::Channel& to, int count,
                    uint32_t max_payload, bool* received_all) {
  std::mt19937 sizes(count);
  std::vector<uint32_t> payloads;
  for (int i = 0; i < count; ++i) payloads.push_back(sizes() % (max_payload + 1));
  for (int i = 0; i < count; ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, payloads[i]));
    std::vector<asio::const_buffer> parts;
    for (size_t at = 0; at < frame->size();) {  // parts of 1..4096 bytes
      const size_t n = std::min<size_t>(frame->size() - at, 1 + (at * 7919 + i) % 4096);
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
      EXPECT_EQ(std::memcmp(payload->data(), expected.data() + kFrameHeaderSize, payloads[i]), 0) << "frame " << i;
    }
    *received_all = true;
  }, asio::detached);
}

TEST(ShmChannel, FramesArriveIntactAndInOrderBothWays) {
  asio::io_context io;
  Pair pair = Connect(io, 4096);  // the smallest ring: most frames wrap around it or are larger than it
  EXPECT_STREQ(pair.worker->kind(), "shm");
  bool up = false, down = false;
  ExchangeFrames(io, *pair.worker, *pair.aggregator, 300, 20000, &up);
  ExchangeFrames(io, *pair.aggregator, *pair.worker, 300, 20000, &down);
  RunUntil(io, [&] { return up && down; });
  EXPECT_TRUE(pair.worker->idle());
  EXPECT_TRUE(pair.aggregator->idle());
}

TEST(ShmChannel, CloseAfterFlushDeliversEverythingThenEndOfStream) {
  asio::io_context io;
  Pair pair = Connect(io, 8192);
  bool received = false, ended = false;
  ExchangeFrames(io, *pair.worker, *pair.aggregator, 20, 30000, &received);
  pair.worker->CloseAfterFlush(/*both=*/false);
  RunUntil(io, received);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_EQ(header.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(header.status().message(), "connection closed by peer");
    ended = true;
  }, asio::detached);
  RunUntil(io, ended);
}

TEST(ShmChannel, PeerDeathSeenThroughTcpAfterWhatItWrote) {
  asio::io_context io;
  Pair pair = Connect(io, 8192);
  bool received = false, ended = false;
  ExchangeFrames(io, *pair.worker, *pair.aggregator, 5, 3000, &received);
  RunUntil(io, received);
  // One more frame, then the worker "dies": its TCP connection closes, its ring end is never closed.
  std::optional<Status> error;
  pair.aggregator->set_error_handler([&](const Status& st) { error = st; });
  auto last = std::make_shared<std::vector<std::byte>>(MakeFrame(9, 100));
  pair.worker->Send({asio::buffer(*last)}, last);
  pair.worker->Abort();
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();  // the frame written before is still read
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    if (header.ok()) {
      EXPECT_TRUE((co_await pair.aggregator->Discard(header->payload_length)).ok());
    }
    Result<FrameHeader> next = co_await pair.aggregator->ReadHeader();
    EXPECT_EQ(next.status().code(), StatusCode::kUnavailable) << next.status().ToString();
    ended = true;
  }, asio::detached);
  RunUntil(io, ended);
  // Sending to a dead peer reports an error instead of waiting for space forever.
  for (int i = 0; i < 10; ++i) pair.aggregator->Send(ByteBuffer(6000));  // more than the ring holds
  RunUntil(io, [&] { return error.has_value(); });
  EXPECT_EQ(error->code(), StatusCode::kUnavailable);
}

TEST(ShmChannel, FrameCutShortIsAProtocolError) {
  asio::io_context io;
  Pair pair = Connect(io, 8192);
  std::vector<std::byte> frame = MakeFrame(1, 5000);
  frame.resize(kFrameHeaderSize + 100);  // the header promises 5000 payload bytes
  auto owner = std::make_shared<std::vector<std::byte>>(frame);
  pair.worker->Send({asio::buffer(*owner)}, owner);
  pair.worker->CloseAfterFlush(false);
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    Result<ByteBuffer> payload = co_await pair.aggregator->ReadPayload(header->payload_length, nullptr);
    EXPECT_EQ(payload.status().code(), StatusCode::kProtocolViolation);
    EXPECT_NE(payload.status().message().find("closed inside a frame (100 of 5000 bytes)"), std::string::npos)
        << payload.status().ToString();
    done = true;
  }, asio::detached);
  RunUntil(io, done);
}

TEST(ShmChannel, HostilePositionsFailTheChannelWithoutCrashing) {
  asio::io_context io;
  Pair pair = Connect(io, 4096);
  // The worker's side of the segment claims more bytes than the ring holds.
  RingControl& to_aggregator = pair.segment->control(Direction::kToAggregator);
  to_aggregator.head.store(1'000'000);
  std::optional<Status> read;
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    read = header.status();
    done = true;
  }, asio::detached);
  RunUntil(io, done);
  EXPECT_EQ(read->code(), StatusCode::kProtocolViolation);
  EXPECT_NE(read->message().find("ring positions out of order"), std::string::npos) << read->ToString();
}

TEST(ShmChannel, HostileTailFailsTheSendingSide) {
  asio::io_context io;
  Pair pair = Connect(io, 4096);
  // The worker moves the tail of the aggregator's send ring past anything written.
  pair.segment->control(Direction::kToWorker).tail.store(~uint64_t{0});
  std::optional<Status> error;
  pair.aggregator->set_error_handler([&](const Status& st) { error = st; });
  pair.aggregator->Send(ByteBuffer(100));
  RunUntil(io, [&] { return error.has_value(); });
  EXPECT_EQ(error->code(), StatusCode::kProtocolViolation);
}

TEST(ShmHandoff, WrongTokenIsIgnoredAndTheRightOneServed) {
  asio::io_context io;
  auto offer = ShmOffer::Create(io.get_executor(), 4096);
  ASSERT_TRUE(offer.ok()) << offer.status().ToString();
  std::optional<Status> handoff, stranger;
  std::optional<bool> attached;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    handoff = co_await (*offer)->Handoff(std::chrono::steady_clock::now() + 10s);
  }, asio::detached);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    // A stranger who knows the socket name (it is visible in /proc/net/unix) but not the token gets nothing.
    auto a = co_await AttachShm(io.get_executor(), (*offer)->socket_name(), std::string(kTokenBytes, 'x'),
                                std::chrono::steady_clock::now() + 1s);
    stranger = a.status();
    auto b = co_await AttachShm(io.get_executor(), (*offer)->socket_name(), (*offer)->token(),
                                std::chrono::steady_clock::now() + 10s);
    attached = b.ok();
  }, asio::detached);
  RunUntil(io, [&] { return handoff && attached; });
  EXPECT_FALSE(stranger->ok());
  EXPECT_TRUE(handoff->ok()) << handoff->ToString();
  EXPECT_TRUE(*attached);
}

TEST(ShmHandoff, DeadlineAndUnreachableSocket) {
  asio::io_context io;
  auto offer = ShmOffer::Create(io.get_executor(), 4096);
  ASSERT_TRUE(offer.ok());
  std::optional<Status> handoff, attach;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    handoff = co_await (*offer)->Handoff(std::chrono::steady_clock::now() + 200ms);
  }, asio::detached);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    auto a = co_await AttachShm(io.get_executor(), "sparsereduce/no-such-socket", std::string(kTokenBytes, 'x'),
                                std::chrono::steady_clock::now() + 2s);
    attach = a.status();
  }, asio::detached);
  RunUntil(io, [&] { return handoff && attach; });
  EXPECT_EQ(handoff->code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(attach->code(), StatusCode::kUnavailable);
  EXPECT_NE(attach->message().find("another host"), std::string::npos) << attach->ToString();
}

// A worker in another network namespace cannot reach the offer, which is how "same host" is decided.
TEST(ShmHandoff, UnreachableFromAnotherNetworkNamespace) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a network namespace";
  asio::io_context io;
  auto offer = ShmOffer::Create(io.get_executor(), 4096);
  ASSERT_TRUE(offer.ok());
  const std::string name = (*offer)->socket_name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    asio::io_context child_io;
    asio::local::stream_protocol::socket s(child_io);
    boost::system::error_code ec;
    s.connect(asio::local::stream_protocol::endpoint(std::string(1, '\0') + name), ec);
    _exit(ec ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "unshare(CLONE_NEWNET) not permitted here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the abstract socket was reachable from another network namespace";
}

TEST(ShmSegment, AttachChecksSealsSizeAndHeader) {
  auto created = Segment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(Segment::Attach(created->second).ok());

  SegmentFds unsealed;
  unsealed.memory = UniqueFd(memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(unsealed.memory.get(), static_cast<off_t>(Segment::SizeFor(4096))), 0);
  auto a = Segment::Attach(unsealed);
  EXPECT_EQ(a.status().code(), StatusCode::kProtocolViolation);
  EXPECT_NE(a.status().message().find("not sealed"), std::string::npos);

  for (const char* what : {"magic", "size"}) {
    SegmentFds bad;
    bad.memory = UniqueFd(memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    const uint64_t size = std::string(what) == "size" ? Segment::SizeFor(4096) + 4096 : Segment::SizeFor(4096);
    ASSERT_EQ(ftruncate(bad.memory.get(), static_cast<off_t>(size)), 0);
    std::vector<char> header(64, 0);
    if (std::string(what) == "size") {
      // A valid header from a real segment, on a file of the wrong size.
      ASSERT_EQ(pread(created->second.memory.get(), header.data(), header.size(), 0), 64);
    } else {
      std::memcpy(header.data(), "NOTMAGIC", 8);
    }
    ASSERT_EQ(pwrite(bad.memory.get(), header.data(), header.size(), 0), 64);
    ASSERT_EQ(fcntl(bad.memory.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    auto attached = Segment::Attach(bad);
    EXPECT_EQ(attached.status().code(), StatusCode::kProtocolViolation) << what;
  }
}

}  // namespace
}  // namespace sparsereduce::shm
