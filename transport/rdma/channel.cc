#include "transport/rdma/channel.h"

#include <endian.h>
#include <fcntl.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <cstring>
#include <random>

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
  std::unique_ptr<RdmaConnection> c(new RdmaConnection(std::move(device)));
  c->capacity_ = ring_capacity;
  c->psn_ = std::random_device()() & 0xFFFFFF;
  c->receive_ring_.resize(ring_capacity);
  c->send_ring_.resize(ring_capacity);
  ibv_pd* pd = c->device_->pd();
  // ints, not the enum: ibv_reg_mr is a macro that ORs its argument with another enum type (clang warns).
  const int local = IBV_ACCESS_LOCAL_WRITE;
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  c->receive_mr_ = ibv_reg_mr(pd, c->receive_ring_.data(), ring_capacity, remote);
  c->send_mr_ = ibv_reg_mr(pd, c->send_ring_.data(), ring_capacity, local);
  c->credit_mr_ = ibv_reg_mr(pd, &c->credit_word_, sizeof c->credit_word_, remote);
  c->credit_staging_mr_ = ibv_reg_mr(pd, &c->credit_staging_, sizeof c->credit_staging_, local);
  if (!c->receive_mr_ || !c->send_mr_ || !c->credit_mr_ || !c->credit_staging_mr_) {
    return VerbsError("ibv_reg_mr of " + std::to_string(2 * ring_capacity) + " bytes on " + c->device_->name() +
                          " (memlock limit?)",
                      errno);
  }
  c->events_ = ibv_create_comp_channel(c->device_->context());
  if (c->events_ == nullptr) return VerbsError("ibv_create_comp_channel", errno);
  // Several waiters share the event descriptor; each reads the event without blocking.
  fcntl(c->events_->fd, F_SETFL, fcntl(c->events_->fd, F_GETFL) | O_NONBLOCK);
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
  c->qp_ = ibv_create_qp(pd, &init);
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

Status RdmaConnection::Connect(const proto::RdmaEndpoint& remote) {
  if (remote.ring_capacity() != capacity_) {
    return ProtocolError("the peer's RDMA ring holds " + std::to_string(remote.ring_capacity()) + " bytes, this one " +
                         std::to_string(capacity_));
  }
  const bool roce = device_->options().gid_index >= 0;
  if (roce && remote.gid().size() != 16) return ProtocolError("the peer sent no 16-byte GID for RoCE");
  if (remote.mtu() < IBV_MTU_256 || remote.mtu() > IBV_MTU_4096) return ProtocolError("the peer sent a bad MTU");
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
      data_signal_(executor) {
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

bool RdmaChannel::PostWrite(uint64_t local, uint64_t remote, uint32_t length, uint32_t lkey, uint32_t remote_rkey,
                            uint32_t imm) {
  if (outstanding_sends_ >= kSendQueue) Drain();  // completions free the queue; they come at wire speed
  if (outstanding_sends_ >= kSendQueue) {
    Fail(Status(StatusCode::kUnavailable, "RDMA send queue full: the peer does not complete writes"));
    return false;
  }
  ibv_sge sge{local, length, lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(imm);
  wr.sg_list = length > 0 ? &sge : nullptr;
  wr.num_sge = length > 0 ? 1 : 0;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = remote_rkey;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(connection_->qp_, &wr, &bad)) {
    Fail(VerbsError("ibv_post_send", e));
    return false;
  }
  ++outstanding_sends_;
  return true;
}

void RdmaChannel::Drain() {
  const uint64_t tail_before = peer_tail_;
  ibv_wc wc[32];
  while (true) {
    const int n = ibv_poll_cq(connection_->cq_, 32, wc);
    if (n < 0) return Fail(Status(StatusCode::kUnavailable, "ibv_poll_cq failed"));
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return Fail(Status(StatusCode::kUnavailable, std::string("RDMA completion error: ") +
                                                         ibv_wc_status_str(wc[i].status)));
      }
      if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
        --outstanding_sends_;
        continue;
      }
      const uint32_t imm = be32toh(wc[i].imm_data);
      if (imm & kImmCredit) {
        peer_tail_ = __atomic_load_n(&connection_->credit_word_, __ATOMIC_ACQUIRE);
      } else if (imm & kImmEndOfStream) {
        peer_closed_ = true;
      } else {
        received_head_ += imm;
      }
      if (Status st = connection_->PostReceive(); !st.ok()) return Fail(st);
    }
    if (n < 32) break;
  }
  data_signal_.cancel();
  if (space_waiter_ && peer_tail_ != tail_before) asio::post(executor(), std::exchange(space_waiter_, nullptr));
}

void RdmaChannel::Arm() {
  if (armed_) return;
  armed_ = true;
  ibv_req_notify_cq(connection_->cq_, 0);
  events_.async_wait(asio::posix::stream_descriptor::wait_read,
                     asio::bind_executor(executor(), [this, alive = alive()](const boost::system::error_code& ec) {
                       if (!*alive) return;
                       armed_ = false;
                       if (!ec) OnEvent();
                     }));
}

void RdmaChannel::OnEvent() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(connection_->events_, &cq, &context) == 0) ibv_ack_cq_events(cq, 1);
  Drain();
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
  PostWrite(reinterpret_cast<uint64_t>(&connection_->credit_staging_), connection_->remote_credit_, sizeof(uint64_t),
            connection_->credit_staging_mr_->lkey, connection_->remote_credit_rkey_, kImmCredit);
}

asio::awaitable<void> RdmaChannel::WaitForData(uint64_t tail) {
  Arm();
  Drain();  // a completion that arrived before the notification was requested
  if (received_head_ != tail || peer_closed_) co_return;
  data_signal_.expires_at(asio::steady_timer::time_point::max());
  co_await data_signal_.async_wait(asio::as_tuple(asio::use_awaitable));
}

void RdmaChannel::Publish(uint64_t from, uint64_t to) {
  const transport::RingSpans spans = ring().Locate(from, to - from);
  for (int i = 0; i < spans.count; ++i) {
    const transport::RingSpan& s = spans.span[i];
    if (!PostWrite(reinterpret_cast<uint64_t>(connection_->send_ring_.data()) + s.offset,
                   connection_->remote_ring_ + s.offset, static_cast<uint32_t>(s.length),
                   connection_->send_mr_->lkey, connection_->remote_ring_rkey_, static_cast<uint32_t>(s.length))) {
      return;
    }
  }
}

void RdmaChannel::WaitForSpace(uint64_t head, std::function<void()> wake) {
  Arm();
  Drain();
  if (ring().Free(head, peer_tail_) > 0) {
    asio::post(executor(), std::move(wake));
    return;
  }
  space_waiter_ = std::move(wake);
}

void RdmaChannel::CloseSend(uint64_t) {
  PostWrite(0, connection_->remote_ring_, 0, 0, connection_->remote_ring_rkey_, kImmEndOfStream);
}

void RdmaChannel::CancelWaits() {
  data_signal_.cancel();
  if (space_waiter_) asio::post(executor(), std::exchange(space_waiter_, nullptr));
}

}  // namespace sparsereduce::rdma
