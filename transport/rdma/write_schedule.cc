#include "transport/rdma/write_schedule.h"

#include <algorithm>

namespace sparsereduce::rdma {

void WriteSchedule::Publish(uint64_t to) { published_ = std::max(published_, to); }

std::optional<WriteSchedule::Write> WriteSchedule::Next() {
  if (in_flight_ >= send_queue_) return std::nullopt;
  std::optional<Write> write;
  if (credit_due_) {
    credit_due_ = false;
    write = Write{Kind::kCredit};
  } else if (written_ < published_) {
    // One contiguous span: up to the end of the ring's memory, and within what an immediate can say.
    const uint64_t offset = written_ & (capacity_ - 1);
    const uint64_t length = std::min({published_ - written_, capacity_ - offset, uint64_t{kMaxDataWrite}});
    written_ += length;
    write = Write{Kind::kData, offset, static_cast<uint32_t>(length)};
  } else if (end_of_stream_asked_ && !end_of_stream_posted_) {
    end_of_stream_posted_ = true;
    write = Write{Kind::kEndOfStream};
  } else {
    return std::nullopt;
  }
  ++in_flight_;
  return write;
}

void WriteSchedule::Completed() {
  if (in_flight_ > 0) --in_flight_;
}

}  // namespace sparsereduce::rdma
