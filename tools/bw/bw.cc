// sparsereduce-bw: point-to-point transport throughput, in the style of perftest's ib_write_bw, so a user can check
// a link before blaming the allreduce. The client streams data frames (the real frame format) to the server; the
// server checks every header and acknowledges every window of frames, from which peak and average rates follow.
//
//   server: sparsereduce-bw [-p PORT] [--transport tcp]
//   client: sparsereduce-bw [-p PORT] [-s SIZE | -a] [-n ITERS | -D SECONDS] [--report_gbits] SERVER
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "protocol/coding.h"
#include "protocol/frame.h"
#include "tools/common/size_parse.h"

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using sparsereduce::FrameHeader;
using sparsereduce::FrameType;

constexpr uint32_t kWindows = 16;  // acknowledgements per test; the peak is the best window

struct Config {
  uint16_t port = 18515;  // perftest's default
  std::string size = "64K";
  bool all_sizes = false;
  uint64_t iters = 1000;
  double duration = 0;
  bool gbits = false;
  std::string transport = "tcp";
  std::string server;
};

// Test parameters travel in a data frame's header fields: seq = frames to expect, slot = 0, job = frame payload.
void SendParams(tcp::socket& s, uint64_t frames, uint64_t payload) {
  FrameHeader h{FrameType::kContribution, 0, 0, payload, frames, 0};
  std::array<std::byte, sparsereduce::kFrameHeaderSize> bytes;
  sparsereduce::EncodeFrameHeader(h, bytes.data());
  asio::write(s, asio::buffer(bytes));
}

int Serve(const Config& c) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(tcp::v6(), c.port));
  std::printf("sparsereduce-bw server: waiting on port %u (transport %s)\n", c.port, c.transport.c_str());
  std::fflush(stdout);
  tcp::socket s = acceptor.accept();
  s.set_option(tcp::no_delay(true));
  std::vector<std::byte> buf;
  std::array<std::byte, sparsereduce::kFrameHeaderSize> head;
  while (true) {
    boost::system::error_code ec;
    asio::read(s, asio::buffer(head), ec);
    if (ec) break;  // client done
    auto params = sparsereduce::DecodeFrameHeader(head);
    if (!params.ok()) {
      std::fprintf(stderr, "sparsereduce-bw: bad parameter frame: %s\n", params.status().ToString().c_str());
      return 1;
    }
    const uint64_t frames = params->seq, payload = params->job;
    buf.resize(payload);
    const uint64_t window = std::max<uint64_t>(1, frames / kWindows);
    for (uint64_t i = 0; i < frames; ++i) {
      asio::read(s, asio::buffer(head));
      auto h = sparsereduce::DecodeFrameHeader(head);
      if (!h.ok() || h->payload_length != payload) {
        std::fprintf(stderr, "sparsereduce-bw: bad frame %llu\n", static_cast<unsigned long long>(i));
        return 1;
      }
      asio::read(s, asio::buffer(buf.data(), payload));
      if ((i + 1) % window == 0 || i + 1 == frames) asio::write(s, asio::buffer("A", 1));
    }
  }
  std::printf("sparsereduce-bw server: done\n");
  return 0;
}

struct Measurement {
  uint64_t bytes, iters;
  double peak, average, msg_rate;  // bytes/s, bytes/s, messages/s
};

Measurement RunSize(tcp::socket& s, uint64_t size, const Config& c) {
  uint64_t frames = c.iters;
  if (c.duration > 0) {
    // Calibrate: time a short burst and scale to the requested duration.
    const auto t0 = Clock::now();
    Measurement probe = RunSize(s, size, Config{c.port, c.size, false, 64, 0, c.gbits, c.transport, c.server});
    (void)probe;
    const double per_frame = std::chrono::duration<double>(Clock::now() - t0).count() / 64;
    frames = std::max<uint64_t>(16, static_cast<uint64_t>(c.duration / std::max(per_frame, 1e-9)));
  }
  SendParams(s, frames, size);
  std::vector<std::byte> frame(sparsereduce::kFrameHeaderSize + size, std::byte{0x5a});
  FrameHeader h{FrameType::kContribution, static_cast<uint32_t>(size), 0, 0, 0, 0};
  sparsereduce::EncodeFrameHeader(h, frame.data());
  const uint64_t window = std::max<uint64_t>(1, frames / kWindows);
  std::vector<Clock::time_point> acks;
  const auto start = Clock::now();
  uint64_t sent = 0;
  char ack;
  while (sent < frames) {
    const uint64_t batch = std::min(window - sent % window, frames - sent);
    for (uint64_t i = 0; i < batch; ++i) asio::write(s, asio::buffer(frame));
    sent += batch;
    asio::read(s, asio::buffer(&ack, 1));
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
  return {size, frames, peak, static_cast<double>(frames * size) / total, static_cast<double>(frames) / total};
}

int Client(const Config& c) {
  asio::io_context io;
  tcp::socket s(io);
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  asio::connect(s, resolver.resolve(c.server, std::to_string(c.port)), ec);
  if (ec) {
    std::fprintf(stderr, "sparsereduce-bw: cannot connect to %s:%u: %s\n", c.server.c_str(), c.port,
                 ec.message().c_str());
    return 1;
  }
  s.set_option(tcp::no_delay(true));
  std::vector<uint64_t> sizes;
  if (c.all_sizes) {
    for (uint64_t sz = 2; sz <= (8u << 20); sz *= 2) sizes.push_back(sz);
  } else {
    auto parsed = sparsereduce::tools::ParseByteSize(c.size);
    if (!parsed.ok() || *parsed == 0) {
      std::fprintf(stderr, "sparsereduce-bw: bad -s '%s'\n", c.size.c_str());
      return 2;
    }
    sizes.push_back(*parsed);
  }
  const char* unit = c.gbits ? "Gb/sec" : "MB/sec";
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(" sparsereduce-bw: transport %s, server %s:%u; #bytes is the payload (each frame adds a %u-byte header)\n",
              c.transport.c_str(), c.server.c_str(), c.port, sparsereduce::kFrameHeaderSize);
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit);
  for (uint64_t sz : sizes) {
    Measurement m = RunSize(s, sz, c);
    const double scale = c.gbits ? 8.0 / 1e9 : 1.0 / 1e6;  // perftest: MB = 10^6 bytes, Gb = 10^9 bits
    std::printf(" %-10llu %-14llu %-17.2f %-20.2f %-10.6f\n", static_cast<unsigned long long>(m.bytes),
                static_cast<unsigned long long>(m.iters), m.peak * scale, m.average * scale, m.msg_rate / 1e6);
  }
  std::printf("---------------------------------------------------------------------------------------\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"sparsereduce-bw: point-to-point transport bandwidth (ib_write_bw style)"};
  app.add_option("-p,--port", c.port, "TCP port")->capture_default_str();
  app.add_option("-s,--size", c.size, "Message size (K/M/G suffixes)")->capture_default_str();
  app.add_flag("-a,--all", c.all_sizes, "All sizes 2 B .. 8 MiB");
  app.add_option("-n,--iters", c.iters, "Messages per size")->capture_default_str();
  app.add_option("-D,--duration", c.duration, "Run each size for about this many seconds instead of -n");
  app.add_flag("--report_gbits", c.gbits, "Report Gbit/s instead of MB/s");
  app.add_option("--transport", c.transport, "tcp (shm and rdma come with their transports)")
      ->check(CLI::IsMember({"tcp"}))->capture_default_str();
  app.add_option("server", c.server, "Server address (client mode)");
  CLI11_PARSE(app, argc, argv);
  try {
    return c.server.empty() ? Serve(c) : Client(c);
  } catch (const boost::system::system_error& e) {
    std::fprintf(stderr, "sparsereduce-bw: %s\n", e.what());
    return 1;
  }
}
