// sparsereduce-bw: point-to-point transport throughput, in the style of perftest's ib_write_bw, so a user can check
// a link (or the shared-memory path) before blaming the allreduce. The client streams data frames (the real frame
// format) through a transport::Channel, the same one the worker library and the daemon use; the server checks every
// header and acknowledges every window of frames, from which peak and average rates follow.
//
//   server: sparsereduce-bw [-p PORT] [-d DEVICE -i PORT -x GID_INDEX]
//   client: sparsereduce-bw [-p PORT] [--transport tcp|shm|rdma] [-d DEVICE -i PORT -x GID_INDEX] [-s SIZE | -a]
//                           [-n ITERS | -D SECONDS] [--report_gbits] SERVER
//
// The client names the transport in a Hello over TCP; the server offers it exactly as the daemon does (docs/PROTOCOL.md
// §10): shm needs client and server on one host, rdma an RDMA NIC on both (-d/-i/-x as in perftest).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <thread>

#include "protocol/control.h"
#include "protocol/frame.h"
#include "tools/common/cli_checks.h"
#include "tools/common/size_parse.h"
#include "transport/shm/handoff.h"
#include "transport/tcp/channel.h"
#if SPARSEREDUCE_HAVE_RDMA
#include "transport/rdma/channel.h"
#endif

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using sparsereduce::ByteBuffer;
using sparsereduce::FrameHeader;
using sparsereduce::FrameType;
using sparsereduce::Result;
using sparsereduce::Status;
using sparsereduce::transport::Channel;

constexpr uint32_t kWindows = 16;  // acknowledgements per test; the peak is the best window

// Frames per acknowledgement, the same on both sides; rounded up, so a test has at most kWindows of them (1000
// frames had 17).
uint64_t AckWindow(uint64_t frames) { return (frames + kWindows - 1) / kWindows; }

void Check(const Status& st, const std::string& what);
constexpr auto kSetupTimeout = std::chrono::seconds(10);

struct Config {
  uint16_t port = 18515;  // perftest's default
  std::string size = "64K";
  bool all_sizes = false;
  uint64_t iters = 1000;
  std::optional<std::string> duration_text;  // -D as given; none: run -n messages
  double duration = 0;        // -D in seconds, checked by ParseDuration; 0: run -n messages
  bool gbits = false;
  std::string transport = "tcp";
  std::string server;
  std::string rdma_device;
  uint32_t rdma_port = 1;
  int32_t gid_index = -1;
  uint64_t timeout_ms = 10000;  // how long the peer may stay silent (Silence)
};

using sparsereduce::tools::kMaxTimeoutMs;  // --timeout-ms, as the aggregator's and sparsereduce-perf's

constexpr uint64_t kRingBytes = 4u << 20;
constexpr double kMaxDurationSeconds = 86400;  // -D: a day per size is more than any link check needs

// Parses -D: a finite number of seconds above 0 and at most a day. An out-of-range double would be cast to an
// undefined uint64 frame count, and NaN or a negative value fell back to -n without a word.
bool ParseDuration(Config& c) {
  if (!c.duration_text) return true;
  const std::string& text = *c.duration_text;
  // strtod, not from_chars: out of range it gives HUGE_VAL (too large) or about 0 (too small), which the checks
  // below report as such.
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0]))) {
    std::fprintf(stderr, "sparsereduce-bw: -D '%s' is not a number of seconds\n", text.c_str());
    return false;
  }
  if (!(value > 0)) {  // also NaN
    std::fprintf(stderr, "sparsereduce-bw: -D %s: the duration must be a number of seconds above 0\n", text.c_str());
    return false;
  }
  if (!(value <= kMaxDurationSeconds)) {
    std::fprintf(stderr, "sparsereduce-bw: -D %s: the duration is at most %.0f seconds (a day) per size\n",
                 text.c_str(), kMaxDurationSeconds);
    return false;
  }
  c.duration = value;
  return true;
}

#if SPARSEREDUCE_HAVE_RDMA
std::unique_ptr<sparsereduce::rdma::RdmaConnection> RdmaConnection(const Config& c) {
  auto device = sparsereduce::rdma::RdmaDevice::Open(
      {c.rdma_device, static_cast<uint8_t>(c.rdma_port), c.gid_index}, 2 * kRingBytes);
  Check(device.status(), "RDMA");
  auto connection = sparsereduce::rdma::RdmaConnection::Create(*device, kRingBytes);
  Check(connection.status(), "RDMA");
  return std::move(*connection);
}
#endif

// Fails the tool with `what` when `st` is not ok.
void Check(const Status& st, const std::string& what) {
  if (!st.ok()) throw std::runtime_error(what + ": " + st.ToString());
}

asio::awaitable<sparsereduce::proto::ControlMessage> ReadControl(Channel& channel) {
  Result<FrameHeader> header = co_await channel.ReadHeader();
  Check(header.status(), "reading a control frame");
  if (header->type != FrameType::kControl || header->payload_length > sparsereduce::kMaxControlPayload) {
    throw std::runtime_error("expected a control frame");
  }
  Result<ByteBuffer> payload = co_await channel.ReadPayload(header->payload_length, nullptr);
  Check(payload.status(), "reading a control frame");
  Result<sparsereduce::proto::ControlMessage> message = sparsereduce::DecodeControl(payload->span());
  Check(message.status(), "decoding a control frame");
  co_return *message;
}

// Ends a wait for a peer that has gone silent (a listener that accepts and never answers, a server that hangs, a
// client that never says Hello), which lasted forever: the channel is aborted, and the read waiting on it fails,
// once for `patience` neither an answer came (Answered) nor a frame left the send queue. Checked every `patience`,
// so it ends the wait between one and two of them after the peer's last sign of life.
class Silence {
 public:
  Silence(const asio::any_io_executor& executor, Channel& channel, Clock::duration patience)
      : timer_(executor), channel_(channel), patience_(patience) {
    Arm();
  }
  ~Silence() {
    *alive_ = false;  // an expiry already queued does nothing
    timer_.cancel();
  }
  Silence(const Silence&) = delete;
  Silence& operator=(const Silence&) = delete;

  void Answered() { ++answers_; }
  // True once it has aborted the channel.
  bool expired() const { return expired_; }

 private:
  std::pair<uint64_t, size_t> Progress() const { return {answers_, channel_.queued_frames()}; }
  void Arm() {
    timer_.expires_after(patience_);
    timer_.async_wait([this, alive = alive_, before = Progress()](const boost::system::error_code& ec) {
      if (ec || !*alive) return;
      if (Progress() != before) return Arm();
      expired_ = true;
      channel_.Abort();
    });
  }

  asio::steady_timer timer_;
  Channel& channel_;
  const Clock::duration patience_;
  uint64_t answers_ = 0;
  bool expired_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// How long the server may stay silent while frames of `size` bytes go to it: --timeout-ms, plus a second per MiB of
// a frame (a frame of 4 GiB takes minutes on a slow link, and leaves the send queue only at its end).
Clock::duration Patience(const Config& c, uint64_t size) {
  return std::chrono::milliseconds(c.timeout_ms) + std::chrono::seconds(size >> 20);
}

// A control message, or nullopt when the peer stayed silent for `patience` first (Silence).
asio::awaitable<std::optional<sparsereduce::proto::ControlMessage>> ReadControlUnlessSilent(Channel& channel,
                                                                                          Clock::duration patience) {
  Silence silence(co_await asio::this_coro::executor, channel, patience);
  try {
    co_return co_await ReadControl(channel);
  } catch (const std::exception&) {
    if (!silence.expired()) throw;
  }
  co_return std::nullopt;
}

std::string ServerName(const Config& c) { return c.server + ":" + std::to_string(c.port); }

// Test parameters travel in a data frame's header fields: seq = frames to expect, job = frame payload bytes.
void SendParams(Channel& channel, uint64_t frames, uint64_t payload) {
  ByteBuffer bytes(sparsereduce::kFrameHeaderSize);
  sparsereduce::EncodeFrameHeader(FrameHeader{FrameType::kContribution, 0, 0, payload, frames, 0}, bytes.data());
  channel.Send(std::move(bytes));
}

void SendAck(Channel& channel) {
  ByteBuffer bytes(sparsereduce::kFrameHeaderSize);
  sparsereduce::EncodeFrameHeader(FrameHeader{FrameType::kResult, 0, 0, 0, 0, 0}, bytes.data());
  channel.Send(std::move(bytes));
}

tcp::socket TakeSocket(sparsereduce::tcp::TcpChannel& channel) {
  auto socket = channel.ReleaseSocket();
  Check(socket.status(), "moving the connection off TCP");
  return std::move(*socket);
}

// The server's end: the client's Hello names the transport, which is offered like the daemon does. A client that
// connects and stays silent fails the run after --timeout-ms (it held the server for good).
asio::awaitable<std::unique_ptr<Channel>> Accept(tcp::socket socket, Config c,
                                                 sparsereduce::shm::PendingOffers& pending, std::string* transport) {
  const auto executor = co_await asio::this_coro::executor;
  auto tcp_channel = std::make_unique<sparsereduce::tcp::TcpChannel>(std::move(socket), executor);
  const std::optional<sparsereduce::proto::ControlMessage> received =
      co_await ReadControlUnlessSilent(*tcp_channel, Patience(c, 0));
  if (!received) {
    throw std::runtime_error("the client sent no Hello within " + std::to_string(c.timeout_ms) +
                             " ms (--timeout-ms): is it a sparsereduce-bw client?");
  }
  const sparsereduce::proto::ControlMessage& hello = *received;
  *transport = hello.hello().transports_size() > 0 ? hello.hello().transports(0) : "tcp";
  if (*transport == "tcp") co_return tcp_channel;
#if SPARSEREDUCE_HAVE_RDMA
  if (*transport == "rdma") {
    auto connection = RdmaConnection(c);
    sparsereduce::proto::ControlMessage offer;
    offer.mutable_transport_offer()->set_kind("rdma");
    *offer.mutable_transport_offer()->mutable_rdma() = connection->LocalEndpoint();
    tcp_channel->Send(sparsereduce::EncodeControl(offer));
    const sparsereduce::proto::ControlMessage accept = co_await ReadControl(*tcp_channel);
    if (!accept.has_transport_accept()) throw std::runtime_error("the client did not accept the RDMA offer");
    Check(connection->Connect(accept.transport_accept().rdma()), "RDMA connection");
    co_return sparsereduce::rdma::RdmaConnection::MakeChannel(std::move(connection), TakeSocket(*tcp_channel),
                                                              executor);
  }
#endif
  if (*transport != "shm") throw std::runtime_error("the client asked for transport " + *transport);
  auto offer = sparsereduce::shm::ShmOffer::Create(executor, kRingBytes, pending);
  Check(offer.status(), "creating the shm segment");
  sparsereduce::proto::ControlMessage message;
  message.mutable_transport_offer()->set_kind("shm");
  message.mutable_transport_offer()->set_shm_socket((*offer)->socket_name());
  message.mutable_transport_offer()->set_token((*offer)->token());
  tcp_channel->Send(sparsereduce::EncodeControl(message));
  Check(co_await (*offer)->Handoff(Clock::now() + kSetupTimeout),
        "shared-memory handoff (client and server must share a host)");
  co_return (*offer)->MakeChannel(TakeSocket(*tcp_channel), executor);
}

// The client's end.
asio::awaitable<std::unique_ptr<Channel>> Connect(tcp::socket socket, Config c) {
  const std::string& transport = c.transport;
  const auto executor = co_await asio::this_coro::executor;
#if SPARSEREDUCE_HAVE_RDMA
  // Checked before anything is sent, so a host without RDMA fails with the reason.
  std::unique_ptr<sparsereduce::rdma::RdmaConnection> rdma = transport == "rdma" ? RdmaConnection(c) : nullptr;
#else
  if (transport == "rdma") throw std::runtime_error("this build has no RDMA transport (libibverbs-dev was missing)");
#endif
  auto tcp_channel = std::make_unique<sparsereduce::tcp::TcpChannel>(std::move(socket), executor);
  sparsereduce::proto::ControlMessage hello;
  hello.mutable_hello()->add_transports(transport);
  tcp_channel->Send(sparsereduce::EncodeControl(hello));
  if (transport == "tcp") co_return tcp_channel;
  const std::optional<sparsereduce::proto::ControlMessage> offer =
      co_await ReadControlUnlessSilent(*tcp_channel, Patience(c, 0));
  if (!offer) {
    throw std::runtime_error("the server at " + ServerName(c) + " sent no " + transport + " transport offer within " +
                             std::to_string(c.timeout_ms) + " ms (--timeout-ms): is a sparsereduce-bw server "
                             "running there?");
  }
  if (!offer->has_transport_offer()) throw std::runtime_error("the server sent no transport offer");
#if SPARSEREDUCE_HAVE_RDMA
  if (rdma) {
    Check(rdma->Connect(offer->transport_offer().rdma()), "RDMA connection");
    sparsereduce::proto::ControlMessage accept;
    *accept.mutable_transport_accept()->mutable_rdma() = rdma->LocalEndpoint();
    tcp_channel->Send(sparsereduce::EncodeControl(accept));
    while (!tcp_channel->idle()) co_await asio::post(executor, asio::use_awaitable);  // the accept is written
    co_return sparsereduce::rdma::RdmaConnection::MakeChannel(std::move(rdma), TakeSocket(*tcp_channel), executor);
  }
#endif
  auto attached = co_await sparsereduce::shm::AttachShm(executor, offer->transport_offer().shm_socket(),
                                                        offer->transport_offer().token(), Clock::now() + kSetupTimeout);
  Check(attached.status(), "shared memory");
  co_return attached->MakeChannel(TakeSocket(*tcp_channel), executor);
}

asio::awaitable<void> Serve(tcp::socket socket, Config c, sparsereduce::shm::PendingOffers& pending) {
  std::string transport;
  std::unique_ptr<Channel> channel = co_await Accept(std::move(socket), c, pending, &transport);
  std::printf("sparsereduce-bw server: client connected over %s\n", transport.c_str());
  std::fflush(stdout);
  while (true) {
    Result<FrameHeader> params = co_await channel->ReadHeader();
    if (!params.ok()) break;  // the client is done
    const uint64_t frames = params->seq, payload = params->job;
    const uint64_t window = AckWindow(frames);
    for (uint64_t i = 0; i < frames; ++i) {
      Result<FrameHeader> h = co_await channel->ReadHeader();
      if (!h.ok() || h->payload_length != payload) {
        throw std::runtime_error("bad frame " + std::to_string(i) + ": " +
                                 (h.ok() ? "payload " + std::to_string(h->payload_length) : h.status().ToString()));
      }
      Check(co_await channel->Discard(payload), "reading a frame");
      if ((i + 1) % window == 0 || i + 1 == frames) SendAck(*channel);
    }
  }
  std::printf("sparsereduce-bw server: done\n");
}

struct Measurement {
  uint64_t bytes, iters;
  double peak, average, msg_rate;  // bytes/s, bytes/s, messages/s
  double seconds;                  // from the first send to the last acknowledgement
};

asio::awaitable<Measurement> RunSize(Channel& channel, const Config& c, uint64_t size, uint64_t frames) {
  SendParams(channel, frames, size);
  auto frame = std::make_shared<std::vector<std::byte>>(sparsereduce::kFrameHeaderSize + size, std::byte{0x5a});
  sparsereduce::EncodeFrameHeader(FrameHeader{FrameType::kContribution, static_cast<uint32_t>(size), 0, 0, 0, 0},
                                  frame->data());
  const uint64_t window = AckWindow(frames);
  std::vector<Clock::time_point> acks;
  Silence silence(co_await asio::this_coro::executor, channel, Patience(c, size));
  const auto start = Clock::now();
  uint64_t sent = 0;
  while (sent < frames) {
    const uint64_t batch = std::min(window - sent % window, frames - sent);
    for (uint64_t i = 0; i < batch; ++i) channel.Send({asio::buffer(*frame)}, frame);
    sent += batch;
    Result<FrameHeader> ack = co_await channel.ReadHeader();
    if (silence.expired()) {
      throw std::runtime_error(
          "no acknowledgement from the server at " + ServerName(c) + ": nothing came back, and no frame left the "
          "send queue, for " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   Patience(c, size)).count()) +
          " ms (--timeout-ms, plus 1 s per MiB of message): is a sparsereduce-bw server running there?");
    }
    Check(ack.status(), "waiting for the server's acknowledgement");
    silence.Answered();
    acks.push_back(Clock::now());
  }
  const double total = std::chrono::duration<double>(acks.back() - start).count();
  double peak = 0;
  Clock::time_point prev = start;
  for (size_t i = 0; i < acks.size(); ++i) {
    const uint64_t n = (i + 1 < acks.size()) ? window : frames - window * i;
    const double dt = std::chrono::duration<double>(acks[i] - prev).count();
    if (dt > 0) peak = std::max(peak, static_cast<double>(n * size) / dt);
    prev = acks[i];
  }
  co_return Measurement{size, frames, peak, static_cast<double>(frames * size) / total,
                        static_cast<double>(frames) / total, total};
}

// -D: measured runs of `size` until together they took at least `duration` seconds. Each run is sized (from bursts
// that grow until one takes about a twentieth of the duration) to take about a quarter of it, so the total is a
// little over the duration however the machine's speed changes meanwhile. (Scaling one calibration burst to the
// whole duration ran short whenever the measured part went slower than the burst: -s 2 -D 1 measured 0.18 s with a
// burst of 64 messages, and a 0.5 s run measured 0.297 s on a loaded machine.)
asio::awaitable<Measurement> RunForDuration(Channel& channel, const Config& c, uint64_t size, double duration) {
  const double target = duration / 20;
  uint64_t probe = 64;
  double seconds = 0;
  for (;;) {
    seconds = (co_await RunSize(channel, c, size, probe)).seconds;
    if (seconds >= target / 2 || probe >= (uint64_t{1} << 40)) break;
    probe *= static_cast<uint64_t>(std::clamp(target / std::max(seconds, 1e-9), 2.0, 64.0));
  }
  const double per_frame = seconds / static_cast<double>(probe);
  const uint64_t frames =
      std::max<uint64_t>(kWindows, static_cast<uint64_t>(duration / 4 / std::max(per_frame, 1e-12)));
  Measurement total{size, 0, 0, 0, 0, 0};
  while (total.seconds < duration) {
    const Measurement m = co_await RunSize(channel, c, size, frames);
    total.iters += m.iters;
    total.seconds += m.seconds;
    total.peak = std::max(total.peak, m.peak);
  }
  total.average = static_cast<double>(total.iters * size) / total.seconds;
  total.msg_rate = static_cast<double>(total.iters) / total.seconds;
  co_return total;
}

asio::awaitable<void> Client(tcp::socket socket, Config c, std::vector<uint64_t> sizes) {
  std::unique_ptr<Channel> channel = co_await Connect(std::move(socket), c);
  const char* unit = c.gbits ? "Gb/sec" : "MB/sec";
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(
      " sparsereduce-bw: transport %s, server %s:%u; #bytes is the payload (each frame adds a %u-byte header)\n",
      c.transport.c_str(), c.server.c_str(), c.port, sparsereduce::kFrameHeaderSize);
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit);
  std::fflush(stdout);  // a pipe's reader sees the header before the first size ends, as the rows after it
  for (uint64_t sz : sizes) {
    const Measurement m = c.duration > 0 ? co_await RunForDuration(*channel, c, sz, c.duration)
                                         : co_await RunSize(*channel, c, sz, c.iters);
    // As perftest prints them: MB/sec is 2^20 bytes per second (its format_factor 0x100000), Gb/sec 10^9 bits.
    const double scale = c.gbits ? 8.0 / 1e9 : 1.0 / (1u << 20);
    std::printf(" %-10llu %-14llu %-17.2f %-20.2f %-10.6f\n", static_cast<unsigned long long>(m.bytes),
                static_cast<unsigned long long>(m.iters), m.peak * scale, m.average * scale, m.msg_rate / 1e6);
    std::fflush(stdout);
  }
  std::printf("---------------------------------------------------------------------------------------\n");
  channel->CloseAfterFlush(/*both=*/true);
}

// Runs `task` on `io` and rethrows what it threw.
void Run(asio::io_context& io, asio::awaitable<void> task) {
  std::exception_ptr failure;
  asio::co_spawn(io, std::move(task), [&failure](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

int Main(Config c) {
  // The cap on shared-memory offers not yet taken (the server's one client takes at most one); declared before the
  // io_context, whose handlers hold offers, so that it outlives them.
  sparsereduce::shm::PendingOffers pending_shm_offers(sparsereduce::shm::PendingOffers::kDefaultCap);
  asio::io_context io;
  if (c.iters == 0) {  // RunSize waits for at least one acknowledgement
    std::fprintf(stderr, "sparsereduce-bw: -n must be at least 1 (each size waits for an acknowledgement)\n");
    return 2;
  }
  if (!ParseDuration(c)) return 2;
  if (c.server.empty()) {
    tcp::acceptor acceptor(io, tcp::endpoint(tcp::v6(), c.port));
    // With -p 0 the system picks the port: print the one bound, which the client needs.
    std::printf("sparsereduce-bw server: waiting on port %u\n",
                static_cast<unsigned>(acceptor.local_endpoint().port()));
    std::fflush(stdout);
    tcp::socket socket = acceptor.accept();
    socket.set_option(tcp::no_delay(true));
    Run(io, Serve(std::move(socket), c, pending_shm_offers));
    return 0;
  }
  std::vector<uint64_t> sizes;
  if (c.all_sizes) {
    for (uint64_t sz = 2; sz <= (8u << 20); sz *= 2) sizes.push_back(sz);
  } else {
    auto parsed = sparsereduce::tools::ParseByteSize(c.size);
    if (!parsed.ok()) {
      std::fprintf(stderr, "sparsereduce-bw: bad -s '%s': %s\n", c.size.c_str(), parsed.status().message().c_str());
      return 2;
    }
    // A data frame's header carries its payload length in 32 bits; a message of 0 bytes measures nothing.
    if (*parsed == 0 || *parsed > UINT32_MAX) {
      std::fprintf(stderr, "sparsereduce-bw: -s %s: a message carries at least 1 and at most %u bytes (4 GiB - 1)\n",
                   c.size.c_str(), UINT32_MAX);
      return 2;
    }
    sizes.push_back(*parsed);
  }
  tcp::socket socket(io);
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  // Resolved once, apart from connecting: the connect's error replaced the resolver's ("Element not found", after
  // 5 s of retries).
  const tcp::resolver::results_type endpoints = resolver.resolve(c.server, std::to_string(c.port), ec);
  if (ec) {
    std::fprintf(stderr, "sparsereduce-bw: cannot resolve %s: %s\n", c.server.c_str(), ec.message().c_str());
    return 1;
  }
  // The server may still be starting: a refused connection is retried for a few seconds, as the worker library
  // does; any other error ends the run at once.
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  for (auto pause = std::chrono::milliseconds(10);; pause = std::min(pause * 2, std::chrono::milliseconds(500))) {
    asio::connect(socket, endpoints, ec);
    if (ec != asio::error::connection_refused || Clock::now() + pause > give_up) break;
    std::this_thread::sleep_for(pause);
  }
  if (ec) {
    std::fprintf(stderr, "sparsereduce-bw: cannot connect to %s:%u: %s\n", c.server.c_str(), c.port,
                 ec.message().c_str());
    return 1;
  }
  socket.set_option(tcp::no_delay(true));
  Run(io, Client(std::move(socket), c, sizes));
  return 0;
}

// For -n and --timeout-ms, which take 1 or more: CLI11 reads "-3" into a uint64_t as 2^64 - 3.
using sparsereduce::tools::kNotNegativeOrZero;

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"sparsereduce-bw: point-to-point transport bandwidth (ib_write_bw style)"};
  app.add_option("-p,--port", c.port, "TCP port")->capture_default_str();
  CLI::Option* size = app.add_option("-s,--size", c.size, "Message size (K/M/G suffixes)")->capture_default_str();
  app.add_flag("-a,--all", c.all_sizes, "All sizes 2 B .. 8 MiB")->excludes(size);
  CLI::Option* iters = app.add_option("-n,--iters", c.iters, "Messages per size (at least 1)")
                           ->check(kNotNegativeOrZero)
                           ->capture_default_str();
  app.add_option("-D,--duration", c.duration_text,
                 "Run each size for at least this many seconds, a little more (above 0, at most 86400) instead of -n")
      ->excludes(iters);
  app.add_flag("--report_gbits", c.gbits, "Report Gbit/s instead of MB/s");
  app.add_option("--transport", c.transport,
                 "Client: tcp, shm (shared memory; the server must run on the same host) or rdma")
      ->check(CLI::IsMember({"tcp", "shm", "rdma"}))
      ->capture_default_str();
  app.add_option("-d,--ib-dev", c.rdma_device, "RDMA device (default: the first)");
  // The daemon's and sparsereduce-perf's ranges (verbs takes a uint8_t port: -i 300 was port 44).
  app.add_option("-i,--ib-port", c.rdma_port, "RDMA device port")->check(CLI::Range(1, 255))->capture_default_str();
  app.add_option("-x,--gid-index", c.gid_index, "GID index for RoCE (RoCEv2: usually 3); -1: InfiniBand LID")
      ->check(CLI::Range(-1, 255))
      ->capture_default_str();
  app.add_option("--timeout-ms", c.timeout_ms,
                 "How long the peer may stay silent before the run fails: the client's Hello for the server; for the "
                 "client, the server's transport offer, acknowledgement or taking of a frame, plus 1 s per MiB of "
                 "message (1 ms to 30 days)")
      ->check(kNotNegativeOrZero)
      ->check(CLI::Range(uint64_t{1}, kMaxTimeoutMs))
      ->capture_default_str();
  app.add_option("server", c.server, "Server address (client mode)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; a usage error is 2, as for the tool's own checks
  }
  try {
    return Main(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsereduce-bw: %s\n", e.what());
    return 1;
  }
}
