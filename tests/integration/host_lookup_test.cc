// The worker's host name lookup against a resolver that does not answer (a DNS server that drops the queries):
// the connect timeout, the join deadline and a cancel end the constructor in time, and the destructor does not
// wait for the lookup. This binary defines getaddrinfo, which the worker library then calls: names under
// ".hang.test" block until the test releases them (at its end, or after 60 s), others go to the C library.
#include <dlfcn.h>
#include <netdb.h>

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "sparsereduce/worker.h"
#include "worker/src/host_lookup.h"

namespace {

std::mutex hang_mutex;
std::condition_variable hang_released;
bool released = false;
int hanging = 0;  // lookups blocked now

bool Hangs(const char* node) {
  const std::string name = node != nullptr ? node : "";
  return name.size() > 10 && name.ends_with(".hang.test");
}

}  // namespace

extern "C" int getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res) {
  if (Hangs(node)) {
    std::unique_lock lock(hang_mutex);
    ++hanging;
    hang_released.wait_for(lock, std::chrono::seconds(60), [] { return released; });
    --hanging;
    hang_released.notify_all();  // SetUp waits for none to be left
    return EAI_AGAIN;
  }
  using GetAddrInfo = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
  static const auto next = reinterpret_cast<GetAddrInfo>(dlsym(RTLD_NEXT, "getaddrinfo"));
  return next(node, service, hints, res);
}

namespace sparsereduce {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class HostLookup : public ::testing::Test {
 protected:
  void SetUp() override {
    std::lock_guard lock(hang_mutex);
    released = false;  // the last test's TearDown saw its lookups leave
  }
  // Releases the lookups this test left blocked and waits until they have left getaddrinfo: nothing of this file
  // is then in use on their detached threads when the next test starts or the process exits (ThreadSanitizer
  // reported the exit's destruction of `hang_released` as racing with a lookup's last notify_all).
  void TearDown() override {
    std::unique_lock lock(hang_mutex);
    released = true;
    hang_released.notify_all();
    EXPECT_TRUE(hang_released.wait_for(lock, 10s, [] { return hanging == 0; })) << "a lookup stayed blocked";
  }
};

WorkerOptions HangingAggregator() {
  WorkerOptions options;
  options.aggregators = {"aggregator-0.hang.test:19875"};
  options.job = 1;
  options.world_size = 1;
  options.transport = "tcp";
  return options;
}

TEST_F(HostLookup, TheConnectTimeoutEndsAConstructorWhoseLookupHangs) {
  WorkerOptions options = HangingAggregator();
  options.connect_timeout = 300ms;
  options.join_timeout = 10s;
  const auto start = Clock::now();
  try {
    Worker worker(options);
    ADD_FAILURE() << "joined through a lookup that never answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "UNAVAILABLE") << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot resolve aggregator-0.hang.test: no answer from the resolver in time"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - start, 3s) << "the constructor waited for the lookup";
}

TEST_F(HostLookup, ACancelEndsAConstructorWhoseLookupHangsAtOnce) {
  WorkerOptions options = HangingAggregator();
  options.connect_timeout = options.join_timeout = 60s;
  std::stop_source stop;
  options.cancel = stop.get_token();
  auto constructed = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  // Cancelled once the lookup is under way.
  const auto deadline = Clock::now() + 10s;
  while (true) {
    {
      std::lock_guard lock(hang_mutex);
      if (hanging > 0) break;
    }
    ASSERT_LT(Clock::now(), deadline) << "the lookup never started";
    std::this_thread::yield();
  }
  const auto cancelled_at = Clock::now();
  stop.request_stop();
  ASSERT_EQ(constructed.wait_for(10s), std::future_status::ready) << "the constructor waited for the lookup";
  EXPECT_LT(Clock::now() - cancelled_at, 2s);
  try {
    constructed.get();
    ADD_FAILURE() << "joined through a lookup that never answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
  }
}

// The lookup itself: its deadline, and a cancel of its timer (the link's Close).
TEST_F(HostLookup, TheDeadlineAndACancelEndTheWait) {
  boost::asio::io_context io;
  boost::asio::steady_timer wait(io), closer(io);
  std::optional<Result<std::vector<boost::asio::ip::tcp::endpoint>>> timed_out, cancelled, found;
  boost::asio::co_spawn(io, [&]() -> boost::asio::awaitable<void> {
    timed_out = co_await worker::LookUpHost("a.hang.test", 1, wait, Clock::now() + 200ms);
    closer.expires_after(100ms);
    closer.async_wait([&](const boost::system::error_code&) { wait.cancel(); });
    cancelled = co_await worker::LookUpHost("b.hang.test", 1, wait, Clock::now() + 60s);
    found = co_await worker::LookUpHost("127.0.0.1", 1234, wait, Clock::now() + 60s);
  }, boost::asio::detached);
  const auto start = Clock::now();
  io.run_for(20s);
  ASSERT_TRUE(timed_out && cancelled && found) << "the lookups did not end";
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(timed_out->status().code(), StatusCode::kDeadlineExceeded) << timed_out->status().ToString();
  EXPECT_EQ(cancelled->status().code(), StatusCode::kAborted) << cancelled->status().ToString();
  ASSERT_TRUE(found->ok()) << found->status().ToString();
  ASSERT_EQ((*found)->size(), 1u);
  EXPECT_EQ((*found)->front(), boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 1234));
}

}  // namespace
}  // namespace sparsereduce
