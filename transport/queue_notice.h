// A one-shot notice for a channel's send queue: "tell me when at most N frames are queued". The daemon uses it to
// resume reading once a slow member has caught up (aggregator/job.h, WaitWhileCongested); it costs nothing while
// nobody waits.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <cstddef>
#include <functional>
#include <utility>

namespace sparsereduce::transport {

class QueueNotice {
 public:
  // Replaces any earlier request.
  void Arm(size_t frames, std::function<void()> handler) {
    frames_ = frames;
    handler_ = std::move(handler);
  }
  // The queue now holds `queued` frames (0 also after a failure): fires the handler, posted, if it is low enough.
  void Check(size_t queued, const boost::asio::any_io_executor& executor) {
    if (!handler_ || queued > frames_) return;
    boost::asio::post(executor, std::move(handler_));
    handler_ = nullptr;
  }

 private:
  size_t frames_ = 0;
  std::function<void()> handler_;
};

}  // namespace sparsereduce::transport
