// The Worker's lifecycle against aggregators played by hand (raw_peer.h): every way its constructor, a collective
// or its destructor can end must end within its timeouts, or at once when it is cancelled or another aggregator
// fails, whatever phase of the handshake a connection is in. Every wait here is bounded: a Worker that hangs fails
// the test instead of hanging it.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "protocol/control.h"
#include "protocol/frame_format.h"
#include "sparsereduce/worker.h"
#include "tests/integration/raw_peer.h"

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;

// accept() bounded by `timeout`; -1 when nobody connected.
int AcceptWithin(int listener, std::chrono::milliseconds timeout) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
  return accept(listener, nullptr, nullptr);
}

std::string UniqueName(const std::string& what) {
  return "sparsereduce-test/" + what + "/" + std::to_string(getpid());
}

proto::ControlMessage ShmOffer(const std::string& name) {
  proto::ControlMessage offer;
  offer.mutable_transport_offer()->set_kind("shm");
  offer.mutable_transport_offer()->set_shm_socket(name);
  offer.mutable_transport_offer()->set_token(std::string(16, 't'));
  return offer;
}

// A worker in the middle of taking a shared-memory offer (it connected to the offer's socket and presented its
// token; the aggregator never hands the segment over) leaves at once when the join is cancelled. Close() did not
// reach the handoff, which went on waiting for the descriptors until the connect timeout, and with it the I/O
// thread and the cancelled constructor.
TEST(WorkerLifecycle, CancelDuringASharedMemoryHandoffEndsTheConstructorAtOnce) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  const std::string name = UniqueName("cancel-handoff");
  const int shm_listener = ListenOnAbstract(name);
  ASSERT_GE(shm_listener, 0) << std::strerror(errno);

  std::stop_source stop;
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 40;
  options.world_size = 1;
  options.transport = "auto";
  options.connect_timeout = options.join_timeout = 15s;  // bounds the test if the Worker hangs
  options.cancel = stop.get_token();
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd = AcceptWithin(listener, 10s);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadFrame(fd));  // Hello
  ASSERT_TRUE(SendControl(fd, ShmOffer(name)));
  const int shm_fd = AcceptWithin(shm_listener, 10s);
  ASSERT_GE(shm_fd, 0) << "the worker did not take the offer";
  char token[16];
  ASSERT_TRUE(ReadExactly(shm_fd, token, sizeof token));  // the worker now waits for the descriptors

  stop.request_stop();
  const auto cancelled = std::chrono::steady_clock::now();
  const bool ended = joined.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(ended) << "the constructor was still waiting 5 s after its join was cancelled during a handoff";
  try {
    joined.get();  // after the connect timeout at the latest
    ADD_FAILURE() << "joined without a JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled, 5s);
  close(shm_fd);
  close(fd);
  close(shm_listener);
  close(listener);
}

// The same when another aggregator refuses the job while the first connection takes its offer: the constructor
// throws that aggregator's error at once instead of after the handoff's deadline.
TEST(WorkerLifecycle, AnotherAggregatorsErrorDuringAHandoffEndsTheConstructorAtOnce) {
  uint16_t port0 = 0, port1 = 0;
  const int listener0 = ListenOnLoopback(&port0);
  const int listener1 = ListenOnLoopback(&port1);
  ASSERT_GE(listener0, 0);
  ASSERT_GE(listener1, 0);
  const std::string name = UniqueName("error-during-handoff");
  const int shm_listener = ListenOnAbstract(name);
  ASSERT_GE(shm_listener, 0) << std::strerror(errno);

  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port0), "127.0.0.1:" + std::to_string(port1)};
  options.job = 41;
  options.world_size = 1;
  options.transport = "auto";
  options.connect_timeout = options.join_timeout = 15s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd0 = AcceptWithin(listener0, 10s);
  const int fd1 = AcceptWithin(listener1, 10s);
  ASSERT_GE(fd0, 0);
  ASSERT_GE(fd1, 0);
  ASSERT_TRUE(ReadFrame(fd0));  // Hello
  ASSERT_TRUE(ReadFrame(fd1));
  ASSERT_TRUE(SendControl(fd0, ShmOffer(name)));
  const int shm_fd = AcceptWithin(shm_listener, 10s);
  ASSERT_GE(shm_fd, 0) << "the worker did not take the offer";
  char token[16];
  ASSERT_TRUE(ReadExactly(shm_fd, token, sizeof token));

  proto::ControlMessage error;
  error.mutable_error()->set_code(proto::JOB_CONFIG_MISMATCH);
  error.mutable_error()->set_message("job 41 is configured otherwise");
  ASSERT_TRUE(SendControl(fd1, error));
  const auto refused = std::chrono::steady_clock::now();
  const bool ended = joined.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(ended) << "the constructor was still waiting 5 s after aggregator 1 refused the job";
  try {
    joined.get();
    ADD_FAILURE() << "joined without a JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "JOB_CONFIG_MISMATCH") << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - refused, 5s);
  close(shm_fd);
  close(fd0);
  close(fd1);
  close(shm_listener);
  close(listener0);
  close(listener1);
}


}  // namespace
}  // namespace sparsereduce::testing
