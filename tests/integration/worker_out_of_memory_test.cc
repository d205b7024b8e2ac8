// The Worker out of memory on its I/O thread: this binary replaces operator new so that the Nth allocation of a
// thread other than the test's throws std::bad_alloc, and sweeps N over the allocations of a failure and of a
// collective's start. Whatever allocation fails, the collective must end within its timeout with a
// sparsereduce::Error and the caller's tensor restored; before, a throw inside Worker::Impl::Fail left allreduce
// waiting forever (the failure was marked, the deadline cancelled, nothing delivered), and a throw in a handler that
// starts a collective terminated the process.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "protocol/control.h"
#include "protocol/frame.h"
#include "sparsereduce/worker.h"
#include "tests/integration/destroy_within.h"
#include "tests/integration/raw_peer.h"

namespace {

// Allocations left before the failing one, counted on threads other than `exempt_thread` (-1: none fails).
std::atomic<long> allocations_until_failure{-1};
std::atomic<std::thread::id> exempt_thread;

}  // namespace

void* operator new(size_t size) {
  if (allocations_until_failure.load(std::memory_order_relaxed) > 0 &&
      std::this_thread::get_id() != exempt_thread.load(std::memory_order_relaxed) &&
      allocations_until_failure.fetch_sub(1) == 1) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;

// Allocation failures armed for the I/O thread until this goes.
class FailingAllocation {
 public:
  explicit FailingAllocation(long nth) {
    exempt_thread.store(std::this_thread::get_id());
    allocations_until_failure.store(nth);
  }
  ~FailingAllocation() { allocations_until_failure.store(-1); }
  // Whether the failing allocation happened.
  static bool happened() { return allocations_until_failure.load() == 0; }
};

// A Worker of one rank (one block of 4 floats, one slot) joined through an aggregator played by hand on `fd`.
struct Joined {
  int listener = -1;
  int fd = -1;
  std::unique_ptr<Worker> worker;
  ~Joined() {
    if (fd >= 0) close(fd);
    if (listener >= 0) close(listener);
  }
};

void Join(uint64_t job, Joined* out) {
  uint16_t port = 0;
  out->listener = ListenOnLoopback(&port);
  ASSERT_GE(out->listener, 0);
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = job;
  options.world_size = 1;
  options.transport = "tcp";
  options.block_size = 4;
  options.slots = 1;
  options.blocks_per_message = 1;
  options.window = 1;
  options.connect_timeout = options.join_timeout = 10s;
  options.collective_timeout = 300ms;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  out->fd = AcceptWithin(out->listener, 10s);
  ASSERT_GE(out->fd, 0);
  ASSERT_TRUE(ReadFrame(out->fd));  // Hello
  ASSERT_TRUE(SendControl(out->fd, RawJobReady("tcp")));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  out->worker = joined.get();
}

// The collective's end: within 5 s (its timeout is 300 ms), a sparsereduce::Error, the tensor as it was.
void ExpectFailedAndRestored(std::future<void>& done, const std::vector<float>& tensor, long nth) {
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready)
      << "allocation " << nth << " failed and the collective never ended";
  try {
    done.get();
    ADD_FAILURE() << "allocation " << nth << ": the collective completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job "), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "allocation " << nth << ": not a sparsereduce::Error: " << e.what();
  }
  EXPECT_EQ(tensor, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f})) << "allocation " << nth;
}

// The Worker's destructor returns (within 10 s); a Worker that hangs there is leaked, and the test fails.
void DestroyWithin10s(std::unique_ptr<Worker> worker, long nth) {
  EXPECT_TRUE(DestroyWithin(std::move(worker), 10s)) << "allocation " << nth << ": ~Worker hangs";
}

// The aggregator's Error fails the collective; each allocation on the way to delivering it may fail instead.
TEST(WorkerOutOfMemory, WhileFailingTheCollectiveStillEndsRestored) {
  bool swept_past = false;
  for (long nth = 1; nth <= 200 && !swept_past; ++nth) {
    Joined j;
    ASSERT_NO_FATAL_FAILURE(Join(70, &j));
    std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
    auto done = j.worker->allreduce_async(std::span(tensor));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
    proto::ControlMessage error;
    error.mutable_error()->set_code(proto::PEER_LEFT);
    error.mutable_error()->set_message("rank 1 left");
    const ByteBuffer frame = EncodeControl(error);
    {
      FailingAllocation failing(nth);
      ASSERT_TRUE(WriteAll(j.fd, frame.span()));
      ASSERT_NO_FATAL_FAILURE(ExpectFailedAndRestored(done, tensor, nth));
      swept_past = !FailingAllocation::happened();
    }
    DestroyWithin10s(std::move(j.worker), nth);
  }
  EXPECT_TRUE(swept_past) << "200 allocations and still not past the failure's";
}

// Submitting and starting a collective allocates on the I/O thread too (the queue, the collective's state, its
// frames); the aggregator never answers, so a collective that does start ends at its timeout.
TEST(WorkerOutOfMemory, WhileStartingACollectiveItFailsRestored) {
  bool swept_past = false;
  for (long nth = 1; nth <= 200 && !swept_past; ++nth) {
    Joined j;
    ASSERT_NO_FATAL_FAILURE(Join(71, &j));
    std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
    {
      FailingAllocation failing(nth);
      auto done = j.worker->allreduce_async(std::span(tensor));
      ASSERT_NO_FATAL_FAILURE(ExpectFailedAndRestored(done, tensor, nth));
      swept_past = !FailingAllocation::happened();
    }
    // A Worker that failed refuses what comes next, as any failed Worker does.
    std::vector<float> later(4, 1.0f);
    EXPECT_THROW(j.worker->allreduce(std::span(later)), Error) << "allocation " << nth;
    DestroyWithin10s(std::move(j.worker), nth);
  }
  EXPECT_TRUE(swept_past) << "200 allocations and still not past a collective's start";
}

}  // namespace
}  // namespace sparsereduce::testing
