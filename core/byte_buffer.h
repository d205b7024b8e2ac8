// An owned, uninitialized byte buffer (std::vector<std::byte> would zero-fill every frame we receive). A buffer
// whose memory came from a BufferLender (a BufferPool, or a transport lending its own receive memory) gives the
// memory back to that lender when it is destroyed instead of to the allocator.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace sparsereduce {

// Who lent a buffer its memory and takes it back.
class BufferLender {
 public:
  // `data` and `capacity` as given to ByteBuffer::Borrowed. Called once per buffer, from the thread that destroys it.
  virtual void Return(std::byte* data, size_t capacity) = 0;

 protected:
  ~BufferLender() = default;
};

class ByteBuffer {
 public:
  ByteBuffer() = default;
  explicit ByteBuffer(size_t size) : data_(size ? new std::byte[size] : nullptr, Release{}), size_(size) {}

  // A buffer of `size` bytes at `data`, lent by `lender` (which must stay valid while the buffer lives; the
  // shared_ptr keeps it so). `on_loan`: the lender wants the memory back soon (a transport's receive ring), so a
  // holder that keeps the buffer for long should copy it (see on_loan()).
  static ByteBuffer Borrowed(std::byte* data, size_t size, std::shared_ptr<BufferLender> lender, size_t capacity,
                             bool on_loan) {
    return ByteBuffer(data, size, Release{std::move(lender), capacity, on_loan});
  }

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
  // The memory is a transport's, which cannot reuse it until the buffer is gone.
  bool on_loan() const { return data_.get_deleter().on_loan; }

 private:
  // Where the memory goes back to: the allocator (no lender), or the lender it came from. (No default member
  // initializers: they would keep the type from counting as default-constructible inside ByteBuffer; value
  // initialization zeroes the fields.)
  struct Release {
    std::shared_ptr<BufferLender> lender;
    size_t capacity;
    bool on_loan;
    void operator()(std::byte* data) const {
      if (lender) {
        lender->Return(data, capacity);
      } else {
        delete[] data;
      }
    }
  };
  ByteBuffer(std::byte* data, size_t size, Release release) : data_(data, std::move(release)), size_(size) {}

  std::unique_ptr<std::byte[], Release> data_;
  size_t size_ = 0;
};

}  // namespace sparsereduce
