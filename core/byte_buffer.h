// An owned, uninitialized byte buffer (std::vector<std::byte> would zero-fill every frame we receive). A buffer
// taken from a BufferPool goes back to that pool when it is destroyed instead of to the allocator.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace sparsereduce {

class BufferPool;

class ByteBuffer {
 public:
  ByteBuffer() = default;
  explicit ByteBuffer(size_t size) : data_(size ? new std::byte[size] : nullptr, Release{}), size_(size) {}

  ByteBuffer(ByteBuffer&&) noexcept = default;
  ByteBuffer& operator=(ByteBuffer&&) noexcept = default;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_.get(), size_}; }
  std::span<const std::byte> span() const { return {data_.get(), size_}; }
  // Makes the buffer look `size` bytes long (at most its size); the memory stays allocated until it is released.
  void Shrink(size_t size) { size_ = size < size_ ? size : size_; }

 private:
  friend class BufferPool;
  // Where the memory goes back to: the allocator (no pool), or the pool it came from with its real capacity.
  struct Release {
    std::shared_ptr<BufferPool> pool;
    size_t capacity;
    void operator()(std::byte* data) const;
  };
  ByteBuffer(std::byte* data, size_t size, std::shared_ptr<BufferPool> pool, size_t capacity)
      : data_(data, Release{std::move(pool), capacity}), size_(size) {}

  std::unique_ptr<std::byte[], Release> data_;
  size_t size_ = 0;
};

}  // namespace sparsereduce
