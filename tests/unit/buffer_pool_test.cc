#include "core/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace sparsereduce {
namespace {

TEST(BufferPool, ReusesFreedBuffersOfSimilarSize) {
  auto pool = BufferPool::Create(1 << 20);
  const std::byte* first = nullptr;
  {
    ByteBuffer a = pool->Acquire(33 * 1024);
    ASSERT_EQ(a.size(), 33u * 1024);
    std::memset(a.data(), 0xAB, a.size());  // the whole requested size is usable
    first = a.data();
  }
  EXPECT_EQ(pool->retained_bytes(), 36u * 1024);  // rounded up to 4 KiB
  ByteBuffer b = pool->Acquire(30 * 1024);       // fits the 36 KiB buffer, which is less than twice as large
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(b.size(), 30u * 1024);
  EXPECT_EQ(pool->reuses(), 1u);
  EXPECT_EQ(pool->retained_bytes(), 0u);
}

TEST(BufferPool, ForBuffersKeepsThatManyBuffersWhateverTheRounding) {
  // A worker's RESULT buffers: S x A frames of 128 blocks (134144 bytes, not a multiple of the granularity).
  const size_t frame = 128 * (24 + 1024);
  auto pool = BufferPool::ForBuffers(8, frame);
  for (int round = 0; round < 3; ++round) {
    std::vector<ByteBuffer> in_flight;
    for (int i = 0; i < 8; ++i) in_flight.push_back(pool->Acquire(frame));
  }
  // Only the first round allocated: every later Acquire found a free buffer.
  EXPECT_EQ(pool->reuses(), 16u);
  EXPECT_EQ(pool->retained_bytes(), 8 * BufferPool::CapacityFor(frame));
}

TEST(BufferPool, DoesNotHandOutBuffersTwiceTheRequest) {
  auto pool = BufferPool::Create(1 << 20);
  { ByteBuffer big = pool->Acquire(64 * 1024); }
  ByteBuffer small = pool->Acquire(8 * 1024);
  EXPECT_EQ(pool->reuses(), 0u);
  EXPECT_EQ(pool->retained_bytes(), 64u * 1024);
}

TEST(BufferPool, NeverUsesAFreeBufferThatIsTooSmall) {
  auto pool = BufferPool::Create(1 << 20);
  { ByteBuffer a = pool->Acquire(8 * 1024); }
  ByteBuffer b = pool->Acquire(8 * 1024 + 1);
  EXPECT_EQ(pool->reuses(), 0u);
  std::memset(b.data(), 1, b.size());
}

TEST(BufferPool, SmallRequestsBypassThePool) {
  auto pool = BufferPool::Create(1 << 20);
  { ByteBuffer a = pool->Acquire(BufferPool::kMinPooledBytes - 1); }
  EXPECT_EQ(pool->retained_bytes(), 0u);
  ByteBuffer empty = pool->Acquire(0);
  EXPECT_EQ(empty.size(), 0u);
}

TEST(BufferPool, KeepsAtMostItsLimit) {
  auto pool = BufferPool::Create(10 * 1024);
  {
    ByteBuffer a = pool->Acquire(8 * 1024);
    ByteBuffer b = pool->Acquire(8 * 1024);
  }
  EXPECT_EQ(pool->retained_bytes(), 8u * 1024);  // the second one was freed
}

TEST(BufferPool, MovedBufferReturnsOnce) {
  auto pool = BufferPool::Create(1 << 20);
  {
    ByteBuffer a = pool->Acquire(8 * 1024);
    ByteBuffer b = std::move(a);
    ByteBuffer c;
    c = std::move(b);
  }
  EXPECT_EQ(pool->retained_bytes(), 8u * 1024);
}

TEST(BufferPool, BuffersKeepThePoolAlive) {
  std::weak_ptr<BufferPool> weak;
  ByteBuffer survivor;
  {
    auto pool = BufferPool::Create(1 << 20);
    weak = pool;
    survivor = pool->Acquire(16 * 1024);
  }
  EXPECT_FALSE(weak.expired());
  std::memset(survivor.data(), 7, survivor.size());
  survivor = ByteBuffer();
  EXPECT_TRUE(weak.expired());
}

// Buffers are acquired on one thread and released on another, as frames are in the daemon.
TEST(BufferPool, AcquireAndReleaseFromSeveralThreads) {
  auto pool = BufferPool::Create(4 << 20);
  constexpr int kPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::vector<ByteBuffer> held;
      for (int i = 0; i < kPerThread; ++i) {
        ByteBuffer b = pool->Acquire(4096 * (1 + (i + t) % 9));
        std::memset(b.data(), t, b.size());
        held.push_back(std::move(b));
        if (held.size() > 8) held.erase(held.begin());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(pool->reuses(), 0u);
  EXPECT_LE(pool->retained_bytes(), size_t{4} << 20);
}

}  // namespace
}  // namespace sparsereduce
