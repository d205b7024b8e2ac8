// Fuzzes the reading side of a shared-memory connection (transport/ring/ring_channel.cc, transport/shm/channel.cc,
// docs/PROTOCOL.md §10.2) against a hostile or broken peer: the peer owns the receive ring's `head`,
// `producer_closed` and data bytes, and may store anything there at any time. The input is a program for that peer
// and for the reader (the aggregator daemon's side): the peer writes frame headers and bytes, publishes its head
// validly or not (backwards, past the free space, huge), sets and clears `producer_closed`, wakes or does not wake
// the reader, scribbles over bytes already published, closes its wake-up socket or its TCP connection or writes on
// it, and frees (or claims to free) the channel's send ring; the reader calls ReadHeader, ReadPayload,
// ReadPayloadLent (with a recall handler that gives the loans back), ReadInto, Discard, Send, CloseAfterFlush,
// Abort and destroys the channel while it still lends payloads.
//
// Two backends, chosen by bit 0 of byte 0:
//  - the real ShmChannel over a real in-process Segment (memfd, socket-pair wake-ups, Segment::Create as the
//    aggregator makes it), with a socketpair as the liveness connection; the peer acts between the reader's steps
//    (the io_context is run handler by handler, so the peer acts whenever the reader suspends);
//  - ScriptedChannel, a RingChannel backend of this file whose receive ring is a heap array of exactly the ring's
//    capacity (ASan reports any access outside it; the segment's mapping would hide one) and whose LoadReceived and
//    WaitForData first let the peer act from a second script (the input's last `byte 1` bytes): the peer's head,
//    closed flag and bytes change between any two loads of the reader, e.g. between the checked load and the
//    reload of ReadScattered's end-of-stream branch, as a concurrent process may.
//
// Checked (FUZZ_CHECK traps), besides no crash, no ASan/UBSan report and no hang (libFuzzer's -timeout):
//  - every read that succeeds returns exactly the bytes the peer published validly at those stream positions
//    (positions the peer overwrote after publishing them are not compared), never bytes beyond its valid head; a
//    ReadHeader result equals DecodeFrameHeader of those bytes (also when the decode fails);
//  - every failed read is explained by what the peer did: PROTOCOL_VIOLATION from the ring only after a hostile
//    position or a byte on the TCP connection, UNAVAILABLE only after the peer closed (flag, wake-up socket, TCP
//    connection, or CloseAfterFlush(both) ended the liveness watch), ABORTED only after Abort(); a payload read never
//    fails with anything else;
//  - a lent payload lies inside the ring's memory; while the reader is in sync, the tail it publishes is the start
//    of its oldest outstanding loan, or how far it has read; a reader that sleeps holds back at most 3/4 of the
//    ring;
//  - the bytes the channel publishes in its send ring are exactly the frames given to Send, in order;
//  - the reader settles (every handler run, waiting for the peer) within a bounded number of handlers after any
//    peer step: a read that waits for more data is a valid outcome, not a hang; at the end, a visible head that
//    breaks tail <= head <= tail + capacity makes a fresh read fail, and a read still waiting completes with an
//    error once the channel is aborted.
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/frame.h"
#include "transport/ring/ring_channel.h"
#include "transport/shm/channel.h"
#include "transport/shm/segment.h"

using namespace sparsereduce;
namespace asio = boost::asio;

namespace {

using shm::Direction;
using shm::RingControl;
using shm::UniqueFd;

constexpr uint64_t kMaxStream = uint64_t{4} << 20;  // the peer publishes at most this many bytes per input
constexpr size_t kMaxSent = size_t{1} << 20;         // and the reader sends at most this many
constexpr int kMaxOps = 1024;
constexpr int kMaxHookActions = 2000;
constexpr int kSettleHandlers = 200000;  // handlers the reader may run after a peer step before it must wait

// The memory of a ScriptedChannel; lent payloads keep it alive.
struct ScriptedMemory {
  explicit ScriptedMemory(uint64_t capacity)
      : rx(new std::byte[capacity]()), tx(new std::byte[capacity]()), rx_control(new RingControl()) {}
  std::unique_ptr<std::byte[]> rx, tx;  // exactly `capacity` bytes each: ASan sees any access outside
  std::unique_ptr<RingControl> rx_control;
};

// A RingChannel backend whose peer is this file: the receive ring is ScriptedMemory, the send ring's tail is set
// by the peer, and before every load of the peer's positions (and before WaitForData decides to sleep) `hook` lets
// the peer act, as a concurrent process may between any two loads.
class ScriptedChannel final : public transport::RingChannel {
 public:
  ScriptedChannel(uint64_t capacity, asio::ip::tcp::socket liveness, asio::any_io_executor executor,
                  std::shared_ptr<ScriptedMemory> memory, std::function<void()> hook)
      : RingChannel(capacity, std::move(liveness), executor),
        memory_(std::move(memory)),
        rx_(*memory_->rx_control),
        hook_(std::move(hook)),
        timer_(executor) {
    EnableLending(memory_);
    StartLiveness();
  }
  ~ScriptedChannel() override { StopLending(); }

  const char* kind() const override { return "scripted-shm"; }

  // --- the peer's side ---
  // The producer's wake-up (Dekker, as ShmChannel::Publish): only a consumer that said it waits is woken.
  void WakeReader(bool always) {
    if (always || rx_.consumer_waiting.load(std::memory_order_seq_cst)) timer_.cancel();
  }
  void SetPeerTxTail(uint64_t tail) {
    peer_tx_tail_ = tail;
    if (space_wake_) asio::post(executor(), std::exchange(space_wake_, nullptr));
  }
  uint64_t tx_head() const { return tx_head_; }
  uint64_t peer_tx_tail() const { return peer_tx_tail_; }

 private:
  const std::byte* ReceiveMemory() override { return memory_->rx.get(); }
  Received LoadReceived() override {
    if (hook_) hook_();
    const bool closed = rx_.producer_closed.load(std::memory_order_acquire) != 0;
    return {rx_.head.load(std::memory_order_acquire), closed};
  }
  void Consumed(uint64_t tail) override { rx_.tail.store(tail, std::memory_order_seq_cst); }
  asio::awaitable<void> WaitForData(uint64_t tail) override {
    if (failed()) co_return;
    rx_.consumer_waiting.store(1, std::memory_order_seq_cst);
    if (hook_) hook_();  // the peer may act between the flag and the check
    if (rx_.head.load(std::memory_order_seq_cst) == tail && !rx_.producer_closed.load(std::memory_order_seq_cst)) {
      timer_.expires_at(asio::steady_timer::time_point::max());
      co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));  // woken or cancelled: the caller looks
    }
    rx_.consumer_waiting.store(0, std::memory_order_relaxed);
  }
  std::byte* SendMemory() override { return memory_->tx.get(); }
  uint64_t LoadPeerTail() override { return peer_tx_tail_; }
  void Publish(uint64_t, uint64_t to) override { tx_head_ = to; }
  void WaitForSpace(uint64_t head, std::function<void()> wake) override {
    if (ring().Free(head, peer_tx_tail_) > 0) {
      asio::post(executor(), std::move(wake));
      return;
    }
    space_wake_ = std::move(wake);
  }
  void CloseSend(uint64_t) override { tx_closed_ = true; }
  void CancelWaits() override {
    timer_.cancel();
    if (space_wake_) asio::post(executor(), std::exchange(space_wake_, nullptr));
  }

  std::shared_ptr<ScriptedMemory> memory_;
  RingControl& rx_;
  std::function<void()> hook_;
  asio::steady_timer timer_;
  uint64_t peer_tx_tail_ = 0;
  uint64_t tx_head_ = 0;
  bool tx_closed_ = false;
  std::function<void()> space_wake_;
};

// A ring failure (LoadChecked, Pump), the liveness connection, an end of stream or Abort: the channel's own
// statuses, as opposed to DecodeFrameHeader's.
bool IsTransportFailure(const Status& st) {
  const std::string& m = st.message();
  return m.find("ring of the ") != std::string::npos || m.find("connection closed") != std::string::npos ||
         m.find("the peer sent data on its TCP connection") != std::string::npos;
}

// RING_FUZZ_TRACE=1 prints the ops and failures (for reproducing).
bool Trace() {
  static const bool trace = std::getenv("RING_FUZZ_TRACE") != nullptr;
  return trace;
}

bool SameHeader(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.payload_length == b.payload_length && a.slot == b.slot && a.job == b.job &&
         a.seq == b.seq && a.entry_count == b.entry_count;
}

enum Op : int {
  // The peer (also from the hook script).
  kWriteHeader,
  kWriteBytes,
  kWriteFill,
  kPublishWake,
  kPublishSilent,
  kHostileHead,
  kSetClosed,
  kClearClosed,
  kWake,
  kScribble,
  kRewind,
  kEndpoint,
  kTxConsume,
  kNumPeerOps,
  // The reader.
  kReadHeader = kNumPeerOps,
  kReadPayload,
  kReadLent,
  kReadInto,
  kDiscard,
  kSetRecall,
  kRelease,
  kSend,
  kSettle,
  kAbort,
  kCloseAfterFlush,
  kDestroy,
  kNumOps
};

struct ReadRequest {
  int kind = kReadHeader;
  uint64_t size = 0;
  std::vector<uint64_t> parts;      // ReadInto
  std::vector<bool> null_parts;     // ReadInto: targets without memory (their bytes are dropped)
  bool use_pool = false;
};

struct Lent {
  uint64_t position;
  ByteBuffer buffer;
};

class Harness {
 public:
  Harness(const uint8_t* data, size_t size) : in_(data, size), hook_in_(nullptr, 0) {
    fuzz::ByteReader head(data, size);
    const uint8_t config = head.U8();
    const uint8_t hook_bytes = head.U8();
    in_ = fuzz::ByteReader(data + std::min<size_t>(size, 2), size - std::min<size_t>(size, 2));
    const size_t hook_len = std::min<size_t>(hook_bytes, in_.remaining());
    hook_in_ = fuzz::ByteReader(data + size - hook_len, hook_len);
    in_ = fuzz::ByteReader(data + std::min<size_t>(size, 2), in_.remaining() - hook_len);
    shm_mode_ = (config & 1) != 0;
    capacity_ = uint64_t{4096} << ((config >> 1) & 1);
    recall_copies_ = (config & 4) != 0;
    pool_ = BufferPool::Create(uint64_t{1} << 20);
    Build();
    if (config & 8) SetRecall();
  }

  void Run() {
    for (int n = 0; n < kMaxOps && !in_.empty(); ++n) {
      const uint8_t op = in_.U8();
      const int kind = op % kNumOps;
      if (Trace()) {
        std::fprintf(stderr, "op %d (head %llu tail %llu wpos %llu valid %zu rpos %llu pending %d)\n", kind,
                     static_cast<unsigned long long>(Head()), static_cast<unsigned long long>(Tail()),
                     static_cast<unsigned long long>(wpos_), shadow_.size(), static_cast<unsigned long long>(rpos_),
                     read_pending_ ? 1 : 0);
      }
      if (kind < kNumPeerOps) {
        PeerAct(kind, in_);
      } else {
        ReaderAct(kind);
      }
      Step(op >> 5);  // 0..7 handlers: the peer's next step may come while the reader is half way
      if (n % 8 == 7) Settle();
    }
    Finish();
  }

 private:
  // --- setup ---
  void Build() {
    int fds[2];
    FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
    liveness_peer_ = UniqueFd(fds[1]);
    asio::ip::tcp::socket liveness(io_);
    liveness.assign(asio::ip::tcp::v4(), fds[0]);  // any stream socket will do: it only reads and shuts down
    if (shm_mode_) {
      Result<shm::Segment::Created> created = shm::Segment::Create(capacity_);
      FUZZ_CHECK(created.ok(), "Segment::Create: %s", created.status().ToString().c_str());
      shm::Segment::Created c = std::move(created).value();
      segment_ = c.segment;
      peer_events_ = std::move(c.peer_events);
      rx_ = &segment_->control(Direction::kToAggregator);
      rx_data_ = segment_->data(Direction::kToAggregator);
      tx_control_ = &segment_->control(Direction::kToWorker);
      tx_data_ = segment_->data(Direction::kToWorker);
      channel_ = std::make_unique<shm::ShmChannel>(segment_, std::move(c.fds), Direction::kToAggregator,
                                                   std::move(liveness), io_.get_executor());
    } else {
      memory_ = std::make_shared<ScriptedMemory>(capacity_);
      rx_ = memory_->rx_control.get();
      rx_data_ = memory_->rx.get();
      tx_data_ = memory_->tx.get();
      auto channel = std::make_unique<ScriptedChannel>(capacity_, std::move(liveness), io_.get_executor(), memory_,
                                                       [this] { Hook(); });
      scripted_ = channel.get();
      channel_ = std::move(channel);
    }
    channel_->set_error_handler([this](const Status& st) {
      FUZZ_CHECK(!st.ok(), "the error handler got OK");
      write_errors_++;
    });
    channel_->set_idle_handler([this] { ++idles_; });
  }

  // --- running the reader ---
  void Step(int handlers) {
    io_.restart();
    for (int i = 0; i < handlers; ++i) {
      if (io_.poll_one() == 0) break;
    }
  }
  // Runs every handler that is ready until the reader waits for the peer (or has nothing to do).
  void Settle() {
    io_.restart();
    for (int i = 0; i < kSettleHandlers; ++i) {
      if (io_.poll_one() == 0) {
        CheckAtRest();
        return;
      }
    }
    FUZZ_CHECK(false, "the channel ran %d handlers without waiting for the peer", kSettleHandlers);
  }

  // Invariants of a reader at rest (nothing ready to run).
  void CheckAtRest() {
    if (!channel_ || !sync_ || hostile_) return;
    uint64_t oldest = rpos_;
    bool loans = false;
    for (const Lent& l : lent_) {
      if (l.buffer.on_loan()) {
        oldest = std::min(oldest, l.position);
        loans = true;
      }
    }
    if (!read_pending_) {
      const uint64_t tail = rx_->tail.load();
      FUZZ_CHECK(tail == oldest, "published tail %llu, expected %llu (read up to %llu, loans %d)",
                 static_cast<unsigned long long>(tail), static_cast<unsigned long long>(oldest),
                 static_cast<unsigned long long>(rpos_), loans ? 1 : 0);
    } else if (loans) {
      FUZZ_CHECK(rpos_ - oldest <= capacity_ / 4 * 3,
                 "the reader waits for the peer holding back %llu bytes of a %llu-byte ring",
                 static_cast<unsigned long long>(rpos_ - oldest), static_cast<unsigned long long>(capacity_));
    }
  }

  // --- the peer ---
  uint64_t Head() const { return rx_->head.load(); }
  uint64_t Tail() const { return rx_->tail.load(); }

  void Hook() {
    if (!hooks_enabled_ || hook_in_.empty() || hook_actions_ >= kMaxHookActions) return;
    ++hook_actions_;
    const uint8_t c = hook_in_.U8();
    if (c % 4 == 0) return;  // the peer did nothing meanwhile
    if (Trace()) std::fprintf(stderr, "  hook: peer op %d\n", (c >> 2) % kNumPeerOps);
    PeerAct((c >> 2) % kNumPeerOps, hook_in_);
  }

  void WriteAt(uint64_t position, std::byte b) {
    const uint64_t offset = position & (capacity_ - 1);
    if (!hostile_) {
      // The published, unconsumed position at this offset (if any) no longer holds what was published.
      const uint64_t tail = Tail();
      const uint64_t p = tail + ((offset - tail) & (capacity_ - 1));
      if (p < shadow_.size()) shadow_[p] = -1;
    }
    rx_data_[offset] = b;
  }

  void PublishHead(uint64_t head) {
    if (!hostile_) {
      const uint64_t valid = shadow_.size();
      if (head >= valid && head - Tail() <= capacity_ && head >= Tail()) {
        if (head > kMaxStream) return;  // keeps the model small; the peer just does not publish
        for (uint64_t p = valid; p < head; ++p) {
          shadow_.push_back(static_cast<int16_t>(std::to_integer<uint8_t>(rx_data_[p & (capacity_ - 1)])));
        }
      } else {
        hostile_ = true;
      }
    }
    rx_->head.store(head, std::memory_order_seq_cst);
  }

  void WakeReader(bool always) {
    if (scripted_) {
      scripted_->WakeReader(always);
    } else if (shm_mode_ && peer_events_[0].valid() &&
               (always || rx_->consumer_waiting.load(std::memory_order_seq_cst))) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = ::send(peer_events_[0].get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }

  uint64_t TxHead() const { return scripted_ ? scripted_->tx_head() : tx_control_ ? tx_control_->head.load() : 0; }

  void PeerAct(int kind, fuzz::ByteReader& r) {
    switch (kind) {
      case kWriteHeader: {
        FrameHeader h;
        const uint8_t t = r.U8();
        h.type = static_cast<FrameType>(1 + t % 3);
        h.payload_length = static_cast<uint32_t>(r.U16() % (3 * capacity_ + 1));
        if (h.type != FrameType::kControl) {
          h.entry_count = std::min<uint32_t>(t >> 2, h.payload_length / kEntrySize);
          h.job = r.U8();
          h.seq = r.U8();
          h.slot = t >> 6;
        }
        std::array<std::byte, kFrameHeaderSize> bytes;
        EncodeFrameHeader(h, bytes.data());
        if ((t & 0x30) == 0x30) bytes[r.U8() % kFrameHeaderSize] ^= std::byte{static_cast<uint8_t>(1 | r.U8())};
        for (std::byte b : bytes) WriteAt(wpos_++, b);
        break;
      }
      case kWriteBytes: {
        const std::span<const uint8_t> bytes = r.Bytes(1 + r.U8() % 64);
        for (uint8_t b : bytes) WriteAt(wpos_++, std::byte{b});
        break;
      }
      case kWriteFill: {  // a payload: up to a ring of generated bytes
        const uint64_t n = r.U16() % (capacity_ + 1);
        fuzz::Rng rng(r.U8());
        for (uint64_t i = 0; i < n; ++i) WriteAt(wpos_++, std::byte{static_cast<uint8_t>(rng.Next())});
        break;
      }
      case kPublishWake:
      case kPublishSilent: {
        // Publish what was written, or only part of it (a producer that stores its head mid-frame).
        const uint8_t how = r.U8();
        uint64_t head = wpos_;
        if (how & 1) head = std::max<uint64_t>(Head(), wpos_ - std::min<uint64_t>(wpos_, how >> 1));
        PublishHead(std::max(head, Head()));
        if (kind == kPublishWake) WakeReader(false);
        break;
      }
      case kHostileHead: {
        const uint8_t how = r.U8();
        const uint64_t k = 1 + r.U16();
        const uint64_t tail = Tail(), head = Head();
        uint64_t h = 0;
        switch (how % 8) {
          case 0: h = head - std::min(head, k); break;                // backwards
          case 1: h = tail + capacity_ + (k % 64); break;             // past the free space (k % 64 == 0: full)
          case 2: h = tail - 1; break;                                // behind the tail (wraps at 0)
          case 3: h = r.U64(); break;                                 // anything
          case 4: h = uint64_t{1} << 63; break;
          case 5: h = ~uint64_t{0}; break;
          case 6: h = head + capacity_ + 1; break;
          case 7: h = wpos_ + k; break;                               // bytes never written
        }
        PublishHead(h);
        if (how & 8) WakeReader(true);
        break;
      }
      case kSetClosed:
        rx_->producer_closed.store(1 + (r.U8() & 0x7f), std::memory_order_seq_cst);  // any nonzero value
        ended_ = true;
        WakeReader(false);
        break;
      case kClearClosed:
        rx_->producer_closed.store(0, std::memory_order_seq_cst);
        break;
      case kWake:
        WakeReader((r.U8() & 1) != 0);
        break;
      case kScribble: {  // over bytes anywhere in the ring, published or not
        uint64_t at = Tail() + r.U16() % capacity_;
        const std::span<const uint8_t> bytes = r.Bytes(1 + r.U8() % 32);
        for (uint8_t b : bytes) WriteAt(at++, std::byte{b});
        break;
      }
      case kRewind:  // forget what was written and not published
        wpos_ = hostile_ ? Head() : shadow_.size();
        break;
      case kEndpoint: {
        const uint8_t what = r.U8() % 8;
        if (what == 0 && liveness_peer_.valid()) {  // the peer process dies: its TCP connection closes
          liveness_peer_.reset();
          ended_ = true;
        } else if (what == 1 && liveness_peer_.valid()) {  // a byte on TCP after the switch
          const char byte = 'x';
          if (::send(liveness_peer_.get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) hostile_ = true;
        } else if (what == 2 && shm_mode_ && peer_events_[0].valid()) {  // closes its end of the data wake-up
          peer_events_[0].reset();
          ended_ = true;
        } else if (what == 3 && shm_mode_ && peer_events_[0].valid()) {  // floods it
          std::array<char, 2048> junk{};
          [[maybe_unused]] ssize_t n = ::send(peer_events_[0].get(), junk.data(), junk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        } else if (what == 4 && shm_mode_ && peer_events_[3].valid()) {  // closes the space wake-up of the send ring
          peer_events_[3].reset();
          ended_ = true;
        } else if (what == 5) {  // waits for space in the receive ring: the reader's Consumed signals it
          rx_->producer_waiting.store(1, std::memory_order_seq_cst);
        } else if (what == 6 && tx_control_) {  // waits for data in the send ring: the channel's Publish signals it
          tx_control_->consumer_waiting.store(1, std::memory_order_seq_cst);
        } else if (what == 7) {
          rx_->producer_waiting.store(0, std::memory_order_seq_cst);
          if (tx_control_) tx_control_->consumer_waiting.store(0, std::memory_order_seq_cst);
        }
        break;
      }
      case kTxConsume: {
        const uint8_t how = r.U8();
        const uint64_t head = TxHead();
        if ((how & 7) != 7) {
          // Reads what the channel published and frees it: the bytes must be the frames given to Send, in order.
          const uint64_t k = std::min<uint64_t>(head - tx_tail_, 1 + r.U16());
          if (!hostile_ && head >= tx_tail_ && head - tx_tail_ <= capacity_) {
            for (uint64_t p = tx_tail_; p < tx_tail_ + k; ++p) {
              FUZZ_CHECK(p < sent_.size(), "the channel published byte %llu of its send ring, beyond the %zu sent",
                         static_cast<unsigned long long>(p), sent_.size());
              FUZZ_CHECK(std::to_integer<uint8_t>(tx_data_[p & (capacity_ - 1)]) == sent_[p],
                         "send ring byte %llu differs from what was sent", static_cast<unsigned long long>(p));
            }
            tx_tail_ += k;
          }
        } else {
          tx_tail_ = r.U64() % (head + 2 * capacity_ + 2);  // maybe beyond the head, or back
          if (tx_tail_ > head || head - tx_tail_ > capacity_) hostile_ = true;
          // A tail that moves back is not checked by the producer (it cannot tell), only one out of order.
          if (tx_tail_ < tx_published_tail_) tx_hostile_ = true;
        }
        tx_published_tail_ = std::max(tx_published_tail_, tx_tail_);
        if (scripted_) {
          scripted_->SetPeerTxTail(tx_tail_);
        } else if (tx_control_) {
          tx_control_->tail.store(tx_tail_, std::memory_order_seq_cst);
          if (tx_control_->producer_waiting.load(std::memory_order_seq_cst) && peer_events_[3].valid()) {
            const char byte = 1;
            [[maybe_unused]] ssize_t n = ::send(peer_events_[3].get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
          }
        }
        if (tx_hostile_) hostile_ = true;
        break;
      }
      default:
        break;
    }
  }

  // --- the reader ---
  uint64_t ReadSize() {
    const uint8_t how = in_.U8();
    if (how < 96) return reader_plen_;  // the payload of the last header read (0 before one)
    if (how < 160) return in_.U8();
    return in_.U16() % (4 * capacity_ + 1);
  }

  void SetRecall() {
    if (!channel_ || recall_set_) return;
    recall_set_ = true;
    channel_->set_recall_handler([this] {
      ++recalls_;
      // The handler's contract: every lent buffer is destroyed (or copied and destroyed) before it returns.
      for (Lent& l : lent_) {
        if (!l.buffer.on_loan()) continue;
        if (recall_copies_) {
          ByteBuffer copy(l.buffer.size());
          if (l.buffer.size() > 0) std::memcpy(copy.data(), l.buffer.data(), l.buffer.size());
          l.buffer = std::move(copy);
        } else {
          l.buffer = ByteBuffer();
        }
      }
    });
  }

  void ReaderAct(int kind) {
    switch (kind) {
      case kReadHeader:
      case kReadPayload:
      case kReadLent:
      case kReadInto:
      case kDiscard: {
        ReadRequest req;
        req.kind = kind;
        if (kind == kReadInto) {
          const int n = 1 + in_.U8() % 4;
          for (int i = 0; i < n; ++i) {
            const uint8_t how = in_.U8();
            req.parts.push_back(how < 64 ? in_.U8() : in_.U16() % (2 * capacity_ + 1));
            req.null_parts.push_back((how & 3) == 3);
          }
        } else if (kind != kReadHeader) {
          req.size = ReadSize();
          req.use_pool = (req.size & 1) != 0;
        }
        if (!channel_ || read_pending_) break;  // one read at a time on a channel
        read_pending_ = true;
        asio::co_spawn(io_, DoRead(std::move(req)), [](std::exception_ptr e) {
          FUZZ_CHECK(!e, "a read threw");
        });
        break;
      }
      case kSetRecall:
        SetRecall();
        break;
      case kRelease: {
        const uint8_t i = in_.U8();
        if (!lent_.empty()) lent_.erase(lent_.begin() + i % lent_.size());
        break;
      }
      case kSend: {
        const uint64_t n = 1 + in_.U16() % (2 * capacity_);
        const uint8_t seed = in_.U8();
        if (!channel_ || sent_.size() + n > kMaxSent) break;
        auto frame = std::make_shared<std::vector<uint8_t>>(n);
        fuzz::Rng rng(seed);
        for (uint8_t& b : *frame) b = static_cast<uint8_t>(rng.Next());
        std::vector<asio::const_buffer> parts;
        for (uint64_t at = 0; at < n;) {  // 1..3 parts
          const uint64_t k = (seed & 3) == 0 ? n - at : std::min<uint64_t>(n - at, 1 + rng.Below(n));
          parts.push_back(asio::buffer(frame->data() + at, k));
          at += k;
        }
        if (!close_after_flush_) sent_.insert(sent_.end(), frame->begin(), frame->end());
        channel_->Send(std::move(parts), frame);
        break;
      }
      case kSettle:
        Settle();
        break;
      case kAbort:
        if (!channel_) break;
        aborted_ = true;
        channel_->Abort();
        break;
      case kCloseAfterFlush: {
        const bool both = (in_.U8() & 1) != 0;
        if (!channel_) break;
        close_after_flush_ = true;
        if (both) ended_ = true;  // the liveness watch ends: the reader takes it as the peer gone
        channel_->CloseAfterFlush(both);
        break;
      }
      case kDestroy:
        if (!channel_ || read_pending_ || (in_.U8() & 3) != 0) break;
        DestroyChannel();
        break;
      default:
        break;
    }
  }

  void DestroyChannel() {
    scripted_ = nullptr;
    channel_.reset();  // lent payloads outlive it
    Settle();
  }

  asio::awaitable<void> DoRead(ReadRequest req) {
    transport::RingChannel* ch = channel_.get();
    const uint64_t pos = rpos_;
    last_read_failed_ = false;
    switch (req.kind) {
      case kReadHeader: {
        Result<FrameHeader> r = co_await ch->ReadHeader();
        OnHeader(pos, r);
        break;
      }
      case kReadPayload:
      case kReadLent: {
        BufferPool* pool = req.use_pool ? pool_.get() : nullptr;
        Result<ByteBuffer> r = req.kind == kReadLent ? co_await ch->ReadPayloadLent(req.size, pool)
                                                     : co_await ch->ReadPayload(req.size, pool);
        if (!r.ok()) {
          OnFailure(r.status(), false);
          break;
        }
        ByteBuffer& b = r.value();
        FUZZ_CHECK(b.size() == req.size, "payload of %zu bytes, %llu asked", b.size(),
                   static_cast<unsigned long long>(req.size));
        if (b.on_loan()) {
          FUZZ_CHECK(req.kind == kReadLent && req.size > 0, "lent without being asked to, or an empty payload");
          FUZZ_CHECK(b.data() >= rx_data_ && b.data() + b.size() <= rx_data_ + capacity_,
                     "a lent payload outside the ring's memory");
        }
        CheckBytes(pos, b.data(), req.size);
        rpos_ = pos + req.size;
        if (req.kind == kReadLent) lent_.push_back(Lent{pos, std::move(b)});
        break;
      }
      case kReadInto: {
        std::vector<std::vector<std::byte>> store(req.parts.size());
        std::vector<asio::mutable_buffer> targets;
        for (size_t i = 0; i < req.parts.size(); ++i) {
          if (req.null_parts[i]) {
            targets.emplace_back(nullptr, req.parts[i]);
          } else {
            store[i].resize(req.parts[i]);
            targets.emplace_back(store[i].data(), store[i].size());
          }
        }
        Status st = co_await ch->ReadInto(targets);
        if (!st.ok()) {
          OnFailure(st, false);
          break;
        }
        uint64_t at = pos;
        for (size_t i = 0; i < req.parts.size(); ++i) {
          if (!req.null_parts[i]) CheckBytes(at, store[i].data(), store[i].size());
          at += req.parts[i];
        }
        rpos_ = at;
        break;
      }
      case kDiscard: {
        Status st = co_await ch->Discard(req.size);
        if (!st.ok()) {
          OnFailure(st, false);
          break;
        }
        CheckBytes(pos, nullptr, req.size);
        rpos_ = pos + req.size;
        break;
      }
      default:
        break;
    }
    read_pending_ = false;
  }

  // Bytes a read returned at stream position `pos` (`data` null: only how far it read).
  void CheckBytes(uint64_t pos, const std::byte* data, uint64_t n) {
    if (!sync_ || hostile_) return;
    FUZZ_CHECK(pos + n <= shadow_.size(), "read up to %llu, the peer published only %zu bytes",
               static_cast<unsigned long long>(pos + n), shadow_.size());
    if (data == nullptr) return;
    for (uint64_t i = 0; i < n; ++i) {
      const int16_t want = shadow_[pos + i];
      FUZZ_CHECK(want < 0 || std::to_integer<uint8_t>(data[i]) == static_cast<uint8_t>(want),
                 "byte %llu of the stream read as 0x%02x, the peer published 0x%02x",
                 static_cast<unsigned long long>(pos + i), std::to_integer<unsigned>(data[i]),
                 static_cast<unsigned>(want));
    }
  }

  void OnHeader(uint64_t pos, const Result<FrameHeader>& r) {
    if (!r.ok() && IsTransportFailure(r.status())) {
      OnFailure(r.status(), true);
      return;
    }
    // 40 bytes were read, and then decoded (or refused).
    if (Trace() && !r.ok()) std::fprintf(stderr, "header refused: %s\n", r.status().ToString().c_str());
    if (sync_ && !hostile_) {
      FUZZ_CHECK(pos + kFrameHeaderSize <= shadow_.size(), "header read up to %llu, the peer published %zu bytes",
                 static_cast<unsigned long long>(pos + kFrameHeaderSize), shadow_.size());
      std::array<std::byte, kFrameHeaderSize> bytes;
      bool known = true;
      for (size_t i = 0; i < kFrameHeaderSize; ++i) {
        const int16_t v = shadow_[pos + i];
        known = known && v >= 0;
        bytes[i] = std::byte{static_cast<uint8_t>(v)};
      }
      if (known) {
        const Result<FrameHeader> want = DecodeFrameHeader(bytes);
        FUZZ_CHECK(want.ok() == r.ok(), "ReadHeader %s, the published bytes decode %s", r.ok() ? "ok" : "failed",
                   want.ok() ? "ok" : "failed");
        if (r.ok()) {
          FUZZ_CHECK(SameHeader(r.value(), want.value()), "ReadHeader returned another header than the published one");
        } else {
          FUZZ_CHECK(r.status().code() == want.status().code() && r.status().message() == want.status().message(),
                     "ReadHeader: %s; the published bytes: %s", r.status().ToString().c_str(),
                     want.status().ToString().c_str());
        }
      }
    }
    rpos_ = pos + kFrameHeaderSize;
    if (r.ok()) {
      reader_plen_ = std::min<uint64_t>(r->payload_length, 4 * capacity_);
    }
  }

  // A read failed: what the peer (or the reader) did must explain it. The reader no longer knows where it is.
  void OnFailure(const Status& st, bool header) {
    FUZZ_CHECK(!st.ok(), "failure without a status");
    last_read_failed_ = true;
    if (Trace()) std::fprintf(stderr, "read failed: %s\n", st.ToString().c_str());
    sync_ = false;
    FUZZ_CHECK(IsTransportFailure(st) || header, "a payload read failed with a status not of the channel: %s",
               st.ToString().c_str());
    if (!IsTransportFailure(st)) return;
    switch (st.code()) {
      case StatusCode::kAborted:
        FUZZ_CHECK(aborted_, "ABORTED without Abort(): %s", st.ToString().c_str());
        break;
      case StatusCode::kUnavailable:
        FUZZ_CHECK(ended_, "UNAVAILABLE though the peer never closed: %s", st.ToString().c_str());
        break;
      case StatusCode::kProtocolViolation:
        FUZZ_CHECK(hostile_, "PROTOCOL_VIOLATION though the peer followed the protocol: %s", st.ToString().c_str());
        break;
      default:
        FUZZ_CHECK(false, "unexpected failure: %s", st.ToString().c_str());
    }
  }

  void Finish() {
    hooks_enabled_ = false;
    Settle();
    // A head out of order that the reader has not looked at yet: the next read must refuse it.
    const uint64_t head = Head(), tail = Tail();
    if (channel_ && !read_pending_ && (head < tail || head - tail > capacity_)) {
      FUZZ_CHECK(hostile_, "the model let an invalid head through");
      sync_ = false;
      ReaderAct(kReadHeader);
      Settle();
      FUZZ_CHECK(!read_pending_ && last_read_failed_, "a read with head %llu, tail %llu, capacity %llu did not fail",
                 static_cast<unsigned long long>(head), static_cast<unsigned long long>(tail),
                 static_cast<unsigned long long>(capacity_));
    }
    // Whatever still waits for the peer ends once the channel is aborted.
    if (channel_ && read_pending_) {
      aborted_ = true;
      channel_->Abort();
      Settle();
      FUZZ_CHECK(!read_pending_, "a read still waits after Abort()");
    }
    if (channel_) DestroyChannel();
    // Lent payloads stay readable after their channel is gone (ASan: the memory must still be there).
    unsigned sum = 0;
    for (const Lent& l : lent_) {
      for (size_t i = 0; i < l.buffer.size(); ++i) sum += std::to_integer<unsigned>(l.buffer.data()[i]);
    }
    volatile unsigned sink = sum;
    (void)sink;
    lent_.clear();
  }

  fuzz::ByteReader in_;
  fuzz::ByteReader hook_in_;
  bool shm_mode_ = false;
  uint64_t capacity_ = 4096;
  bool recall_copies_ = false;

  // Declared first so that they go last: lent payloads and pooled buffers outlive the channel and the loop.
  std::shared_ptr<BufferPool> pool_;
  std::shared_ptr<ScriptedMemory> memory_;
  std::shared_ptr<shm::Segment> segment_;
  std::vector<Lent> lent_;

  asio::io_context io_;
  std::array<UniqueFd, 4> peer_events_;
  UniqueFd liveness_peer_;
  std::unique_ptr<transport::RingChannel> channel_;
  ScriptedChannel* scripted_ = nullptr;

  // The receive ring as the peer sees it.
  RingControl* rx_ = nullptr;
  std::byte* rx_data_ = nullptr;
  // The send ring.
  RingControl* tx_control_ = nullptr;  // shm only
  std::byte* tx_data_ = nullptr;

  // The peer's model of its stream: shadow_[p] is the byte it published validly at position p (-1: overwritten
  // since, while the reader might not have read it yet); shadow_.size() is its valid head.
  std::vector<int16_t> shadow_;
  uint64_t wpos_ = 0;      // where the peer writes next
  bool hostile_ = false;   // the peer broke §10.2 (a position out of order, data on TCP): reads may fail
  bool ended_ = false;     // the peer closed (flag, socket) or the channel's liveness watch ended
  bool aborted_ = false;
  bool hooks_enabled_ = true;
  int hook_actions_ = 0;

  // The reader.
  bool read_pending_ = false;
  bool sync_ = true;       // no read failed: rpos_ is where the channel has read to
  uint64_t rpos_ = 0;
  uint64_t reader_plen_ = 0;
  bool recall_set_ = false;
  int recalls_ = 0;
  bool last_read_failed_ = false;  // the last read that completed failed (decode failures included)
  int write_errors_ = 0;
  int idles_ = 0;
  bool close_after_flush_ = false;

  // The send ring, as the peer reads it.
  std::vector<uint8_t> sent_;
  uint64_t tx_tail_ = 0;
  uint64_t tx_published_tail_ = 0;
  bool tx_hostile_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness harness(data, size);
  harness.Run();
  return 0;
}
