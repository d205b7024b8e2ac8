#include "transport/rdma/channel.h"

#include <endian.h>
#include <fcntl.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <optional>
#include <random>
#include <string>

#include "transport/descriptor.h"

namespace sparsereduce::rdma {

namespace asio = boost::asio;

namespace {

constexpr uint32_t kSendQueue = 1024;
constexpr uint32_t kReceiveQueue = 1024;

Status VerbsError(const std::string& what, int error) {
  return Status(StatusCode::kUnavailable, what + ": " + std::strerror(error));
}

}  // namespace

// --- RdmaConnection --------------------------------------------------------------------------------------------

Result<std::unique_ptr<RdmaConnection>> RdmaConnection::Create(std::shared_ptr<RdmaDevice> device,
                                                               uint64_t ring_capacity) {
  if (Status st = transport::ByteRing::CheckCapacity(ring_capacity); !st.ok()) return st;
  if (ring_capacity > kMaxRingCapacity) return InvalidArgument("RDMA rings hold at most 1 GiB");
  // Registered per connection: both rings and the two credit words.
  const uint64_t pinned = 2 * ring_capacity + 2 * sizeof(uint64_t);
  if (Status st = CheckMemlock(ReadMemlockState(), pinned); !st.ok()) return st;
  const ibv_device_attr& limits = device->device_attr();
  if (static_cast<uint64_t>(limits.max_qp_wr) < std::max(kSendQueue, kReceiveQueue) ||
      static_cast<uint64_t>(limits.max_cqe) < kSendQueue + kReceiveQueue) {
    return Status(StatusCode::kUnavailable,
                  "RDMA device " + device->name() + " allows " + std::to_string(limits.max_qp_wr) +
                      " work requests per queue and " + std::to_string(limits.max_cqe) +
                      " completions per queue; a connection needs " + std::to_string(kSendQueue) + " and " +
                      std::to_string(kSendQueue + kReceiveQueue));
  }
  std::unique_ptr<RdmaConnection> c(new RdmaConnection(std::move(device)));
  c->capacity_ = ring_capacity;
  c->psn_ = std::random_device()() & 0xFFFFFF;
  c->receive_ring_.resize(ring_capacity);
  c->send_ring_.resize(ring_capacity);
  // A protection domain per connection: the rings and credit words a peer may write are reachable only through
  // this connection's queue pair, so a peer of one job cannot write another job's memory with a guessed rkey.
  c->pd_ = ibv_alloc_pd(c->device_->context());
  if (c->pd_ == nullptr) return VerbsError("ibv_alloc_pd on " + c->device_->name(), errno);
  // ints, not the enum: ibv_reg_mr is a macro that ORs its argument with another enum type (clang warns).
  const int local = IBV_ACCESS_LOCAL_WRITE;
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const struct {
    ibv_mr** mr;
    void* address;
    uint64_t length;
    int access;
    const char* what;
  } regions[] = {
      {&c->receive_mr_, c->receive_ring_.data(), ring_capacity, remote, "the receive ring"},
      {&c->send_mr_, c->send_ring_.data(), ring_capacity, local, "the staging ring"},
      {&c->credit_mr_, &c->credit_word_, sizeof c->credit_word_, remote, "the credit word"},
      {&c->credit_staging_mr_, &c->credit_staging_, sizeof c->credit_staging_, local, "the credit staging word"},
  };
  for (const auto& region : regions) {
    *region.mr = ibv_reg_mr(c->pd_, region.address, region.length, region.access);
    if (*region.mr == nullptr) {
      const int e = errno;
      return VerbsError("ibv_reg_mr of " + std::string(region.what) + " (" + std::to_string(region.length) +
                            " bytes) on " + c->device_->name() + (e == ENOMEM ? " (memlock limit?)" : ""),
                        e);
    }
  }
  c->events_ = ibv_create_comp_channel(c->device_->context());
  if (c->events_ == nullptr) return VerbsError("ibv_create_comp_channel", errno);
  // Several waiters share the event descriptor; each reads the event without blocking.
  const int flags = fcntl(c->events_->fd, F_GETFL);
  if (flags < 0 || fcntl(c->events_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return VerbsError("making the RDMA completion channel non-blocking", errno);
  }
  c->cq_ = ibv_create_cq(c->device_->context(), kSendQueue + kReceiveQueue, nullptr, c->events_, 0);
  if (c->cq_ == nullptr) return VerbsError("ibv_create_cq", errno);
  ibv_qp_init_attr init{};
  init.send_cq = c->cq_;
  init.recv_cq = c->cq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = kSendQueue;
  init.cap.max_recv_wr = kReceiveQueue;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  c->qp_ = ibv_create_qp(c->pd_, &init);
  if (c->qp_ == nullptr) return VerbsError("ibv_create_qp", errno);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = c->device_->options().port;
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (int e = ibv_modify_qp(c->qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return VerbsError("queue pair to INIT", e);
  }
  // Receives are posted before the peer learns the queue pair, so its first write always finds one.
  for (uint32_t i = 0; i < kReceiveQueue; ++i) {
    if (Status st = c->PostReceive(); !st.ok()) return st;
  }
  return c;
}

RdmaConnection::~RdmaConnection() {
  if (qp_) ibv_destroy_qp(qp_);
  if (cq_) ibv_destroy_cq(cq_);
  if (events_) ibv_destroy_comp_channel(events_);
  for (ibv_mr* mr : {receive_mr_, send_mr_, credit_mr_, credit_staging_mr_}) {
    if (mr) ibv_dereg_mr(mr);
  }
  if (pd_) ibv_dealloc_pd(pd_);
}

Status RdmaConnection::PostReceive() {
  ibv_recv_wr wr{};  // no scatter list: writes with immediate land in the registered ring, only the immediate here
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(qp_, &wr, &bad)) return VerbsError("ibv_post_recv", e);
  return Status::Ok();
}

proto::RdmaEndpoint RdmaConnection::LocalEndpoint() const {
  proto::RdmaEndpoint e;
  e.set_qpn(qp_->qp_num);
  e.set_psn(psn_);
  e.set_lid(device_->port_attr().lid);
  if (device_->options().gid_index >= 0) e.set_gid(device_->gid().raw, sizeof device_->gid().raw);
  e.set_mtu(device_->port_attr().active_mtu);
  e.set_ring_address(reinterpret_cast<uint64_t>(receive_ring_.data()));
  e.set_ring_rkey(receive_mr_->rkey);
  e.set_ring_capacity(capacity_);
  e.set_credit_address(reinterpret_cast<uint64_t>(&credit_word_));
  e.set_credit_rkey(credit_mr_->rkey);
  return e;
}

Status CheckPeerEndpoint(const proto::RdmaEndpoint& remote, uint64_t ring_capacity, bool roce) {
  if (remote.ring_capacity() != ring_capacity) {
    return ProtocolError("the peer's RDMA ring holds " + std::to_string(remote.ring_capacity()) + " bytes, this one " +
                         std::to_string(ring_capacity));
  }
  if (roce && remote.gid().size() != 16) return ProtocolError("the peer sent no 16-byte GID for RoCE");
  if (roce && remote.gid().find_first_not_of('\0') == std::string::npos) {
    return ProtocolError("the peer sent an all-zero GID (its GID index names an unused entry)");
  }
  if (!roce && remote.lid() == 0) {
    return ProtocolError("the peer sent LID 0: its port has no LID yet (is the subnet manager running?), or it is "
                         "RoCE and needs a GID index");
  }
  if (remote.mtu() < IBV_MTU_256 || remote.mtu() > IBV_MTU_4096) return ProtocolError("the peer sent a bad MTU");
  // Queue pair numbers and PSNs are 24 bits, LIDs 16: a wider value is not the peer's, whatever it means.
  if (remote.qpn() > 0xFFFFFF || remote.psn() > 0xFFFFFF || remote.lid() > 0xFFFF) {
    return ProtocolError("the peer sent a queue pair number, PSN or LID out of range (" + std::to_string(remote.qpn()) +
                         ", " + std::to_string(remote.psn()) + ", " + std::to_string(remote.lid()) + ")");
  }
  return Status::Ok();
}

Status RdmaConnection::Connect(const proto::RdmaEndpoint& remote) {
  const bool roce = device_->options().gid_index >= 0;
  if (Status st = CheckPeerEndpoint(remote, capacity_, roce); !st.ok()) return st;
  remote_ring_ = remote.ring_address();
  remote_ring_rkey_ = remote.ring_rkey();
  remote_credit_ = remote.credit_address();
  remote_credit_rkey_ = remote.credit_rkey();

  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = std::min(device_->port_attr().active_mtu, static_cast<ibv_mtu>(remote.mtu()));
  rtr.dest_qp_num = remote.qpn();
  rtr.rq_psn = remote.psn() & 0xFFFFFF;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = device_->options().port;
  rtr.ah_attr.dlid = static_cast<uint16_t>(remote.lid());
  if (roce) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, remote.gid().data(), 16);
    rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->options().gid_index);
    rtr.ah_attr.grh.hop_limit = 64;
  }
  if (int e = ibv_modify_qp(qp_, &rtr,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return VerbsError("queue pair to RTR", e);
  }
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;   // 4.096 us * 2^14 = 67 ms per try, as OmniReduce
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;  // retry receiver-not-ready forever: the peer reposts receives as it consumes
  rts.sq_psn = psn_;
  rts.max_rd_atomic = 1;
  if (int e = ibv_modify_qp(qp_, &rts,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC)) {
    return VerbsError("queue pair to RTS", e);
  }
  return Status::Ok();
}

std::unique_ptr<transport::Channel> RdmaConnection::MakeChannel(std::unique_ptr<RdmaConnection> connection,
                                                                asio::ip::tcp::socket liveness,
                                                                asio::any_io_executor executor) {
  return std::make_unique<RdmaChannel>(std::move(connection), std::move(liveness), std::move(executor));
}

// --- RdmaChannel -----------------------------------------------------------------------------------------------

RdmaChannel::RdmaChannel(std::unique_ptr<RdmaConnection> connection, asio::ip::tcp::socket liveness,
                         asio::any_io_executor executor)
    : RingChannel(connection->capacity_, std::move(liveness), executor),
      connection_(std::move(connection)),
      events_(executor),
      data_signal_(executor),
      schedule_(connection_->capacity_, kSendQueue) {
  if (Status st = transport::AssignDuplicate(events_, connection_->events_->fd, "the RDMA completion channel");
      !st.ok()) {
    Fail(st);  // reads fail with it, and the owner reports it naming the connection; Arm's waits end at once
  }
  StartLiveness();
}

RdmaChannel::~RdmaChannel() {
  boost::system::error_code ignored;
  events_.close(ignored);
}

namespace {

// What a work request was, from its wr_id, for error messages.
const char* WorkName(uint64_t wr_id) {
  switch (static_cast<WriteSchedule::Kind>(wr_id)) {
    case WriteSchedule::Kind::kData:
      return "data write";
    case WriteSchedule::Kind::kCredit:
      return "credit write";
    case WriteSchedule::Kind::kEndOfStream:
      return "end-of-stream write";
  }
  return "receive";
}

std::string Hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

}  // namespace

bool RdmaChannel::PostWrite(const WriteSchedule::Write& write) {
  RdmaConnection& c = *connection_;
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.wr_id = static_cast<uint64_t>(write.kind);  // receives are 0
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  switch (write.kind) {
    case WriteSchedule::Kind::kData:
      sge = {reinterpret_cast<uint64_t>(c.send_ring_.data()) + write.offset, write.length, c.send_mr_->lkey};
      wr.imm_data = htobe32(write.length);
      wr.wr.rdma.remote_addr = c.remote_ring_ + write.offset;
      wr.wr.rdma.rkey = c.remote_ring_rkey_;
      break;
    case WriteSchedule::Kind::kCredit:
      // The latest tail at the time the adapter reads it: a credit that waited for room carries the newest one.
      sge = {reinterpret_cast<uint64_t>(&c.credit_staging_), sizeof(uint64_t), c.credit_staging_mr_->lkey};
      wr.imm_data = htobe32(kImmCredit);
      wr.wr.rdma.remote_addr = c.remote_credit_;
      wr.wr.rdma.rkey = c.remote_credit_rkey_;
      break;
    case WriteSchedule::Kind::kEndOfStream:
      wr.imm_data = htobe32(kImmEndOfStream);
      wr.wr.rdma.remote_addr = c.remote_ring_;
      wr.wr.rdma.rkey = c.remote_ring_rkey_;
      break;
  }
  wr.sg_list = sge.length > 0 ? &sge : nullptr;
  wr.num_sge = sge.length > 0 ? 1 : 0;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(c.qp_, &wr, &bad)) {
    Fail(VerbsError(std::string("ibv_post_send of a ") + WorkName(wr.wr_id), e));
    return false;
  }
  return true;
}

void RdmaChannel::PostDue() {
  if (failed()) return;  // nothing more goes to a peer this side gave up on
  while (std::optional<WriteSchedule::Write> write = schedule_.Next()) {
    if (!PostWrite(*write)) return;
  }
}

void RdmaChannel::PostDueOrWatch() {
  PostDue();
  if (schedule_.due()) WatchCompletions();  // what is left goes when completions free the send queue
}

void RdmaChannel::Drain() {
  const uint64_t tail_before = peer_tail_;
  bool sends_completed = false;
  ibv_wc wc[32];
  while (true) {
    const int n = ibv_poll_cq(connection_->cq_, 32, wc);
    if (n < 0) return Fail(Status(StatusCode::kUnavailable, "ibv_poll_cq failed"));
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        // A queue pair in error flushes every outstanding request with WR_FLUSH_ERR, the receives first perhaps:
        // the error that caused it is the batch's first other one.
        const ibv_wc* cause = &wc[i];
        for (int j = i; j < n && cause->status == IBV_WC_WR_FLUSH_ERR; ++j) {
          if (wc[j].status != IBV_WC_SUCCESS && wc[j].status != IBV_WC_WR_FLUSH_ERR) cause = &wc[j];
        }
        return Fail(Status(StatusCode::kUnavailable,
                           std::string("RDMA completion error on a ") + WorkName(cause->wr_id) + ": " +
                               ibv_wc_status_str(cause->status) + " (vendor error " + Hex(cause->vendor_err) +
                               ", queue pair " + std::to_string(connection_->qp_->qp_num) + ")"));
      }
      if ((wc[i].opcode & IBV_WC_RECV) == 0) {  // one of this side's writes
        schedule_.Completed();
        sends_completed = true;
        continue;
      }
      if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM) {  // a SEND: the peer does not speak this protocol
        return Fail(ProtocolError("an RDMA receive of opcode " + std::to_string(wc[i].opcode) +
                                  " (only writes with immediate are expected)"));
      }
      const uint32_t imm = be32toh(wc[i].imm_data);
      if (imm == kImmCredit) {
        peer_tail_ = __atomic_load_n(&connection_->credit_word_, __ATOMIC_ACQUIRE);
      } else if (imm == kImmEndOfStream) {
        peer_closed_ = true;
      } else if ((imm & (kImmCredit | kImmEndOfStream)) != 0) {
        return Fail(ProtocolError("an RDMA write with immediate " + Hex(imm) +
                                  ", which is neither a byte count, a credit nor end of stream"));
      } else if (peer_closed_) {
        return Fail(ProtocolError("an RDMA write of " + std::to_string(imm) + " bytes after end of stream"));
      } else {
        received_head_ += imm;
      }
      if (Status st = connection_->PostReceive(); !st.ok()) return Fail(st);
    }
    if (n < 32) break;
  }
  if (sends_completed) PostDue();
  data_signal_.cancel();
  if (space_waiter_ && peer_tail_ != tail_before) asio::post(executor(), std::exchange(space_waiter_, nullptr));
  if (delivered_waiter_ && schedule_.delivered()) asio::post(executor(), std::exchange(delivered_waiter_, nullptr));
}

void RdmaChannel::Arm() {
  if (armed_) return;
  // Asking before the wait is queued loses no event, also with the loop on several threads: an event another
  // thread's epoll_wait took meanwhile is found again, since Asio starts a wait on a descriptor with EPOLL_CTL_MOD,
  // which re-checks readiness (reactive_descriptor_service::async_wait, epoll_reactor::start_op).
  if (int e = ibv_req_notify_cq(connection_->cq_, 0)) return Fail(VerbsError("ibv_req_notify_cq", e));
  armed_ = true;
  events_.async_wait(asio::posix::stream_descriptor::wait_read,
                     asio::bind_executor(executor(), [this, alive = alive()](const boost::system::error_code& ec) {
                       if (!*alive) return;
                       armed_ = false;
                       if (!ec) OnEvent();
                     }));
}

void RdmaChannel::WatchCompletions() {
  Arm();
  Drain();  // a completion that arrived before the notification was requested
}

void RdmaChannel::OnEvent() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(connection_->events_, &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
  Drain();
  // The event answered one request. A writer waiting for credit, writes waiting for room in the send queue and a
  // close waiting for its writes to land need the next one too (a reader asks again itself, in WaitForData):
  // without it a credit that came after a send completion woke nobody, and the writer waited for good.
  if (!failed() && (space_waiter_ || schedule_.due() || delivered_waiter_)) WatchCompletions();
}

transport::RingChannel::Received RdmaChannel::LoadReceived() {
  Drain();
  return {received_head_, peer_closed_};
}

uint64_t RdmaChannel::LoadPeerTail() {
  Drain();
  return peer_tail_;
}

void RdmaChannel::Consumed(uint64_t tail) {
  // Credits in quarter rings: the producer is never stuck, since a full ring holds four quarters to consume.
  if (tail - credited_ < ring().capacity() / 4) return;
  credited_ = tail;
  connection_->credit_staging_ = tail;
  schedule_.Credit();
  PostDueOrWatch();
}

asio::awaitable<void> RdmaChannel::WaitForData(uint64_t tail) {
  WatchCompletions();
  if (received_head_ != tail || peer_closed_ || failed()) co_return;  // the caller sees the failure
  data_signal_.expires_at(asio::steady_timer::time_point::max());
  co_await data_signal_.async_wait(asio::as_tuple(asio::use_awaitable));
}

void RdmaChannel::Publish(uint64_t, uint64_t to) {
  schedule_.Publish(to);
  PostDueOrWatch();
}

void RdmaChannel::WaitForSpace(uint64_t head, std::function<void()> wake) {
  WatchCompletions();
  if (ring().Free(head, peer_tail_) > 0 || failed()) {
    asio::post(executor(), std::move(wake));
    return;
  }
  space_waiter_ = std::move(wake);
}

void RdmaChannel::CloseSend(uint64_t) {
  schedule_.EndOfStream();
  PostDueOrWatch();
}

void RdmaChannel::WhenDelivered(std::function<void()> then) {
  if (schedule_.delivered() || failed()) return then();
  delivered_waiter_ = std::move(then);
  WatchCompletions();
}

void RdmaChannel::CancelWaits() {
  data_signal_.cancel();
  if (space_waiter_) asio::post(executor(), std::exchange(space_waiter_, nullptr));
  if (delivered_waiter_) asio::post(executor(), std::exchange(delivered_waiter_, nullptr));
}

}  // namespace sparsereduce::rdma
