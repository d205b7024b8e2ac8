// The RDMA transport. Without an RDMA device (as on the development machine: no RDMA in its kernel) only the checks
// and their messages can be tested; the loopback test between two queue pairs of one device carries the ctest label
// rdma-hardware and skips, saying why, when no device opens.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <regex>

#include <sys/wait.h>

#include "protocol/frame.h"
#include "tools/common/subprocess.h"
#include "sparsereduce/worker.h"
#include "transport/rdma/channel.h"
#include "transport/rdma/device.h"

namespace sparsereduce::rdma {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST(RdmaMemlock, EnoughOrUnlimitedOrCapabilityPasses) {
  EXPECT_TRUE(CheckMemlock({UINT64_MAX, false}, 1ull << 40).ok());
  EXPECT_TRUE(CheckMemlock({64ull << 20, false}, 8ull << 20).ok());
  EXPECT_TRUE(CheckMemlock({64 * 1024, true}, 8ull << 20).ok());  // CAP_IPC_LOCK lifts the limit
}

TEST(RdmaMemlock, TooLowSaysHowToFixIt) {
  const Status st = CheckMemlock({8ull << 20, false}, 16ull << 20);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  for (const char* needle : {"16 MiB", "8 MiB", "LimitMEMLOCK=infinity", "ulimit -l", "CAP_IPC_LOCK"}) {
    EXPECT_NE(st.message().find(needle), std::string::npos) << needle << " missing in: " << st.message();
  }
}

TEST(RdmaMemlock, ConnectionsThatFitTheLimit) {
  EXPECT_EQ(ConnectionsWithinMemlock({8ull << 20, false}, 4ull << 20), 2u);
  EXPECT_EQ(ConnectionsWithinMemlock({3ull << 20, false}, 4ull << 20), 0u);
  EXPECT_EQ(ConnectionsWithinMemlock({UINT64_MAX, false}, 4ull << 20), UINT64_MAX);
  EXPECT_EQ(ConnectionsWithinMemlock({64 * 1024, true}, 4ull << 20), UINT64_MAX);
}

proto::RdmaEndpoint GoodEndpoint(bool roce) {
  proto::RdmaEndpoint e;
  e.set_qpn(0x123456);
  e.set_psn(0xABCDEF);
  e.set_lid(roce ? 0 : 7);  // RoCE ports have no LID
  if (roce) {
    std::string gid(16, '\0');
    gid[10] = gid[11] = '\xff';
    gid[12] = 10, gid[15] = 1;  // ::ffff:10.0.0.1, a RoCEv2 GID
    e.set_gid(gid);
  }
  e.set_mtu(IBV_MTU_4096);
  e.set_ring_address(0x7f0000001000);
  e.set_ring_rkey(42);
  e.set_ring_capacity(1 << 20);
  e.set_credit_address(0x7f0000000800);
  e.set_credit_rkey(43);
  return e;
}

TEST(RdmaPeerEndpoint, AGoodOneIsAcceptedOnInfinibandAndRoce) {
  EXPECT_TRUE(CheckPeerEndpoint(GoodEndpoint(false), 1 << 20, false).ok());
  EXPECT_TRUE(CheckPeerEndpoint(GoodEndpoint(true), 1 << 20, true).ok());
}

TEST(RdmaPeerEndpoint, WhatCannotBeConnectedToIsRefusedSayingWhy) {
  struct Case {
    const char* name;
    bool roce;
    std::function<void(proto::RdmaEndpoint&)> spoil;
    const char* message;
  } cases[] = {
      {"ring size", false, [](auto& e) { e.set_ring_capacity(1 << 21); }, "ring holds 2097152 bytes, this one 1048576"},
      {"no GID", true, [](auto& e) { e.clear_gid(); }, "no 16-byte GID"},
      {"short GID", true, [](auto& e) { e.set_gid(std::string(8, '\1')); }, "no 16-byte GID"},
      {"zero GID", true, [](auto& e) { e.set_gid(std::string(16, '\0')); }, "all-zero GID"},
      {"LID 0", false, [](auto& e) { e.set_lid(0); }, "LID 0"},
      {"MTU", false, [](auto& e) { e.set_mtu(9); }, "bad MTU"},
      {"MTU 0", true, [](auto& e) { e.set_mtu(0); }, "bad MTU"},
      {"QPN", false, [](auto& e) { e.set_qpn(1 << 24); }, "out of range (16777216"},
      {"PSN", false, [](auto& e) { e.set_psn(1 << 24); }, "out of range"},
      {"LID", false, [](auto& e) { e.set_lid(1 << 16); }, "out of range"},
  };
  for (const Case& c : cases) {
    proto::RdmaEndpoint e = GoodEndpoint(c.roce);
    c.spoil(e);
    const Status st = CheckPeerEndpoint(e, 1 << 20, c.roce);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation) << c.name << ": " << st.ToString();
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.name << ": " << st.message();
  }
}

// Whatever this machine lacks, opening fails with a reason a user can act on (and never crashes).
TEST(RdmaDevice, OpenFailsWithAnActionableReasonWithoutHardware) {
  auto device = RdmaDevice::Open(RdmaOptions{}, 1 << 20);
  if (device.ok()) GTEST_SKIP() << "an RDMA device opened (" << (*device)->name() << "): nothing to check here";
  const std::string m = device.status().message();
  EXPECT_TRUE(std::regex_search(m, std::regex("no RDMA support in this kernel|no RDMA device found|not active|"
                                              "memlock limit|not found; devices|GID index")))
      << m;
  std::printf("reason on this machine: %s\n", device.status().ToString().c_str());
}

TEST(RdmaDevice, UnknownDeviceIsNamedWithTheOnesThatExist) {
  auto device = RdmaDevice::Open(RdmaOptions{"no-such-hca", 1, -1}, 1 << 20);
  ASSERT_FALSE(device.ok());
  // Either there is no RDMA at all, or the message lists the devices there are.
  const std::string m = device.status().message();
  EXPECT_TRUE(m.find("no RDMA") != std::string::npos || m.find("'no-such-hca' not found") != std::string::npos) << m;
}

// Two queue pairs of one device connected to each other, frames both ways: needs RDMA hardware (or soft-RoCE).
TEST(RdmaHardware, LoopbackFramesBothWays) {
  auto device = RdmaDevice::Open(RdmaOptions{}, 16ull << 20);
  if (!device.ok()) GTEST_SKIP() << "no usable RDMA device: " << device.status().ToString();
  asio::io_context io;
  auto a = RdmaConnection::Create(*device, 1 << 16);
  auto b = RdmaConnection::Create(*device, 1 << 16);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " / " << b.status().ToString();
  const proto::RdmaEndpoint ea = (*a)->LocalEndpoint(), eb = (*b)->LocalEndpoint();
  ASSERT_TRUE((*a)->Connect(eb).ok());
  ASSERT_TRUE((*b)->Connect(ea).ok());
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  asio::ip::tcp::socket server = acceptor.accept();
  auto ca = RdmaConnection::MakeChannel(std::move(*a), std::move(server), io.get_executor());
  auto cb = RdmaConnection::MakeChannel(std::move(*b), std::move(client), io.get_executor());
  constexpr int kFrames = 200;
  for (int i = 0; i < kFrames; ++i) {
    ByteBuffer frame(kFrameHeaderSize + 100000);  // larger than the ring: it streams through
    EncodeFrameHeader(FrameHeader{FrameType::kContribution, 100000, 0, static_cast<uint64_t>(i), 1, 0}, frame.data());
    std::memset(frame.data() + kFrameHeaderSize, i & 0xFF, 100000);
    ca->Send(std::move(frame));
  }
  bool done = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < kFrames; ++i) {
      Result<FrameHeader> h = co_await cb->ReadHeader();
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (!h.ok()) co_return;
      EXPECT_EQ(h->job, static_cast<uint64_t>(i));
      Result<ByteBuffer> p = co_await cb->ReadPayload(h->payload_length, nullptr);
      EXPECT_TRUE(p.ok());
      if (!p.ok()) co_return;
      EXPECT_EQ(static_cast<int>(p->data()[99999]), i & 0xFF);
    }
    done = true;
  }, asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(50ms);
  }
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace sparsereduce::rdma

namespace sparsereduce::rdma {
namespace {

// On a machine without usable RDMA, asking for it fails at once and says why: in the library...
TEST(RdmaUnavailable, WorkerSaysWhyWhenCreated) {
  if (RdmaDevice::Open(RdmaOptions{}, 1 << 20).ok()) GTEST_SKIP() << "this machine has a usable RDMA device";
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:1"};  // never reached: the device check comes first
  options.transport = "rdma";
  try {
    Worker worker(options);
    FAIL() << "a Worker with transport rdma was created without RDMA";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("transport rdma"), std::string::npos) << what;
    EXPECT_TRUE(what.find("no RDMA") != std::string::npos || what.find("memlock") != std::string::npos ||
                what.find("not active") != std::string::npos)
        << what;
  }
}

// ... and in the daemon, which refuses to start: exit 1 where the device, its driver or its port is not there (yet:
// systemd's Restart=on-failure retries, and a NIC driver that loads after the daemon's first start is found), 2 for
// what a restart does not change (the memlock limit).
TEST(RdmaUnavailable, DaemonRefusesToStart) {
  if (RdmaDevice::Open(RdmaOptions{}, 4 << 20).ok()) GTEST_SKIP() << "this machine has a usable RDMA device";
  // Through a shell for 2>&1: the messages go to stderr. Bounded: should the daemon start after all, it is killed.
  auto daemon = tools::Subprocess::Spawn(
      {"/bin/sh", "-c",
       std::string("exec ") + SPARSEREDUCE_AGGREGATOR_BIN + " --transports tcp,rdma --listen 127.0.0.1:0 " +
           "--metrics-listen '' 2>&1"},
      /*capture_stdout=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  Result<std::string> read = (*daemon)->ReadStdout(std::chrono::seconds(20));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  const std::string& output = *read;
  Result<int> status = (*daemon)->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.ok()) << status.status().ToString() << "\n" << output;
  EXPECT_NE(output.find("--transports rdma: "), std::string::npos) << output;
  const bool absent = output.find("UNAVAILABLE: no RDMA") != std::string::npos;
  EXPECT_TRUE(absent || output.find("memlock") != std::string::npos) << output;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == (absent ? 1 : 2))
      << tools::DescribeExit(*status) << "\n" << output;
}

}  // namespace
}  // namespace sparsereduce::rdma
