#include "sparsereduce/worker.h"

#include <sched.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cctype>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include "core/cut_text.h"
#include "core/exception_text.h"
#include "core/dtype.h"
#include "protocol/auth.h"
#include "protocol/control.h"
#include "protocol/frame_format.h"
#include "protocol/worker_collective.h"
#include "transport/channel.h"
#include "transport/shm/handoff.h"
#include "transport/tcp/endpoint.h"
#include "worker/src/aggregator_link.h"
#include "worker/src/worker_environment.h"

namespace sparsereduce {

namespace asio = boost::asio;

// WorkerOptions::yield_while_scanning: at most a yield per MiB of zero blocks scanned (about 50 us of scanning on
// this machine's cores), checked between slots. Dense tensors, whose blocks each cost the scan one element, never
// yield.
constexpr uint64_t kYieldAfterScanning = uint64_t{1} << 20;

using worker::AggregatorLink;

namespace {

// Whether `message` names collective `seq` ("collective 1", but not within "collective 10").
bool NamesCollective(const std::string& message, uint64_t seq) {
  const std::string name = "collective " + std::to_string(seq);
  for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
    const size_t end = at + name.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) return true;
  }
  return false;
}

// "collective 3 (16777216 float32 elements)": errors name the step and its tensor.
std::string DescribeCollective(uint64_t seq, const CollectiveSpec& spec) {
  const DTypeInfo* info = FindDType(spec.dtype);
  return "collective " + std::to_string(seq) + " (" + std::to_string(spec.element_count) + " " +
         (info ? info->name : "?") + (spec.element_count == 1 ? " element)" : " elements)");
}

// An aggregator's Error names the job for its own log ("job 21: collective 1 ...", "job 21 rank 1 (peer P): ...",
// "job 21 aborted because ..."); the worker's errors name it in front already, so the relayed text leaves a leading
// "job J: " or "job J, " out, "job J rank" becomes "rank", and "job J did ..." "the job did ...".
std::string WithoutJobPrefix(const std::string& message, uint64_t job) {
  const std::string name = "job " + std::to_string(job);
  if (message.size() <= name.size() + 2 || !message.starts_with(name)) return message;
  if (message.compare(name.size(), 2, ": ") == 0 || message.compare(name.size(), 2, ", ") == 0) {
    return message.substr(name.size() + 2);
  }
  if (message.compare(name.size(), 6, " rank ") == 0) return message.substr(name.size() + 1);
  if (message[name.size()] == ' ' && !std::isdigit(static_cast<unsigned char>(message[name.size() + 1]))) {
    return "the job" + message.substr(name.size());
  }
  return message;  // "job 21" followed by a digit is another job's id
}

}  // namespace

class Worker::Impl : public AggregatorLink::Handler {
 public:
  explicit Impl(WorkerOptions options);
  ~Impl() override;

  std::future<void> Submit(std::span<std::byte> tensor, uint64_t count, DType dtype,
                           const AllreduceOptions& options = {});
  CollectiveStats last_stats() const {
    if (InForkedChild()) return {};  // its mutex may have been held by the parent's I/O thread at the fork
    std::lock_guard lock(stats_mutex_);
    return last_stats_;
  }
  void Abort() {
    if (InForkedChild()) return;  // nothing runs there, and the connections are the parent's
    asio::post(io_, [this] { Fail(Status(StatusCode::kAborted, "aborted by the caller (Worker::abort)")); });
  }
  // A copy of the Worker in a child made by fork(): it has no I/O thread there, and its sockets and epoll instance
  // are the parent's.
  bool InForkedChild() const { return getpid() != owner_pid_; }
  const WorkerOptions& options() const { return options_; }
  // Written on the I/O thread before the join completes, read-only afterwards.
  const std::vector<std::string>& transports() const { return transports_; }

  // AggregatorLink::Handler (I/O thread)
  void OnControl(AggregatorLink& link, const proto::ControlMessage& message) override;
  void OnAuthChallenge(AggregatorLink& link, const proto::AuthChallenge& challenge);
  Status TransportOfferAllowed(AggregatorLink& link) override;
  Result<uint64_t> ResultLimit(AggregatorLink& link, const FrameHeader& header) override;
  bool BeginResult(AggregatorLink& link, const FrameHeader& header, std::span<const std::byte> table,
                   std::vector<boost::asio::mutable_buffer>* targets) override;
  void EndResult(AggregatorLink& link) override;
  void OnFailure(AggregatorLink& link, const Status& status) override;
  void OnWriterIdle(AggregatorLink& link) override;

 private:
  struct Request {
    std::span<std::byte> tensor;
    CollectiveSpec spec;
    std::promise<void> promise;
  };
  struct Active {
    Request request;
    std::unique_ptr<WorkerCollective> collective;
    std::vector<bool> accepted;
    uint32_t accepted_count = 0;
    std::chrono::steady_clock::time_point start;
    uint64_t sent_before = 0, received_before = 0;
    uint64_t scanned_at_last_yield = 0;  // zero bytes; WorkerOptions::yield_while_scanning
    codec::KeyState* codec_state = nullptr;  // in codec_states_, when the collective has a codec
  };

  std::string Prefix() const {
    return "sparsereduce: job " + std::to_string(options_.job) + " rank " + std::to_string(options_.rank);
  }
  Error MakeError(const Status& st) const { return Error(StatusCodeName(st.code()), Prefix() + ": " + st.message()); }
  // MakeError's, to deliver through a future; out_of_memory_error_ when making it ran out of memory (the copy in
  // std::make_exception_ptr would hand the caller a std::bad_alloc instead of an Error).
  std::exception_ptr ErrorFor(const Status& st) const noexcept {
    try {
      throw MakeError(st);
    } catch (const Error&) {
      return std::current_exception();
    } catch (...) {
      return out_of_memory_error_;
    }
  }
  // The collective's codec from the user's options (not yet validated); an unknown name throws.
  CodecSpec CodecSpecFor(const CodecOptions& c, uint64_t key) const {
    Result<Codec> codec = ParseCodec(c.name);
    if (!codec.ok()) throw MakeError(codec.status());
    return {*codec, key, c.sparsity, c.fp32_results, c.fraction, c.alpha, c.l2_norm, c.tensor_scale};
  }
  // I/O thread: the worker becomes unusable. `origin` is the link that failed, if one did; it gets no Goodbye unless
  // the failure is a protocol violation of its aggregator's that this worker found (not an Error its aggregator
  // sent, `origin_knows`).
  void Fail(const Status& status, AggregatorLink* origin = nullptr, bool origin_knows = false);
  // Fail's work: the Goodbyes, the grace for frames in flight. May throw (std::bad_alloc).
  void FailWithGoodbyes(const Status& status, AggregatorLink* origin, bool origin_knows);
  // Out of memory while failing, or an exception from a handler: ends everything at once without allocating. The
  // links are aborted (no Goodbyes, no grace), the tensor restored, and every waiter gets the failure's error if it
  // was made, else out_of_memory_error_.
  void FailWithoutAllocating() noexcept;
  // The I/O thread's loop: an exception escaping a handler fails the Worker (it terminated the process).
  void RunIo();
  // In RunIo's handler of that exception: Fail with `code`, or FailWithoutAllocating when failing already or when
  // describing it runs out of memory.
  void FailOnHandlerException(StatusCode code) noexcept;
  // Completes a failure once no write can read the caller's tensor any more (every writer idle), or at once.
  void MaybeFinishFailure();
  void FinishFailure();
  void StartNext();
  // Scans and starts the (aggregator, slot) pairs of collective `seq` from `pair` on, one pair per turn of the
  // event loop, so that the first slots' blocks travel while the rest of the tensor is being scanned.
  void StartSlots(uint64_t seq, uint64_t pair);
  void SendFrame(AggregatorLink& link, const OutgoingFrame& frame);
  void MaybeComplete();
  // The statistics of the collective that just completed (last_stats), and the adaptive codec's cost sample.
  void RecordStats(Active& a);

  const pid_t owner_pid_ = getpid();
  WorkerOptions options_;
  JobShape shape_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::unique_ptr<AggregatorLink>> links_;
  asio::steady_timer deadline_;
  std::thread thread_;

  // I/O thread only:
  std::optional<Status> broken_;
  // Made up front, for a failure that has no memory left to describe itself (FailWithoutAllocating).
  Status out_of_memory_status_;
  std::exception_ptr out_of_memory_error_;
  uint32_t ready_links_ = 0;
  std::vector<bool> link_ready_;  // JobReady received, per aggregator
  std::vector<std::string> transports_;  // per aggregator, as reported in JobReady
  std::vector<std::string> auth_nonces_;     // per aggregator, when options_.secret is set
  std::vector<bool> link_authenticated_;     // the aggregator proved it holds options_.secret
  std::promise<void> joined_;
  bool join_pending_ = true;
  std::deque<Request> queue_;
  std::vector<OutgoingFrame> scratch_frames_;  // frames to send, reused
  std::vector<std::span<std::byte>> scratch_targets_;  // where a RESULT's data goes, reused
  std::optional<Active> active_;
  // Codec state per key, across collectives; a key used with another codec starts over (codec::Fit), as the
  // aggregators' error memory does. (Per (codec, key), a key's old state came back with its old codec, while the
  // aggregators had started over, and the map grew with every pair.)
  std::map<uint64_t, codec::KeyState> codec_states_;
  uint64_t seq_ = 0;
  CollectiveScratch scratch_;  // recycled between collectives

  std::optional<std::exception_ptr> failure_;  // set by Fail, delivered by FinishFailure
  asio::steady_timer failure_grace_{io_};
  bool queueing_goodbyes_ = false;  // Fail is queueing them: the failure finishes after that

  mutable std::mutex stats_mutex_;
  CollectiveStats last_stats_;
};

namespace worker {

// Each address parses, names a port to connect to, and appears once: two entries for the same aggregator made the
// job's ranks meet it twice, as two aggregator indexes, and fail with JOB_FULL or JOB_CONFIG_MISMATCH.
Status CheckAggregatorAddresses(const std::vector<std::string>& aggregators) {
  std::map<std::pair<std::string, uint16_t>, size_t> seen;
  for (size_t i = 0; i < aggregators.size(); ++i) {
    Result<tcp::HostPort> address = tcp::ParseHostPort(aggregators[i]);
    if (!address.ok()) return address.status().WithContext("aggregator " + std::to_string(i));
    if (address->port == 0) {
      return InvalidArgument("aggregator " + std::to_string(i) + " '" + aggregators[i] +
                             "': port 0 cannot be connected to");
    }
    const auto [it, fresh] = seen.emplace(std::pair{address->host, address->port}, i);
    if (!fresh) {
      return InvalidArgument("aggregator '" + aggregators[i] + "' is listed twice (entries " +
                             std::to_string(it->second) + " and " + std::to_string(i) +
                             "): each aggregator of the job must appear once");
    }
  }
  return Status::Ok();
}

}  // namespace worker

Worker::Impl::Impl(WorkerOptions options)
    : options_(std::move(options)),
      shape_{options_.world_size, static_cast<uint32_t>(options_.aggregators.size()), options_.slots,
             options_.blocks_per_message, options_.window},
      work_(io_.get_executor()),
      deadline_(io_),
      out_of_memory_status_(StatusCode::kResourceExhausted,
                            "out of memory on the worker's I/O thread; the Worker failed and closed its connections"),
      out_of_memory_error_(std::make_exception_ptr(MakeError(out_of_memory_status_))) {
  if (options_.aggregators.empty()) throw MakeError(InvalidArgument("no aggregators given"));
  if (Status st = worker::CheckAggregatorAddresses(options_.aggregators); !st.ok()) throw MakeError(st);
  for (const auto& [name, timeout] : {std::pair{"connect_timeout", options_.connect_timeout},
                                      std::pair{"join_timeout", options_.join_timeout},
                                      std::pair{"collective_timeout", options_.collective_timeout}}) {
    if (timeout.count() <= 0) {
      throw MakeError(InvalidArgument(std::string(name) + " must be positive (milliseconds::max() for no limit), got " +
                                      std::to_string(timeout.count()) + " ms"));
    }
  }
  if (Status st = ValidateShape(shape_); !st.ok()) throw MakeError(st);
  // The ranges of the aggregator's --rdma-port and --rdma-gid-index (verbs takes a uint8_t port): 257 was port 1.
  if (options_.rdma_port < 1 || options_.rdma_port > 255) {
    throw MakeError(InvalidArgument("rdma_port " + std::to_string(options_.rdma_port) + " is outside 1 to 255"));
  }
  if (options_.rdma_gid_index < -1 || options_.rdma_gid_index > 255) {
    throw MakeError(InvalidArgument("rdma_gid_index " + std::to_string(options_.rdma_gid_index) +
                                    " is outside -1 (InfiniBand LID addressing) to 255"));
  }
  if (options_.rank >= options_.world_size) {
    throw MakeError(InvalidArgument("rank " + std::to_string(options_.rank) + " is out of range for world_size " +
                                    std::to_string(options_.world_size)));
  }
  // The default codec is checked now rather than at the first allreduce.
  // Only the named codec's fields: the others keep their defaults and are not sent (codec "none" with fraction 0
  // is fine).
  if (Status st = ValidateCodec(WithoutUnusedFields(CodecSpecFor(options_.codec, 0))); !st.ok()) {
    throw MakeError(st.WithContext("codec " + options_.codec.name));
  }
  for (DType dtype : {DType::kFloat32, DType::kInt32}) {
    const CollectiveSpec spec{0, dtype, ReduceOp::kSum, options_.block_size};
    Status st = ValidateSpec(spec);
    if (st.ok()) st = ValidateFrameSize(shape_, spec);
    if (!st.ok()) throw MakeError(st);
  }
#if SPARSEREDUCE_HAVE_RDMA
  std::shared_ptr<rdma::RdmaDevice> rdma_device;
  if (options_.transport == "rdma") {
    // Checked now, so a host without RDMA fails here with the reason. Each connection registers two rings (2 MiB
    // by default, the aggregator chooses): that much must fit the memlock limit per aggregator.
    const rdma::RdmaOptions rdma_options{options_.rdma_device, static_cast<uint8_t>(options_.rdma_port),
                                         options_.rdma_gid_index};
    auto device = rdma::RdmaDevice::Open(rdma_options, (uint64_t{4} << 20) * options_.aggregators.size());
    if (!device.ok()) throw MakeError(device.status().WithContext("transport rdma"));
    rdma_device = std::move(*device);
  }
#else
  if (options_.transport == "rdma") {
    throw MakeError(Status(StatusCode::kUnsupported, "transport rdma: this build of the library has no RDMA "
                                                     "transport (libibverbs-dev was missing at build time)"));
  }
#endif
  for (uint32_t a = 0; a < options_.aggregators.size(); ++a) {
    links_.push_back(std::make_unique<AggregatorLink>(
        io_, a, options_.aggregators[a], *this,
        AggregatorLink::Options{options_.transport, options_.connect_timeout, options_.tcp_send_buffer}));
#if SPARSEREDUCE_HAVE_RDMA
    links_.back()->set_rdma(rdma_device);
#endif
  }
  link_ready_.assign(links_.size(), false);
  transports_.assign(links_.size(), "tcp");
  link_authenticated_.assign(links_.size(), false);
  for (size_t a = 0; a < links_.size() && !options_.secret.empty(); ++a) auth_nonces_.push_back(auth::RandomNonce());
  std::future<void> joined = joined_.get_future();
  const auto connect_deadline = worker::DeadlineAfter(std::chrono::steady_clock::now(), options_.connect_timeout);
  const auto join_deadline = worker::DeadlineAfter(connect_deadline, options_.join_timeout);
  asio::post(io_, [this, connect_deadline, join_deadline] {
    for (auto& link : links_) {
      proto::Hello hello;
      hello.set_protocol_version(kProtocolVersion);
      hello.set_job_id(options_.job);
      hello.set_rank(options_.rank);
      hello.set_world_size(options_.world_size);
      hello.set_aggregator_index(link->index());
      hello.set_num_aggregators(shape_.num_aggregators);
      hello.set_slots(options_.slots);
      hello.set_blocks_per_message(options_.blocks_per_message);
      hello.set_window(options_.window);
      if (!options_.secret.empty()) hello.set_auth_nonce(auth_nonces_[link->index()]);
      if (options_.transport == "auto" || options_.transport == "shm") hello.add_transports(shm::kShmCapability);
      if (options_.transport == "rdma") hello.add_transports("rdma");
      asio::co_spawn(io_, link->Run(hello, connect_deadline, join_deadline),
                     [this, link = link.get()](std::exception_ptr error) {  // on the I/O thread
                       if (!error) return;
                       try {
                         Fail(Status(StatusCode::kInternal,
                                     link->Name() + ": the connection ended by an exception: " + ExceptionText(error)),
                              link);
                       } catch (...) {
                         // Describing it took memory there was not (std::bad_alloc again).
                         FailWithoutAllocating();
                       }
                     });
    }
    deadline_.expires_at(join_deadline);
    deadline_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || !join_pending_) return;
      std::string connected, unconnected;
      for (auto& link : links_) {
        if (link_ready_[link->index()]) continue;
        std::string& list = link->connected() ? connected : unconnected;
        list += (list.empty() ? "" : ", ") + link->Name();
      }
      // A connected aggregator that has not said the job formed waits, almost always, for the job's other ranks:
      // it is rarely the aggregator's fault, and the message must not read as if it were.
      std::string what;
      if (!connected.empty() && options_.world_size > 1) {
        what += "; " + connected + " accepted this rank but has not reported the job formed: it waits for the " +
                "job's other " + std::to_string(options_.world_size - 1) +
                " rank(s), which must run with the same job id, world size and aggregator list (the aggregator's " +
                "log names the missing ranks when its --formation-timeout-ms ends the job), unless the address is " +
                "not an aggregator's data port";
      } else if (!connected.empty()) {
        what += "; " + connected + " accepted the connection but has not answered (a job of one rank forms at " +
                "once): is the address an aggregator's data port?";
      }
      if (!unconnected.empty()) what += "; no connection to " + unconnected + " yet";
      Fail(Status(StatusCode::kDeadlineExceeded,
                  "the job did not form within the connect and join timeouts (" +
                      std::to_string(options_.connect_timeout.count()) + " + " +
                      std::to_string(options_.join_timeout.count()) + " ms)" + what));
    });
  });
  // A stop request arrives on another thread; the I/O thread fails the join as any other failure would.
  const std::stop_callback on_cancel(options_.cancel, [this] {
    asio::post(io_, [this] {
      if (join_pending_) Fail(Status(StatusCode::kAborted, "the join was cancelled (WorkerOptions::cancel)"));
    });
  });
  thread_ = std::thread([this] { RunIo(); });
  try {
    joined.get();
  } catch (...) {
    asio::post(io_, [this] {
      for (auto& link : links_) link->Close();
      deadline_.cancel();
    });
    work_.reset();
    thread_.join();
    throw;
  }
}

Worker::Impl::~Impl() {
  asio::post(io_, [this] {
    // Says goodbye to every aggregator and fails anything still queued or in flight.
    Fail(Status(StatusCode::kAborted, "the Worker was destroyed"));
  });
  work_.reset();
  thread_.join();
}

std::future<void> Worker::Impl::Submit(std::span<std::byte> tensor, uint64_t count, DType dtype,
                                       const AllreduceOptions& options) {
  if (InForkedChild()) {
    throw MakeError(Status(StatusCode::kUnsupported,
                           "this Worker was created in process " + std::to_string(owner_pid_) +
                               " and cannot run collectives in a process forked from it; create a new Worker here"));
  }
  Request request{tensor, CollectiveSpec{count, dtype, ReduceOp::kSum, options_.block_size}, {}};
  const CodecOptions& c = options.codec ? *options.codec : options_.codec;
  request.spec.codec = WithoutUnusedFields(CodecSpecFor(c, options.key));
  if (Status st = ValidateCodec(request.spec.codec); !st.ok()) throw MakeError(st.WithContext("codec " + c.name));
  // int32 sums are always exact: no codec, and none of its options (a 3LC-only option would fail validation).
  if (dtype == DType::kInt32) request.spec.codec = CodecSpec{Codec::kNone, options.key};
  // The element count is the span's (checked at construction with 0 elements): refused here, before the I/O thread.
  if (Status st = ValidateSpec(request.spec); !st.ok()) throw MakeError(st);
  std::future<void> future = request.promise.get_future();
  asio::post(io_, [this, request = std::move(request)]() mutable {
    try {
      if (broken_) {
        request.promise.set_exception(
            ErrorFor(broken_->WithContext("the Worker failed earlier and cannot run collectives")));
        return;
      }
      queue_.push_back(std::move(request));  // unchanged if it throws: the request is still this handler's
    } catch (...) {
      // Out of memory: this request fails with the rest (its promise would otherwise break unanswered).
      FailWithoutAllocating();
      request.promise.set_exception(out_of_memory_error_);
      return;
    }
    if (!active_) StartNext();
  });
  return future;
}

void Worker::Impl::StartNext() {
  if (queue_.empty() || broken_) return;
  const uint64_t seq = seq_ + 1;
  const Request& next = queue_.front();
  // Out of memory for the collective's state (its per-block arrays, a codec's error memory), on the I/O thread:
  // nothing was sent nor written yet, and the request is still first in the queue. Fail fails it and what follows
  // (the ranks' sequences of collectives diverge from here) and tells the aggregators why this rank leaves.
  const auto setup_failed = [&](StatusCode code) {
    const std::string what = ExceptionText(std::current_exception());
    active_.reset();
    Fail(Status(code, "collective " + std::to_string(seq) + " of " + std::to_string(next.spec.element_count) +
                          " elements: setting it up failed: " + what));
  };
  try {
    // Not emplace(): clang 14 judges Active, with its default member initializers, not default-constructible here.
    active_.emplace(Active{});
    Active& a = *active_;
    a.start = std::chrono::steady_clock::now();
    a.accepted.assign(links_.size(), false);
    for (auto& link : links_) {
      a.sent_before += link->bytes_sent();
      a.received_before += link->bytes_received();
    }
    CodecContext codec;
    if (next.spec.codec.codec != Codec::kNone) {
      codec.state = a.codec_state = &codec_states_[next.spec.codec.key];
      codec.rank = options_.rank;
      codec.seed = options_.codec_seed;
    } else {
      codec_states_.erase(next.spec.codec.key);  // the key carries an uncoded tensor now
    }
    a.collective = std::make_unique<WorkerCollective>(shape_, options_.job, seq, next.spec, next.tensor,
                                                      std::move(scratch_), codec, options_.restore_on_failure);
  } catch (const std::bad_alloc&) {
    setup_failed(StatusCode::kResourceExhausted);
    return;
  } catch (...) {
    setup_failed(StatusCode::kInternal);
    return;
  }
  // Set up: the request becomes the active collective's (moves that cannot throw).
  Active& a = *active_;
  a.request = std::move(queue_.front());
  queue_.pop_front();
  seq_ = seq;

  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(seq);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto(a.request.spec);
  const ByteBuffer begin_frame = EncodeControl(begin);
  for (auto& link : links_) {
    ByteBuffer copy(begin_frame.size());
    std::memcpy(copy.data(), begin_frame.data(), begin_frame.size());
    link->Send(std::move(copy));
  }
  deadline_.expires_at(worker::DeadlineAfter(a.start, options_.collective_timeout));
  deadline_.async_wait([this, seq](const boost::system::error_code& ec) {
    if (ec || !active_ || active_->collective->seq() != seq) return;
    std::string waiting, writing;  // aggregators yet to answer; those answered, with frames still to write
    for (auto& link : links_) {
      if (!active_->collective->AggregatorDone(link->index()) || !active_->accepted[link->index()]) {
        waiting += (waiting.empty() ? "" : ", ") + link->Name();
      } else if (!link->writer_idle()) {
        writing += (writing.empty() ? "" : ", ") + link->Name();
      }
    }
    std::string what = waiting + " has not completed it: usually another rank has not called allreduce for it yet "
                       "or is slow (the aggregator's --begin-timeout-ms and --stall-timeout-ms errors name it); "
                       "raise collective_timeout if the step is legitimately this long";
    if (waiting.empty()) what = "its last frames to " + writing + " are still being written";
    Fail(Status(StatusCode::kDeadlineExceeded,
                DescribeCollective(seq, active_->request.spec) + " did not complete within " +
                    std::to_string(options_.collective_timeout.count()) + " ms (collective_timeout); " + what));
  });
  StartSlots(seq, 0);
}

void Worker::Impl::StartSlots(uint64_t seq, uint64_t pair) {
  if (broken_ || !active_ || active_->collective->seq() != seq) return;
  // Slot-major order: slot 0 of every aggregator first, so that all aggregators get work from the start.
  const uint32_t aggregator = static_cast<uint32_t>(pair % links_.size());
  std::vector<OutgoingFrame>& frames = scratch_frames_;
  frames.clear();
  active_->collective->StartSlot(aggregator, static_cast<uint32_t>(pair / links_.size()), &frames);
  for (const OutgoingFrame& frame : frames) SendFrame(*links_[aggregator], frame);
  const uint64_t scanned = active_->collective->zero_bytes_scanned();
  if (options_.yield_while_scanning && scanned - active_->scanned_at_last_yield >= kYieldAfterScanning) {
    active_->scanned_at_last_yield = scanned;
    ::sched_yield();  // the frames above are on their way: the first slots leave before the core is given up
  }
  if (++pair < uint64_t{links_.size()} * shape_.slots) {
    asio::post(io_, [this, seq, pair] { StartSlots(seq, pair); });
    return;
  }
  MaybeComplete();  // an empty tensor may already be done once accepted
}

void Worker::Impl::SendFrame(AggregatorLink& link, const OutgoingFrame& frame) {
  auto prefix = std::make_shared<const ByteBuffer>(active_->collective->EncodePrefix(frame));
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(1 + 2 * frame.entries.size());
  buffers.push_back(asio::buffer(prefix->data(), prefix->size()));
  uint64_t bytes = prefix->size();
  for (const Entry& e : frame.entries) {
    if (e.data_bytes == 0) continue;
    auto data = active_->collective->BlockData(e.block);
    buffers.push_back(asio::buffer(data.data(), data.size()));
    auto pad = WorkerCollective::PaddingFor(e.data_bytes);
    if (!pad.empty()) buffers.push_back(asio::buffer(pad.data(), pad.size()));
    bytes += data.size() + pad.size();
  }
  link.Send(std::move(buffers), std::move(prefix), bytes);
}

void Worker::Impl::OnAuthChallenge(AggregatorLink& link, const proto::AuthChallenge& challenge) {
  if (options_.secret.empty() || !join_pending_ || link_authenticated_[link.index()]) {
    return Fail(ProtocolError(link.Name() + " sent an unexpected AuthChallenge"), &link);
  }
  const auth::Transcript transcript{options_.job,         options_.rank,
                                    options_.world_size,  link.index(),
                                    auth_nonces_[link.index()], challenge.server_nonce()};
  if (challenge.server_nonce().size() != auth::kNonceSize ||
      !auth::ProofMatches(auth::ServerProof(options_.secret, transcript), challenge.server_proof())) {
    return Fail(Status(StatusCode::kUnauthenticated,
                       link.Name() + " failed to prove it holds the job's secret: its secret differs from this "
                                     "worker's (or it is not the aggregator meant)"),
                &link);
  }
  link_authenticated_[link.index()] = true;
  proto::ControlMessage response;
  response.mutable_auth_response()->set_client_proof(auth::ClientProof(options_.secret, transcript));
  link.Send(EncodeControl(response));
}

Status Worker::Impl::TransportOfferAllowed(AggregatorLink& link) {
  // A worker with a secret takes no offer from an aggregator that has not proved it holds the secret: it would
  // otherwise connect to a socket and map memory that an impostor named.
  if (!options_.secret.empty() && !link_authenticated_[link.index()]) {
    return Status(StatusCode::kUnauthenticated,
                  "offered a transport before proving it holds the job's secret (the offer comes after "
                  "authentication)");
  }
  return Status::Ok();
}

void Worker::Impl::OnControl(AggregatorLink& link, const proto::ControlMessage& message) {
  if (broken_) return;
  switch (message.body_case()) {
    case proto::ControlMessage::kAuthChallenge:
      return OnAuthChallenge(link, message.auth_challenge());
    case proto::ControlMessage::kJobReady:
      if (!join_pending_ || link_ready_[link.index()]) {
        return Fail(ProtocolError(link.Name() + " sent JobReady twice"), &link);
      }
      if (!options_.secret.empty() && !link_authenticated_[link.index()]) {
        return Fail(Status(StatusCode::kUnauthenticated,
                           link.Name() + " admitted the job without proving it holds the job's secret"),
                    &link);
      }
      if (message.job_ready().transport() != link.transport()) {
        return Fail(ProtocolError(link.Name() + " reports transport '" + message.job_ready().transport() +
                                  "' but the connection is on " + link.transport()),
                    &link);
      }
      if (options_.transport == "shm" && std::string_view(link.transport()) != "shm") {
        return Fail(Status(StatusCode::kUnavailable,
                           link.Name() + " did not offer shared memory (transport \"shm\" was required): it runs on "
                                         "another host, or with --transports tcp"),
                    &link);
      }
      if (options_.transport == "rdma" && std::string_view(link.transport()) != "rdma") {
        return Fail(Status(StatusCode::kUnavailable,
                           link.Name() + " did not offer RDMA (transport \"rdma\" was required): start it with "
                                         "--transports ...,rdma on an RDMA-capable host; if it was, its RDMA setup for "
                                         "this connection failed (its log says why)"),
                    &link);
      }
      transports_[link.index()] = link.transport();
      link_ready_[link.index()] = true;
      if (++ready_links_ == links_.size()) {
        join_pending_ = false;
        deadline_.cancel();
        joined_.set_value();
      }
      return;
    case proto::ControlMessage::kCollectiveAccepted:
      if (!active_ || message.collective_accepted().seq() != active_->collective->seq() ||
          active_->accepted[link.index()]) {
        return Fail(ProtocolError(link.Name() + " accepted collective " +
                                  std::to_string(message.collective_accepted().seq()) + " unexpectedly"),
                    &link);
      }
      active_->accepted[link.index()] = true;
      ++active_->accepted_count;
      MaybeComplete();
      return;
    case proto::ControlMessage::kError: {
      const proto::Error& e = message.error();
      return Fail(Status(FromProtoCode(e.code()), link.Name() + ": " + WithoutJobPrefix(e.message(), options_.job)),
                  &link, /*origin_knows=*/true);
    }
    default:
      return Fail(ProtocolError(link.Name() + " sent an unexpected control message (field " +
                                std::to_string(static_cast<int>(message.body_case())) + ")"),
                  &link);
  }
}

Result<uint64_t> Worker::Impl::ResultLimit(AggregatorLink&, const FrameHeader& header) {
  if (!active_) {
    return ProtocolError("sent a RESULT for collective " + std::to_string(header.seq) + " while none is in progress");
  }
  if (header.entry_count > shape_.blocks_per_message) {
    return ProtocolError("sent a RESULT of " + std::to_string(header.entry_count) + " entries, more than the job's " +
                         std::to_string(shape_.blocks_per_message) + " blocks per message");
  }
  return active_->collective->MaxResultPayload();
}

bool Worker::Impl::BeginResult(AggregatorLink& link, const FrameHeader& header, std::span<const std::byte> table,
                               std::vector<boost::asio::mutable_buffer>* targets) {
  if (broken_ || !active_) return false;
  std::vector<OutgoingFrame>& frames = scratch_frames_;
  frames.clear();
  std::vector<std::span<std::byte>>& spans = scratch_targets_;
  Status st = active_->collective->BeginResult(link.index(), header, table, &frames, &spans);
  if (!st.ok()) {
    Fail(st.WithContext(link.Name()), &link);
    return false;
  }
  // The next contributions go out before this RESULT's data is read: the aggregator goes on meanwhile.
  for (const OutgoingFrame& frame : frames) SendFrame(link, frame);
  for (const std::span<std::byte>& s : spans) targets->push_back(boost::asio::buffer(s.data(), s.size()));
  return true;
}

void Worker::Impl::EndResult(AggregatorLink& link) {
  if (broken_ || !active_) return;  // the failure restored the tensor, after this read stopped or finished
  if (Status st = active_->collective->EndResult(link.index()); !st.ok()) {
    return Fail(st.WithContext(link.Name()), &link);
  }
  MaybeComplete();
}

void Worker::Impl::MaybeComplete() {
  // Failing (abort, a deadline, an aggregator's Error): a collective done meanwhile fails with the rest, as
  // Worker::abort promises, rather than succeed once the last writer goes idle.
  if (broken_) return;
  if (!active_ || active_->accepted_count != links_.size() || !active_->collective->done()) return;
  // Queued frames point into the caller's tensor (and the codec's buffers), so the collective ends only when every
  // writer is done with them: an aggregator that answers blocks it has not read yet must not make the caller
  // reuse its tensor while a write still reads it. OnWriterIdle comes back here.
  for (auto& link : links_) {
    if (!link->writer_idle()) return;
  }
  Active& a = *active_;
  a.collective->Finish();  // no-throw: from here on the collective has succeeded, and nothing below may fail it
  deadline_.cancel();
  try {
    RecordStats(a);
  } catch (const std::bad_alloc&) {
    // Out of memory for the statistics or the cost model's sample: the sums are in place; only those are missed.
  }
  std::promise<void> promise = std::move(a.request.promise);
  scratch_ = a.collective->ReleaseScratch();
  active_.reset();
  promise.set_value();
  StartNext();
}

void Worker::Impl::RecordStats(Active& a) {
  CollectiveStats stats;
  stats.seq = a.collective->seq();
  stats.element_count = a.request.spec.element_count;
  stats.blocks = a.collective->num_blocks();
  stats.nonzero_blocks = a.collective->nonzero_blocks();
  stats.selected_blocks = a.collective->selected_blocks();
  stats.codec = CodecName(a.request.spec.codec.codec);
  for (auto& link : links_) {
    stats.bytes_sent += link->bytes_sent();
    stats.bytes_received += link->bytes_received();
  }
  stats.bytes_sent -= a.sent_before;
  stats.bytes_received -= a.received_before;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - a.start).count();
  if (a.request.spec.codec.codec == Codec::kAdaptive) {
    // The adaptive codec's cost model learns from what its collectives cost.
    a.codec_state->cost.Add(static_cast<double>(stats.bytes_sent), stats.seconds);
  }
  std::lock_guard lock(stats_mutex_);
  last_stats_ = std::move(stats);
}

void Worker::Impl::OnFailure(AggregatorLink& link, const Status& status) {
  if (broken_) return;
  if (transport::IsPeerClosed(status)) {
    // Said what it means: an aggregator that refuses anything sends an Error first.
    return Fail(Status(StatusCode::kUnavailable,
                       link.Name() + ": the aggregator closed the connection without an Error" +
                           (join_pending_ ? " while this rank waited for the job to form: its process ended or was "
                                            "stopped (see its log), or the address is not its data port"
                                          : ": its process ended or was stopped (see its log)")),
                &link);
  }
  if (status.code() == StatusCode::kUnavailable && link.connected()) {
    return Fail(Status(StatusCode::kUnavailable, link.Name() + ": " + status.message()), &link);
  }
  Fail(status.WithContext(link.Name()), &link);
}

void Worker::Impl::Fail(const Status& status, AggregatorLink* origin, bool origin_knows) {
  if (broken_) return;
  try {
    FailWithGoodbyes(status, origin, origin_knows);
  } catch (...) {
    FailWithoutAllocating();
  }
}

void Worker::Impl::FailWithGoodbyes(const Status& status, AggregatorLink* origin, bool origin_knows) {
  broken_ = status;
  deadline_.cancel();
  failure_ = ErrorFor(status);
  // Tell the other aggregators why this rank leaves, so they report the real cause to the other ranks, and stop
  // sending: frames in flight finish (the stream stays framed), queued ones are dropped.
  proto::ControlMessage goodbye;
  // Within a CONTROL frame's limit (64 KiB) whatever the message: it may quote an aggregator's Error at length.
  constexpr size_t kMaxReason = 4096;
  goodbye.mutable_goodbye()->set_reason(CutText(status.message(), kMaxReason));
  // Dropping a queue can leave its writer idle at once, which calls OnWriterIdle: the failure must not finish
  // before every Goodbye is queued and the grace timer armed, or a Goodbye queued after it would wait, with nothing
  // to bound it, behind a socket the aggregator no longer reads.
  queueing_goodbyes_ = true;
  // The aggregator whose link failed hears why too when the failure is what it sent (a protocol violation this
  // worker found), not its connection's: its operator then sees the cause in its log instead of a bare close, and so
  // do the other ranks. Not when it said so itself (its Error).
  const bool tell_origin = status.code() == StatusCode::kProtocolViolation && !origin_knows;
  for (auto& link : links_) {
    link->DropQueued();
    // Only once the handshake is over (JobReady): within it the aggregator reads what the handshake expects next
    // (an AuthResponse, a TransportDecline) and takes anything else as a protocol violation of this worker's. The
    // close alone tells it that this rank left the forming job (docs/PROTOCOL.md §5 item 4).
    if ((link.get() != origin || tell_origin) && link->connected() && link->job_ready()) {
      link->Send(EncodeControl(goodbye));
    }
    link->Close();
  }
  queueing_goodbyes_ = false;
  // Frames in flight may point into the caller's tensor: the failure is delivered once they are written, or after
  // a short grace period with the sockets closed.
  failure_grace_.expires_after(std::chrono::milliseconds(500));
  failure_grace_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) FinishFailure();
  });
  MaybeFinishFailure();
}

void Worker::Impl::FailWithoutAllocating() noexcept {
  if (!broken_) broken_.emplace(std::move(out_of_memory_status_));  // a move: no allocation
  queueing_goodbyes_ = false;
  deadline_.cancel();
  failure_grace_.cancel();
  const std::exception_ptr error = failure_ ? *failure_ : out_of_memory_error_;
  failure_.reset();
  for (auto& link : links_) link->Abort();  // no write reads the tensor, no read writes it, after this
  if (join_pending_) {
    join_pending_ = false;
    joined_.set_exception(error);
  }
  if (active_) {
    active_->collective->Restore();
    active_->request.promise.set_exception(error);
    active_.reset();
  }
  for (Request& r : queue_) r.promise.set_exception(error);
  queue_.clear();
}

void Worker::Impl::RunIo() {
  // A handler threw (std::bad_alloc where the Worker allocates as it goes): its state may be half changed, so the
  // Worker fails; io_.run() may be called again without a restart (Asio's contract).
  while (true) {
    try {
      io_.run();
      return;
    } catch (const std::bad_alloc&) {
      FailOnHandlerException(StatusCode::kResourceExhausted);
    } catch (...) {
      FailOnHandlerException(StatusCode::kInternal);
    }
  }
}

void Worker::Impl::FailOnHandlerException(StatusCode code) noexcept {
  if (!broken_) {
    try {
      return Fail(Status(code, "the worker's I/O thread ended a step by an exception: " +
                                   ExceptionText(std::current_exception())));
    } catch (...) {
    }
  }
  FailWithoutAllocating();  // failing already, or no memory to say more
}

void Worker::Impl::OnWriterIdle(AggregatorLink&) {
  MaybeFinishFailure();
  MaybeComplete();
}

void Worker::Impl::MaybeFinishFailure() {
  if (!failure_ || queueing_goodbyes_) return;
  for (auto& link : links_) {
    if (!link->writer_idle()) return;
  }
  FinishFailure();
}

void Worker::Impl::FinishFailure() {
  if (!failure_) return;
  const std::exception_ptr error = *failure_;
  failure_.reset();
  failure_grace_.cancel();
  for (auto& link : links_) {
    // No further write will read the tensor after this, and no RESULT read will write into it.
    if (!link->writer_idle() || link->reading_result_data()) link->Abort();
  }
  if (join_pending_) {
    join_pending_ = false;
    joined_.set_exception(error);
  }
  // Each collective's error says which one it is, for callers with several in flight (unless the cause named it).
  const auto for_collective = [&](uint64_t seq, const std::string& which) {
    if (!broken_ || NamesCollective(broken_->message(), seq)) return error;
    return ErrorFor(broken_->WithContext(which));
  };
  uint64_t seq = seq_;
  if (active_) {
    active_->collective->Restore();  // the caller gets its input back, so the step can be retried (if restorable)
    active_->request.promise.set_exception(for_collective(seq, DescribeCollective(seq, active_->request.spec)));
    active_.reset();
  }
  for (Request& r : queue_) {
    ++seq;
    r.promise.set_exception(for_collective(seq, DescribeCollective(seq, r.spec) + ", queued, not started"));
  }
  queue_.clear();
}

// --- public API ---

namespace {

WorkerOptions WithEnvironment(WorkerOptions options) {
  const uint64_t job = options.job;
  const uint32_t rank = options.rank;
  Result<WorkerOptions> applied = worker::ApplyEnvironment(std::move(options));
  if (!applied.ok()) {
    throw Error(StatusCodeName(applied.status().code()), "sparsereduce: job " + std::to_string(job) + " rank " +
                                                             std::to_string(rank) + ": " + applied.status().message());
  }
  return std::move(*applied);
}

}  // namespace

void CheckEnvironment() {
  Result<WorkerOptions> applied = worker::ApplyEnvironment(WorkerOptions{});
  const Status st = applied.ok() ? worker::CheckAggregatorAddresses(applied->aggregators)
                                       .WithContext("SPARSEREDUCE_AGGREGATORS")
                                 : applied.status();
  if (!st.ok()) throw Error(StatusCodeName(st.code()), "sparsereduce: " + st.message());
}

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>(WithEnvironment(std::move(options)))) {}
Worker::~Worker() {
  // In a forked child the I/O thread does not exist (joining it hung) and the connections are the parent's: saying
  // goodbye or deregistering them from the shared epoll instance would break the parent's job. Left as it is.
  if (impl_ && impl_->InForkedChild()) (void)impl_.release();
}

void Worker::abort() { impl_->Abort(); }

void Worker::allreduce(std::span<float> tensor) { allreduce_async(tensor).get(); }
void Worker::allreduce(std::span<int32_t> tensor) { allreduce_async(tensor).get(); }

std::future<void> Worker::allreduce_async(std::span<float> tensor) {
  return impl_->Submit(std::as_writable_bytes(tensor), tensor.size(), DType::kFloat32);
}
std::future<void> Worker::allreduce_async(std::span<int32_t> tensor) {
  return impl_->Submit(std::as_writable_bytes(tensor), tensor.size(), DType::kInt32);
}

void Worker::allreduce(std::span<float> tensor, const AllreduceOptions& options) {
  allreduce_async(tensor, options).get();
}
std::future<void> Worker::allreduce_async(std::span<float> tensor, const AllreduceOptions& options) {
  return impl_->Submit(std::as_writable_bytes(tensor), tensor.size(), DType::kFloat32, options);
}
void Worker::allreduce(std::span<int32_t> tensor, const AllreduceOptions& options) {
  allreduce_async(tensor, options).get();
}
std::future<void> Worker::allreduce_async(std::span<int32_t> tensor, const AllreduceOptions& options) {
  return impl_->Submit(std::as_writable_bytes(tensor), tensor.size(), DType::kInt32, options);
}

CollectiveStats Worker::last_stats() const { return impl_->last_stats(); }
const WorkerOptions& Worker::options() const { return impl_->options(); }
std::vector<std::string> Worker::transports() const { return impl_->transports(); }

}  // namespace sparsereduce
