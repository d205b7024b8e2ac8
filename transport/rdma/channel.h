// The verbs backend of RingChannel (docs/PROTOCOL.md §10.4): a reliable-connected queue pair per connection. Each end
// registers a receive ring the peer may write and a staging ring of the same size; frames are copied into the
// staging ring at the offset they will have in the peer's ring and moved there with RDMA_WRITE_WITH_IMM, whose
// immediate (the byte count) the peer's receive completion turns into its new head. The consumer returns credits —
// its tail — by RDMA_WRITE_WITH_IMM of 8 bytes into the producer's credit word. Completions arrive on one CQ whose
// event channel wakes the Asio loop. Everything above the verbs is RingChannel's, shared with shared memory.
//
// Not verified on RDMA hardware in this project (the development machine has none); see README.
#pragma once

#include <infiniband/verbs.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "proto/control.pb.h"
#include "transport/rdma/device.h"
#include "transport/rdma/write_schedule.h"
#include "transport/ring/ring_channel.h"

namespace sparsereduce::rdma {

// Immediate data of a write (32 bits): a data write's byte count (< 2^30), or one of these flags.
inline constexpr uint32_t kImmCredit = 1u << 31;       // 8 bytes (the consumer's tail) were written to the credit word
inline constexpr uint32_t kImmEndOfStream = 1u << 30;  // nothing follows
inline constexpr uint64_t kMaxRingCapacity = 1ull << 30;

// Whether the endpoint a peer announced can be connected to from this side, whose rings hold `ring_capacity` bytes
// and which addresses by GID (RoCE) or else by LID (InfiniBand). A ProtocolError naming what is wrong if not.
Status CheckPeerEndpoint(const proto::RdmaEndpoint& remote, uint64_t ring_capacity, bool roce);

// The verbs resources of one connection, from creation to a connected queue pair. Becomes an RdmaChannel.
class RdmaConnection {
 public:
  static Result<std::unique_ptr<RdmaConnection>> Create(std::shared_ptr<RdmaDevice> device, uint64_t ring_capacity);
  RdmaConnection(const RdmaConnection&) = delete;
  RdmaConnection& operator=(const RdmaConnection&) = delete;
  ~RdmaConnection();

  proto::RdmaEndpoint LocalEndpoint() const;
  // Moves the queue pair to ready-to-send towards `remote` (receives are already posted).
  Status Connect(const proto::RdmaEndpoint& remote);

  // After Connect: the channel, taking the TCP connection as its liveness signal.
  static std::unique_ptr<transport::Channel> MakeChannel(std::unique_ptr<RdmaConnection> connection,
                                                         boost::asio::ip::tcp::socket liveness,
                                                         boost::asio::any_io_executor executor);

 private:
  friend class RdmaChannel;
  explicit RdmaConnection(std::shared_ptr<RdmaDevice> device) : device_(std::move(device)) {}
  Status PostReceive();

  std::shared_ptr<RdmaDevice> device_;
  uint64_t capacity_ = 0;
  uint32_t psn_ = 0;
  ibv_pd* pd_ = nullptr;
  std::vector<std::byte> receive_ring_, send_ring_;
  alignas(8) uint64_t credit_word_ = 0;   // the peer writes its tail here
  alignas(8) uint64_t credit_staging_ = 0;  // this side's tail, the source of credit writes
  ibv_mr* receive_mr_ = nullptr;
  ibv_mr* send_mr_ = nullptr;
  ibv_mr* credit_mr_ = nullptr;
  ibv_mr* credit_staging_mr_ = nullptr;
  ibv_comp_channel* events_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint64_t remote_ring_ = 0, remote_credit_ = 0;
  uint32_t remote_ring_rkey_ = 0, remote_credit_rkey_ = 0;
};

class RdmaChannel final : public transport::RingChannel {
 public:
  RdmaChannel(std::unique_ptr<RdmaConnection> connection, boost::asio::ip::tcp::socket liveness,
              boost::asio::any_io_executor executor);
  ~RdmaChannel() override;

  const char* kind() const override { return "rdma"; }

 private:
  const std::byte* ReceiveMemory() override { return connection_->receive_ring_.data(); }
  Received LoadReceived() override;
  void Consumed(uint64_t tail) override;
  boost::asio::awaitable<void> WaitForData(uint64_t tail) override;
  std::byte* SendMemory() override { return connection_->send_ring_.data(); }
  uint64_t LoadPeerTail() override;
  void Publish(uint64_t from, uint64_t to) override;
  void WaitForSpace(uint64_t head, std::function<void()> wake) override;
  void CloseSend(uint64_t head) override;
  void WhenDelivered(std::function<void()> then) override;
  void CancelWaits() override;

  // Polls the CQ: receive completions advance the head or the peer's tail, send completions free the send queue
  // (and post what waited for it).
  void Drain();
  // Asks for the next completion event and waits for it on the event channel's descriptor. One event per ask.
  void Arm();
  void OnEvent();
  // Arms, then polls once more for completions that came before the ask: for whoever waits for a completion.
  void WatchCompletions();
  // Posts what the schedule lets go now.
  void PostDue();
  // The same, and watches completions while something is left for lack of room (after Publish, Consumed, CloseSend).
  void PostDueOrWatch();
  bool PostWrite(const WriteSchedule::Write& write);

  std::unique_ptr<RdmaConnection> connection_;
  boost::asio::posix::stream_descriptor events_;
  boost::asio::steady_timer data_signal_;  // a waiting reader sleeps on it; Drain cancels it
  std::function<void()> space_waiter_;
  std::function<void()> delivered_waiter_;  // WhenDelivered
  bool armed_ = false;
  uint64_t received_head_ = 0;
  bool peer_closed_ = false;
  uint64_t peer_tail_ = 0;
  uint64_t credited_ = 0;  // the tail last sent as credit
  WriteSchedule schedule_;
};

}  // namespace sparsereduce::rdma
