#include "transport/shm/handoff.h"

#include <linux/sockios.h>  // SIOCOUTQ
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <boost/algorithm/hex.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "protocol/auth.h"
#include "transport/deadline.h"
#include "transport/descriptor.h"
#include "transport/ring/byte_ring.h"
#include "transport/shm/channel.h"

namespace sparsereduce::shm {

namespace asio = boost::asio;
using Unix = asio::local::stream_protocol;

namespace {

constexpr size_t kFdCount = 5;  // memfd, then the worker's ends of the four socket pairs in SegmentFds order
constexpr char kHandoffByte = 'S';
constexpr char kAckByte = 'A';  // the worker's, once it has received the descriptors and mapped the segment

std::string Hex(const std::string& bytes) {
  std::string hex;
  boost::algorithm::hex_lower(bytes.begin(), bytes.end(), std::back_inserter(hex));
  return hex;
}

Unix::endpoint AbstractEndpoint(const std::string& name) { return Unix::endpoint(std::string(1, '\0') + name); }

// The handoff's sendmsg/recvmsg message: one data byte and room for the segment's descriptors (SCM_RIGHTS).
// Not copyable: msg points into the object itself.
struct HandoffMessage {
  explicit HandoffMessage(char data) : byte(data) {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  HandoffMessage(const HandoffMessage&) = delete;
  HandoffMessage& operator=(const HandoffMessage&) = delete;

  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdCount)] = {};
  msghdr msg{};
};

// Sends one byte with the memfd and the worker's socket ends attached (SCM_RIGHTS).
Status SendDescriptors(int socket, const UniqueFd& memory, const std::array<UniqueFd, 4>& events) {
  std::array<int, kFdCount> numbers = {memory.get(), events[0].get(), events[1].get(), events[2].get(),
                                       events[3].get()};
  HandoffMessage handoff(kHandoffByte);
  msghdr& msg = handoff.msg;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * kFdCount);
  std::memcpy(CMSG_DATA(cmsg), numbers.data(), sizeof(int) * kFdCount);
  // One byte into an empty Unix socket buffer: it does not block.
  if (sendmsg(socket, &msg, MSG_NOSIGNAL) != 1) {
    return Status(StatusCode::kUnavailable, std::string("sending the shm descriptors: ") + std::strerror(errno));
  }
  return Status::Ok();
}

// A wake-up descriptor must be a Unix stream socket: this side only ever sends and receives on it with
// MSG_DONTWAIT, which no flag on a shared file description can turn into a blocking call (docs/PROTOCOL.md §10.1).
Status CheckWakeupSocket(int fd, size_t index) {
  struct stat st {};
  int type = 0, domain = 0;
  socklen_t type_len = sizeof type, domain_len = sizeof domain;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &domain_len) != 0 || type != SOCK_STREAM ||
      domain != AF_UNIX) {
    return ProtocolError("the shm handoff's wake-up descriptor " + std::to_string(index + 1) + " of 4 is not a Unix "
                         "stream socket");
  }
  return Status::Ok();
}

// Receives the byte and the descriptors sent by SendDescriptors. kUnavailable with EAGAIN's message when nothing
// has arrived yet.
Result<SegmentFds> ReceiveDescriptors(int socket, bool* again) {
  *again = false;
  HandoffMessage handoff(0);
  msghdr& msg = handoff.msg;
  const char& byte = handoff.byte;
  const ssize_t n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    *again = true;
    return Status(StatusCode::kUnavailable, "no descriptors yet");
  }
  if (n < 0)
    return Status(StatusCode::kUnavailable, std::string("receiving the shm descriptors: ") + std::strerror(errno));
  // Take ownership of whatever arrived before judging it, so nothing leaks.
  std::vector<UniqueFd> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      received.emplace_back(fd);
    }
  }
  if (n == 0) return Status(StatusCode::kUnavailable, "the aggregator closed the shm socket without a handoff");
  if ((msg.msg_flags & MSG_CTRUNC) && received.size() < kFdCount) {
    // The kernel hands over only the descriptors this process may still open (RLIMIT_NOFILE) and flags the rest as
    // cut off: a shortage of ours, not a broken handoff, so a worker with transport "auto" stays on TCP.
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    return Status(StatusCode::kUnavailable,
                  "out of file descriptors: the shm handoff delivered " + std::to_string(received.size()) + " of " +
                      std::to_string(kFdCount) + " (RLIMIT_NOFILE " + std::to_string(limit.rlim_cur) + ")");
  }
  if (byte != kHandoffByte) {
    return ProtocolError("the shm handoff's byte is " + std::to_string(static_cast<unsigned char>(byte)) +
                         ", expected " + std::to_string(static_cast<unsigned char>(kHandoffByte)) + " ('S')");
  }
  if ((msg.msg_flags & MSG_CTRUNC) || received.size() != kFdCount) {
    return ProtocolError("the shm handoff carried " + std::string(msg.msg_flags & MSG_CTRUNC ? "more than " : "") +
                         std::to_string(received.size()) + " descriptors, expected " + std::to_string(kFdCount));
  }
  SegmentFds fds;
  fds.memory = std::move(received[0]);
  for (size_t i = 0; i < 4; ++i) fds.events[i] = std::move(received[i + 1]);
  for (size_t i = 0; i < fds.events.size(); ++i) {
    if (Status st = CheckWakeupSocket(fds.events[i].get(), i); !st.ok()) return st;
  }
  return fds;
}

// Bytes this side sent on a Unix socket that the peer has not received yet (they stay charged to the sender).
int Unreceived(int socket) {
  int bytes = 0;
  return ioctl(socket, SIOCOUTQ, &bytes) == 0 ? bytes : 0;  // an error: nothing left to watch
}

// A place taken among the pending offers (PendingOffers::TryAcquire), given back when this goes: also when the
// io_context is destroyed with the coroutine that holds it suspended.
class PendingPlace {
 public:
  explicit PendingPlace(PendingOffers* pending) : pending_(pending) {}
  bool stopped() const { return pending_ != nullptr && pending_->stopped(); }
  PendingPlace(PendingPlace&& other) noexcept : pending_(std::exchange(other.pending_, nullptr)) {}
  PendingPlace& operator=(PendingPlace&&) = delete;
  ~PendingPlace() {
    if (pending_ != nullptr) pending_->Release();
  }

 private:
  PendingOffers* pending_;
};

// Holds `place` until what was sent on `socket` has left its send queue: received by the worker, or discarded when
// the worker closed its end, or until the offers stop (shutdown). Polled, since nothing signals either to this
// side; at most PendingOffers::cap() of these run.
asio::awaitable<void> WatchUnreceived(Unix::socket socket, PendingPlace place) {
  asio::steady_timer poll(co_await asio::this_coro::executor);
  while (!place.stopped() && Unreceived(socket.native_handle()) > 0) {
    poll.expires_after(std::chrono::milliseconds(200));
    co_await poll.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace

bool PendingOffers::TryAcquire() {
  int count = count_.load();
  while (count < cap_) {
    if (count_.compare_exchange_weak(count, count + 1)) return true;
  }
  return false;
}

Result<std::unique_ptr<ShmOffer>> ShmOffer::Create(const asio::any_io_executor& executor, uint64_t ring_capacity,
                                                   PendingOffers& pending) {
  if (Status st = transport::ByteRing::CheckCapacity(ring_capacity); !st.ok()) return st;
  std::string name, token;
  try {
    name = "sparsereduce/" + Hex(auth::RandomBytes(16));
    token = auth::RandomBytes(kTokenBytes);
  } catch (const std::runtime_error& e) {
    return Status(StatusCode::kUnavailable, std::string("shm offer: ") + e.what());
  }
  Unix::acceptor acceptor(executor);
  boost::system::error_code ec;
  acceptor.open(Unix(), ec);
  if (!ec) acceptor.bind(AbstractEndpoint(name), ec);
  if (!ec) acceptor.listen(4, ec);
  if (ec) return Status(StatusCode::kUnavailable, "listening on the shm socket @" + name + ": " + ec.message());
  return std::unique_ptr<ShmOffer>(new ShmOffer(std::move(acceptor), name, std::move(token), ring_capacity, &pending));
}

namespace {

// Connections of one handoff whose tokens are read at once; more are closed as they come.
constexpr size_t kMaxTokenReaders = 16;

// The connections of one handoff whose tokens are being read, each by its own coroutine on the handoff's strand.
// The first with the right token becomes the winner and wakes the accept loop by cancelling its accept.
struct TokenRace {
  std::string token;
  Unix::acceptor* acceptor;  // null once the handoff has ended: late readers then do nothing
  std::optional<Unix::socket> winner;
  std::vector<std::weak_ptr<Unix::socket>> readers;
};

asio::awaitable<void> ReadToken(std::shared_ptr<TokenRace> race, std::shared_ptr<Unix::socket> peer,
                                std::chrono::steady_clock::time_point deadline) {
  transport::Deadline read_deadline(co_await asio::this_coro::executor, deadline, *peer);
  std::string token(kTokenBytes, '\0');
  auto [ec, n] = co_await asio::async_read(*peer, asio::buffer(token), asio::as_tuple(asio::use_awaitable));
  // A stranger, a worker that gave up, or too late: its connection closes with this coroutine.
  // Constant time: how many leading bytes of a guess matched must not show in when the connection closes.
  if (ec || !auth::ProofMatches(race->token, token) || race->acceptor == nullptr || race->winner) co_return;
  race->winner.emplace(std::move(*peer));
  race->acceptor->cancel();
}

}  // namespace

asio::awaitable<Status> ShmOffer::Handoff(std::chrono::steady_clock::time_point deadline) {
  if (Status st = co_await AcceptWorker(deadline); !st.ok()) co_return st;
  co_return co_await HandOver(deadline);
}

asio::awaitable<Status> ShmOffer::AcceptWorker(std::chrono::steady_clock::time_point deadline) {
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  transport::Deadline accept_deadline(executor, deadline, acceptor_);
  auto race = std::make_shared<TokenRace>(TokenRace{token_, &acceptor_, std::nullopt, {}});
  struct EndRace {  // on every way out: readers still waiting for a token are closed and can no longer win
    std::shared_ptr<TokenRace> race;
    ~EndRace() {
      race->acceptor = nullptr;
      for (const std::weak_ptr<Unix::socket>& reader : race->readers) {
        boost::system::error_code ignored;
        if (auto socket = reader.lock()) socket->close(ignored);
      }
    }
  } end_race{race};
  while (true) {
    auto [ec, peer] = co_await acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
    if (race->winner) {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      worker_.emplace(std::move(*race->winner));  // open as long as this offer: the worker waits on it
      co_return Status::Ok();
    }
    if (accept_deadline.expired())
      co_return Status(StatusCode::kDeadlineExceeded, "no worker took the shm offer in time");
    if (ec == asio::error::operation_aborted) co_return Status(StatusCode::kAborted, "shm offer withdrawn");
    if (ec) co_return Status(StatusCode::kUnavailable, "accepting on the shm socket: " + ec.message());
    std::erase_if(race->readers, [](const std::weak_ptr<Unix::socket>& r) { return r.expired(); });
    if (race->readers.size() >= kMaxTokenReaders) {
      // Anyone on the host can connect to the socket: without a bound, connections held open until the deadline
      // took descriptors that every job needs. The worker connects as soon as it has the offer, ahead of them.
      boost::system::error_code ignored;
      peer.close(ignored);
      continue;
    }
    auto socket = std::make_shared<Unix::socket>(std::move(peer));
    race->readers.push_back(socket);
    asio::co_spawn(executor, ReadToken(race, std::move(socket), deadline), asio::detached);
  }
}

asio::awaitable<Status> ShmOffer::HandOver(std::chrono::steady_clock::time_point deadline) {
  if (!worker_) co_return Status(StatusCode::kInternal, "shm HandOver before a worker presented the token");
  if (!pending_->TryAcquire()) {
    co_return Status(StatusCode::kResourceExhausted,
                     std::to_string(pending_->cap()) +
                         " shm offers wait for their workers to receive the descriptors (the cap); not sending more");
  }
  PendingPlace place(pending_);
  // Made only now, for the connection that presented the token, and within the cap above: a segment takes nine
  // descriptors, which every handshake that merely listed "shm2" held until its deadline.
  auto created = Segment::Create(ring_capacity_);
  if (!created.ok()) co_return Status(StatusCode::kResourceExhausted, created.status().message());
  segment_ = std::move(created->segment);
  fds_ = std::move(created->fds);
  peer_events_ = std::move(created->peer_events);
  if (Status st = SendDescriptors(worker_->native_handle(), fds_.memory, peer_events_); !st.ok()) {
    co_return Status(StatusCode::kResourceExhausted, st.message());
  }
  peer_events_ = {};  // the worker's now: this side keeps only its own ends
  handover_progress_ = "the descriptors were sent";
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  asio::steady_timer timeout(executor, deadline);
  char ack = 0;
  using namespace asio::experimental::awaitable_operators;
  auto outcome = co_await (asio::async_read(*worker_, asio::buffer(&ack, 1), asio::as_tuple(asio::use_awaitable)) ||
                           timeout.async_wait(asio::as_tuple(asio::use_awaitable)));
  Status st = Status::Ok();
  if (outcome.index() == 1) {
    st = Status(StatusCode::kDeadlineExceeded, "the worker did not acknowledge the shm descriptors in time");
  } else if (const boost::system::error_code ec = std::get<0>(std::get<0>(outcome));
             ec == asio::error::eof && Unreceived(worker_->native_handle()) == 0) {
    // It has them and closed without the byte: it could not map the segment, and declines on TCP (§10.1).
    st = Status(StatusCode::kAborted, "the worker closed the shm socket without acknowledging the descriptors");
  } else if (ec) {
    st = Status(StatusCode::kUnavailable, "waiting for the worker to acknowledge the shm descriptors: " + ec.message());
  } else if (ack != kAckByte) {
    st = ProtocolError("the worker acknowledged the shm descriptors with byte " + std::to_string(ack));
  } else if (Unreceived(worker_->native_handle()) > 0) {
    // The byte alone proves nothing: it can be written without reading what this side sent.
    st = ProtocolError("the worker acknowledged the shm descriptors without receiving them");
  }
  if (st.ok()) {
    handover_progress_ = "acknowledged";
  } else {
    handover_progress_ = Unreceived(worker_->native_handle()) > 0
                             ? "the worker had not received the descriptors"
                             : "the worker had received the descriptors (or closed its end) and not acknowledged them";
    st = Status(st.code(), st.message() + " (" + handover_progress_ + ")");
    // The descriptors may still be in flight, charged to this daemon: they count until they are gone.
    asio::co_spawn(executor, WatchUnreceived(std::move(*worker_), std::move(place)), asio::detached);
  }
  worker_.reset();
  co_return st;
}

std::unique_ptr<transport::Channel> ShmOffer::MakeChannel(asio::ip::tcp::socket liveness,
                                                          const asio::any_io_executor& executor) {
  return std::make_unique<ShmChannel>(std::move(segment_), std::move(fds_), Direction::kToAggregator,
                                      std::move(liveness), executor);
}

std::unique_ptr<transport::Channel> ShmAttachment::MakeChannel(asio::ip::tcp::socket liveness,
                                                               const asio::any_io_executor& executor) {
  return std::make_unique<ShmChannel>(std::move(segment), std::move(fds), Direction::kToWorker, std::move(liveness),
                                      executor);
}

asio::awaitable<Result<ShmAttachment>> AttachShm(const asio::any_io_executor& executor, const std::string& socket_name,
                                                 const std::string& token,
                                                 std::chrono::steady_clock::time_point deadline) {
  if (token.size() != kTokenBytes)
    co_return ProtocolError("shm offer token of " + std::to_string(token.size()) + " bytes");
  if (socket_name.empty() || socket_name.size() > 100) co_return ProtocolError("shm offer with a bad socket name");
  Unix::socket socket(executor);
  transport::Deadline bound(executor, deadline, socket);
  auto [ec] = co_await socket.async_connect(AbstractEndpoint(socket_name), asio::as_tuple(asio::use_awaitable));
  if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {  // the socket could not even be opened
    co_return Status(StatusCode::kUnavailable,
                     "out of file descriptors: cannot open a socket to the aggregator's shared-memory socket @" +
                         socket_name + " (" + ec.message() + ")");
  }
  if (!ec) {
    if (Status st = transport::SetCloseOnExec(socket.native_handle()); !st.ok()) co_return st;
  }
  if (ec) {
    co_return Status(StatusCode::kUnavailable, "the aggregator's shared-memory socket @" + socket_name +
                                                   " is not reachable from here (" + ec.message() +
                                                   "): it runs on another host or in another network namespace");
  }
  auto [wec, written] = co_await asio::async_write(socket, asio::buffer(token), asio::as_tuple(asio::use_awaitable));
  if (wec) co_return Status(StatusCode::kUnavailable, "presenting the shm token: " + wec.message());
  while (true) {
    auto [rec] = co_await socket.async_wait(Unix::socket::wait_read, asio::as_tuple(asio::use_awaitable));
    if (bound.expired()) co_return Status(StatusCode::kDeadlineExceeded, "no shm descriptors within the deadline");
    if (rec) co_return Status(StatusCode::kUnavailable, "waiting for the shm descriptors: " + rec.message());
    bool again = false;
    Result<SegmentFds> fds = ReceiveDescriptors(socket.native_handle(), &again);
    if (again) continue;
    if (!fds.ok()) co_return fds.status();
    Result<std::shared_ptr<Segment>> segment = Segment::Attach(*fds);
    if (!segment.ok()) co_return segment.status();
    // Until this byte the aggregator counts the offer as pending (docs/PROTOCOL.md §10.1). One byte into an empty
    // socket buffer: it does not wait.
    auto [aec, acked] = co_await asio::async_write(socket, asio::buffer(&kAckByte, 1),
                                                   asio::as_tuple(asio::use_awaitable));
    if (aec) co_return Status(StatusCode::kUnavailable, "acknowledging the shm descriptors: " + aec.message());
    co_return ShmAttachment{std::move(*segment), std::move(*fds)};
  }
}

}  // namespace sparsereduce::shm
