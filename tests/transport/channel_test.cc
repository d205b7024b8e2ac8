// What every transport::Channel does, run over each transport (as Gloo parameterizes its transport tests): frames
// of any size and any number of gather parts arrive intact and in order, Discard skips exactly one payload,
// ReadInto scatters a payload exactly, end of stream after a flush, a frame cut short is a protocol error (read,
// scattered or dropped), DropQueued keeps the stream framed. Then what is particular to TCP's read-ahead reader and
// gathering writer.
// Every test runs its io_context for a bounded time.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "channel_test_util.h"
#include "transport/descriptor.h"
#include "transport/tcp/channel.h"

namespace sparsereduce::testing {
namespace {

Pair Connect(asio::io_context& io, const std::string& kind) {
  if (kind == "shm") return ConnectShm(io, 64 * 1024);
  auto [a, w] = TcpPair(io);
  Pair pair;
  pair.aggregator = std::make_unique<sparsereduce::tcp::TcpChannel>(std::move(a), io.get_executor());
  pair.worker = std::make_unique<sparsereduce::tcp::TcpChannel>(std::move(w), io.get_executor());
  return pair;
}

// Reads frames until end of stream; each must be one MakeFrame made, with consecutive seeds from `first`.
asio::awaitable<void> ReadUntilEnd(transport::Channel& from, uint32_t first, uint32_t* frames, Status* end) {
  for (uint32_t i = first;; ++i) {
    Result<FrameHeader> header = co_await from.ReadHeader();
    if (!header.ok()) {
      *end = header.status();
      co_return;
    }
    Result<ByteBuffer> payload = co_await from.ReadPayload(header->payload_length, nullptr);
    if (!payload.ok()) {
      *end = payload.status();
      co_return;
    }
    EXPECT_EQ(header->job, i);
    const std::vector<std::byte> expected = MakeFrame(i, header->payload_length);
    EXPECT_TRUE(payload->size() == 0 ||
                std::memcmp(payload->data(), expected.data() + kFrameHeaderSize, payload->size()) == 0)
        << "frame " << i;
    ++*frames;
  }
}

class ChannelTest : public ::testing::TestWithParam<std::string> {
 protected:
  asio::io_context io_;
};

TEST_P(ChannelTest, FramesArriveIntactAndInOrderBothWays) {
  Pair pair = Connect(io_, GetParam());
  EXPECT_EQ(pair.worker->kind(), GetParam());
  bool up = false, down = false;
  // Payloads up to 300 KB: several times the shm ring, TCP's read-ahead buffer and a socket buffer, so reads
  // and writes stop and resume mid-frame.
  ExchangeFrames(io_, *pair.worker, *pair.aggregator, 300, 300000, &up);
  ExchangeFrames(io_, *pair.aggregator, *pair.worker, 300, 300000, &down);
  RunUntil(io_, [&] { return up && down; });
  EXPECT_TRUE(pair.worker->idle());
  EXPECT_TRUE(pair.aggregator->idle());
}

TEST_P(ChannelTest, SmallFramesAndFramesOfThousandsOfParts) {
  Pair pair = Connect(io_, GetParam());
  bool small = false, many_parts = false;
  ExchangeFrames(io_, *pair.worker, *pair.aggregator, 2000, 64, &small);  // many frames per read
  // Parts of 1..16 bytes: a 40 KB frame has thousands, more than one sendmsg takes (IOV_MAX).
  ExchangeFrames(io_, *pair.aggregator, *pair.worker, 50, 40000, &many_parts, /*max_part=*/16);
  RunUntil(io_, [&] { return small && many_parts; });
}

// A reader that keeps the payloads ReadPayloadLent gives it (as the daemon's engine keeps frames until their
// blocks are aggregated) and lets them go in random order, or all at once when the channel recalls them: every
// payload still holds its frame's bytes when it is let go, so no byte of the ring was given back to the writer
// while lent. Frames of up to 12 KB through a 64 KiB shm ring, so loans hold the writer back and are recalled.
TEST_P(ChannelTest, LentPayloadsStayIntactUntilLetGo) {
  Pair pair = Connect(io_, GetParam());
  constexpr int kFrames = 3000;
  std::mt19937 random(11);
  std::vector<uint32_t> sizes;
  for (int i = 0; i < kFrames; ++i) sizes.push_back(random() % 12000);
  for (int i = 0; i < kFrames; ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, sizes[i]));
    pair.worker->Send({asio::buffer(*frame)}, frame);
  }
  struct Held {
    int seed;
    ByteBuffer payload;
  };
  std::vector<Held> held;
  int lent = 0, recalls = 0, checked = 0;
  auto let_go = [&](size_t i) {
    const std::vector<std::byte> expected = MakeFrame(held[i].seed, sizes[held[i].seed]);
    EXPECT_TRUE(held[i].payload.size() == 0 || std::memcmp(held[i].payload.data(), expected.data() + kFrameHeaderSize,
                                                           held[i].payload.size()) == 0)
        << "frame " << held[i].seed << " changed while it was held";
    ++checked;
    held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
  };
  pair.aggregator->set_recall_handler([&] {
    ++recalls;
    while (!held.empty()) let_go(held.size() - 1);
  });
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < kFrames; ++i) {
      Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
      EXPECT_TRUE(header.ok()) << header.status().ToString();
      if (!header.ok()) co_return;
      EXPECT_EQ(header->job, static_cast<uint64_t>(i));
      Result<ByteBuffer> payload = co_await pair.aggregator->ReadPayloadLent(header->payload_length, nullptr);
      EXPECT_TRUE(payload.ok()) << payload.status().ToString();
      if (!payload.ok()) co_return;
      EXPECT_EQ(payload->size(), sizes[i]);
      if (payload->on_loan()) ++lent;
      held.push_back({i, std::move(*payload)});
      // Let some go, at random places, keeping up to 20 (a window of frames waiting for other ranks).
      while (held.size() > 20 || (!held.empty() && random() % 3 == 0)) let_go(random() % held.size());
    }
    while (!held.empty()) let_go(0);
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
  EXPECT_EQ(checked, kFrames);
  if (GetParam() == "shm") {
    EXPECT_GT(lent, kFrames / 2);  // the rest wrapped around the ring's end, or waited for a recall
    EXPECT_GT(recalls, 0);
  } else {
    EXPECT_EQ(lent, 0);  // TCP has no memory to lend
  }
}

TEST_P(ChannelTest, DiscardSkipsExactlyOnePayload) {
  Pair pair = Connect(io_, GetParam());
  for (uint32_t i = 0; i < 3; ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, i == 1 ? 200000 : 1000));
    pair.worker->Send({asio::buffer(*frame)}, frame);
  }
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    for (uint32_t i = 0; i < 3; ++i) {
      Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
      EXPECT_TRUE(header.ok()) << header.status().ToString();
      if (!header.ok()) co_return;
      EXPECT_EQ(header->job, i);
      if (i == 1) {
        EXPECT_TRUE((co_await pair.aggregator->Discard(header->payload_length)).ok());
        continue;
      }
      Result<ByteBuffer> payload = co_await pair.aggregator->ReadPayload(header->payload_length, nullptr);
      EXPECT_TRUE(payload.ok());
      if (!payload.ok()) co_return;
      EXPECT_EQ(std::memcmp(payload->data(), MakeFrame(i, 1000).data() + kFrameHeaderSize, 1000), 0);
    }
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
}

// ReadInto places a payload's bytes into scattered targets exactly (as a worker reads a RESULT's blocks into the
// tensor): targets of 0..40000 bytes, payloads larger than the shm ring and TCP's read-ahead buffer, between
// frames read whole, so that read-ahead bytes are consumed first and what follows is caught for the next frame.
TEST_P(ChannelTest, ReadIntoScattersAPayloadExactly) {
  Pair pair = Connect(io_, GetParam());
  const std::vector<uint32_t> sizes = {1000, 300000, 64, 150000, 24, 0, 70000};
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, sizes[i]));
    pair.worker->Send({asio::buffer(*frame)}, frame);
  }
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    for (uint32_t i = 0; i < sizes.size(); ++i) {
      Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
      EXPECT_TRUE(header.ok()) << header.status().ToString();
      if (!header.ok()) co_return;
      EXPECT_EQ(header->job, i);
      const std::vector<std::byte> expected = MakeFrame(i, sizes[i]);
      std::vector<std::byte> got(sizes[i] + 64, std::byte{0xEE});  // a gap of 8 bytes after every target
      std::vector<asio::mutable_buffer> targets;
      std::vector<std::pair<size_t, size_t>> placed;  // (offset in got, bytes)
      size_t at = 0, left = sizes[i];
      for (uint32_t k = 0; left > 0 || k == 0; ++k) {
        const size_t n = k % 5 == 3 ? 0 : std::min<size_t>(left, (k * 7919 + 13) % 40001);
        if (at + n + 8 > got.size()) got.resize(at + n + 8, std::byte{0xEE});
        placed.emplace_back(at, n);
        at += n + 8;
        left -= n;
      }
      for (auto [offset, n] : placed) targets.push_back(asio::buffer(got.data() + offset, n));
      Status st = co_await pair.aggregator->ReadInto(targets);
      EXPECT_TRUE(st.ok()) << st.ToString();
      size_t from = kFrameHeaderSize;
      for (auto [offset, n] : placed) {
        EXPECT_EQ(std::memcmp(got.data() + offset, expected.data() + from, n), 0) << "frame " << i << " at " << from;
        for (size_t g = 0; g < 8; ++g) EXPECT_EQ(got[offset + n + g], std::byte{0xEE}) << "wrote into a gap";
        from += n;
      }
    }
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
}

TEST_P(ChannelTest, ReadIntoAFrameCutShortIsAClosedConnectionSayingWhere) {
  Pair pair = Connect(io_, GetParam());
  std::vector<std::byte> frame = MakeFrame(1, 5000);
  frame.resize(kFrameHeaderSize + 100);  // the header promises 5000 payload bytes
  auto owner = std::make_shared<std::vector<std::byte>>(frame);
  pair.worker->Send({asio::buffer(*owner)}, owner);
  pair.worker->CloseAfterFlush(false);
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    std::vector<std::byte> a(60), b(header->payload_length - 60);
    const std::array targets{asio::buffer(a), asio::buffer(b)};
    Status st = co_await pair.aggregator->ReadInto(targets);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("closed inside a frame"), std::string::npos) << st.ToString();
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
}

// A stream that ends inside a frame says so also while the frame is dropped (a daemon drains a job's frames after an
// abort); TCP's reader called it a plain close.
TEST_P(ChannelTest, DiscardOfAFrameCutShortSaysWhere) {
  Pair pair = Connect(io_, GetParam());
  std::vector<std::byte> frame = MakeFrame(1, 5000);
  frame.resize(kFrameHeaderSize + 100);  // the header promises 5000 payload bytes
  auto owner = std::make_shared<std::vector<std::byte>>(frame);
  pair.worker->Send({asio::buffer(*owner)}, owner);
  pair.worker->CloseAfterFlush(false);
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    Status st = co_await pair.aggregator->Discard(header->payload_length);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("closed inside a frame"), std::string::npos) << st.ToString();
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
}

TEST_P(ChannelTest, CloseAfterFlushDeliversEverythingThenEndOfStream) {
  Pair pair = Connect(io_, GetParam());
  bool received = false, ended = false;
  ExchangeFrames(io_, *pair.worker, *pair.aggregator, 20, 30000, &received);
  pair.worker->CloseAfterFlush(/*both=*/false);
  RunUntil(io_, received);
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_EQ(header.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(header.status().message(), "connection closed by peer");
    ended = true;
  }, asio::detached);
  RunUntil(io_, ended);
}

// A peer that follows the protocol never ends its stream inside a frame: this is one killed while writing, a
// close (UNAVAILABLE, docs/PROTOCOL.md §3) that says where it was cut. It was a PROTOCOL_VIOLATION, so a killed
// aggregator was reported as a protocol bug or as a close depending on when it died.
TEST_P(ChannelTest, FrameCutShortIsAClosedConnectionSayingWhere) {
  Pair pair = Connect(io_, GetParam());
  std::vector<std::byte> frame = MakeFrame(1, 5000);
  frame.resize(kFrameHeaderSize + 100);  // the header promises 5000 payload bytes
  auto owner = std::make_shared<std::vector<std::byte>>(frame);
  pair.worker->Send({asio::buffer(*owner)}, owner);
  pair.worker->CloseAfterFlush(false);
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await pair.aggregator->ReadHeader();
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    Result<ByteBuffer> payload = co_await pair.aggregator->ReadPayload(header->payload_length, nullptr);
    EXPECT_EQ(payload.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(payload.status().message().find("closed inside a frame"), std::string::npos)
        << payload.status().ToString();
    EXPECT_NE(payload.status().message().find("100 of 5000 bytes"), std::string::npos) << payload.status().ToString();
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
}

TEST_P(ChannelTest, DropQueuedKeepsTheStreamFramed) {
  Pair pair = Connect(io_, GetParam());
  // Nobody reads yet, so the frames back up: some are written (maybe one partly), the rest stay queued.
  for (uint32_t i = 0; i < 400; ++i) {
    auto frame = std::make_shared<std::vector<std::byte>>(MakeFrame(i, 50000));
    pair.worker->Send({asio::buffer(*frame)}, frame);
  }
  ASSERT_FALSE(pair.worker->idle()) << "20 MB should not fit in the transport's buffers";
  pair.worker->DropQueued();
  pair.worker->CloseAfterFlush(false);
  uint32_t frames = 0;
  Status end;
  bool done = false;
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    co_await ReadUntilEnd(*pair.aggregator, 0, &frames, &end);
    done = true;
  }, asio::detached);
  RunUntil(io_, done);
  // Every frame that arrived is whole, and the stream ends cleanly after the last one.
  EXPECT_EQ(end.message(), "connection closed by peer") << end.ToString();
  EXPECT_GT(frames, 0u);
  EXPECT_LT(frames, 400u);
  EXPECT_TRUE(pair.worker->idle());
}

INSTANTIATE_TEST_SUITE_P(Transports, ChannelTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// --- TCP only ---

TEST(TcpChannel, HeaderCutShortIsAClosedConnectionSayingWhere) {
  asio::io_context io;
  auto [raw, other] = TcpPair(io);
  sparsereduce::tcp::TcpChannel channel(std::move(other), io.get_executor());
  const std::vector<std::byte> frame = MakeFrame(1, 0);
  asio::write(raw, asio::buffer(frame.data(), 20));
  raw.shutdown(tcp::socket::shutdown_send);
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await channel.ReadHeader();
    EXPECT_EQ(header.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(header.status().message(), "connection closed inside a frame header (20 bytes)");
    done = true;
  }, asio::detached);
  RunUntil(io, done);
}

TEST(TcpChannel, ReleaseSocketRefusesBytesThatFollowTheLastFrame) {
  asio::io_context io;
  auto [raw, other] = TcpPair(io);
  sparsereduce::tcp::TcpChannel channel(std::move(other), io.get_executor());
  // One frame and, in the same write, 7 bytes after it: the reader's read-ahead takes them in with the frame.
  std::vector<std::byte> bytes = MakeFrame(1, 100);
  bytes.resize(bytes.size() + 7);
  asio::write(raw, asio::buffer(bytes));
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await channel.ReadHeader();
    EXPECT_TRUE(header.ok());
    EXPECT_TRUE((co_await channel.ReadPayload(100, nullptr)).ok());
    done = true;
  }, asio::detached);
  RunUntil(io, done);
  Result<sparsereduce::tcp::Socket> socket = channel.ReleaseSocket();
  EXPECT_EQ(socket.status().code(), StatusCode::kProtocolViolation);
  EXPECT_NE(socket.status().message().find("7 bytes arrived on TCP"), std::string::npos) << socket.status().ToString();

  // Without anything after the frame, the socket comes back.
  auto [raw2, other2] = TcpPair(io);
  sparsereduce::tcp::TcpChannel clean(std::move(other2), io.get_executor());
  asio::write(raw2, asio::buffer(MakeFrame(2, 100)));
  done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE((co_await clean.ReadHeader()).ok());
    EXPECT_TRUE((co_await clean.ReadPayload(100, nullptr)).ok());
    done = true;
  }, asio::detached);
  RunUntil(io, done);
  EXPECT_TRUE(clean.ReleaseSocket().ok());
}

// A payload whose first part is there when the reader starts and whose rest trickles in piece by piece, with the
// connection left open and nothing after it for a while, is read completely, and so is a frame header that arrives
// alone afterwards. (A reader that waited for more bytes than are still missing, e.g. through a socket low-water
// mark, would hang here.)
TEST(TcpChannel, PayloadTricklingInAndALoneHeaderAfterItAreRead) {
  asio::io_context io;
  auto [raw_socket, other] = TcpPair(io);
  tcp::socket& raw = raw_socket;  // a lambda may not capture a structured binding before clang 16
  sparsereduce::tcp::TcpChannel channel(std::move(other), io.get_executor());
  constexpr uint32_t kPayload = 300'000;
  const std::vector<std::byte> frame = MakeFrame(5, kPayload);
  // More than the read-ahead buffer is already there, so the reader's first receive takes part of the payload.
  // The last piece is large: what a reader waits for before it is much more than a header.
  const std::vector<size_t> cuts = {100'000, 150'000, 150'001, 150'101, frame.size()};
  asio::write(raw, asio::buffer(frame.data(), cuts[0]));
  bool written = false, done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    asio::steady_timer pause(io);
    for (size_t i = 1; i < cuts.size(); ++i) {
      pause.expires_after(2ms);  // the reader takes what is there and waits again
      co_await pause.async_wait(asio::use_awaitable);
      co_await asio::async_write(raw, asio::buffer(frame.data() + cuts[i - 1], cuts[i] - cuts[i - 1]),
                                 asio::use_awaitable);
    }
    pause.expires_after(2ms);
    co_await pause.async_wait(asio::use_awaitable);
    co_await asio::async_write(raw, asio::buffer(MakeFrame(6, 0)), asio::use_awaitable);
    written = true;
  }, asio::detached);
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    Result<FrameHeader> header = co_await channel.ReadHeader();
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    Result<ByteBuffer> payload = co_await channel.ReadPayload(kPayload, nullptr);
    EXPECT_TRUE(payload.ok()) << payload.status().ToString();
    if (payload.ok()) {
      EXPECT_EQ(std::memcmp(payload->data(), frame.data() + kFrameHeaderSize, kPayload), 0);
    }
    Result<FrameHeader> next = co_await channel.ReadHeader();
    EXPECT_TRUE(next.ok() && next->job == 6 && next->payload_length == 0) << next.status().ToString();
    done = true;
  }, asio::detached);
  RunUntil(io, [&] { return written && done; });
}

TEST(TcpChannel, WriteErrorIsReportedOnceAndLater) {
  asio::io_context io;
  auto [raw, other] = TcpPair(io);
  sparsereduce::tcp::TcpChannel channel(std::move(other), io.get_executor());
  int errors = 0;
  bool in_send = false, error_inside_send = false;
  channel.set_error_handler([&](const Status& st) {
    ++errors;
    error_inside_send = error_inside_send || in_send;
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  });
  raw.close();  // the peer is gone: writes fail with a reset or a broken pipe
  for (int i = 0; i < 200 && errors == 0; ++i) {
    in_send = true;
    channel.Send(ByteBuffer(100000));
    in_send = false;
    io.restart();
    io.run_for(5ms);
  }
  RunUntil(io, [&] { return errors > 0; });
  for (int i = 0; i < 5; ++i) channel.Send(ByteBuffer(1000));  // ignored after the failure
  io.restart();
  io.run_for(20ms);
  EXPECT_EQ(errors, 1);
  EXPECT_FALSE(error_inside_send) << "the error handler ran inside Send";
  EXPECT_TRUE(channel.idle());
}

// The review's finding L2: RdmaChannel built its event descriptor as stream_descriptor(executor, dup(fd)), which
// throws (inside a detached coroutine: the connection vanished without a word) when dup fails or epoll refuses the
// descriptor. AssignDuplicate reports both as a Status naming the operation. (The RDMA channel needs a device to
// construct, so its helper is tested here.)
TEST(AssignDuplicate, FailuresAreReportedNamingTheOperation) {
  asio::io_context io;
  asio::posix::stream_descriptor descriptor(io);
  Status bad = transport::AssignDuplicate(descriptor, -1, "the test channel");
  EXPECT_EQ(bad.code(), StatusCode::kUnavailable);
  EXPECT_NE(bad.message().find("dup of the test channel"), std::string::npos) << bad.ToString();
  EXPECT_FALSE(descriptor.is_open());

  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  EXPECT_TRUE(transport::AssignDuplicate(descriptor, sockets[0], "the test channel").ok());
  EXPECT_TRUE(descriptor.is_open());
  EXPECT_NE(descriptor.native_handle(), sockets[0]);  // a duplicate: the owner's descriptor stays its own
  // Refused by the event loop's side (here: already open; epoll's own refusals take the same path).
  const int watched = descriptor.native_handle();
  Status refused = transport::AssignDuplicate(descriptor, sockets[1], "the test channel");
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("watching the test channel on the event loop"), std::string::npos)
      << refused.ToString();
  EXPECT_EQ(descriptor.native_handle(), watched);
  close(sockets[0]);
  close(sockets[1]);
}

}  // namespace
}  // namespace sparsereduce::testing
