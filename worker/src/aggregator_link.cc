#include "worker/src/aggregator_link.h"

#include <algorithm>
#include <array>
#include <memory>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "protocol/control.h"
#include "transport/descriptor.h"
#include "transport/shm/handoff.h"
#include "transport/tcp/channel.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/socket_options.h"
#include "worker/src/host_lookup.h"

namespace sparsereduce::worker {

namespace asio = boost::asio;
using asio::ip::tcp;

AggregatorLink::AggregatorLink(asio::io_context& io, uint32_t index, std::string address, Handler& handler,
                               Options options)
    : io_(io),
      index_(index),
      address_(std::move(address)),
      handler_(handler),
      options_(std::move(options)),
      socket_(io),
      retry_timer_(io),
      lookup_wait_(io),
      setup_cancel_(io),
      write_error_grace_(io) {}

void AggregatorLink::UseChannel(std::unique_ptr<transport::Channel> channel) {
  channel_ = std::move(channel);
  channel_->set_error_handler([this](const Status& st) {
    if (closing_) return;
    write_error_grace_.expires_after(std::chrono::milliseconds(500));
    write_error_grace_.async_wait([this, st](const boost::system::error_code& ec) {
      if (!ec && !closing_) handler_.OnFailure(*this, st);
    });
  });
  channel_->set_idle_handler([this] { handler_.OnWriterIdle(*this); });
}

void AggregatorLink::Abort() {
  closing_ = true;
  retry_timer_.cancel();
  setup_cancel_.cancel();
  write_error_grace_.cancel();
  if (channel_) {
    channel_->Abort();
  } else {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }
}

std::string AggregatorLink::Name() const { return "aggregator " + std::to_string(index_) + " (" + address_ + ")"; }

void AggregatorLink::Close() {
  closing_ = true;
  retry_timer_.cancel();   // a link waiting to retry its connection stops now, not after the pause
  lookup_wait_.cancel();   // so does one waiting for its host name to be looked up
  setup_cancel_.cancel();  // a handoff in progress ends now, not at its deadline
  write_error_grace_.cancel();
  if (connected_) {
    channel_->CloseAfterFlush(/*both=*/true);
  } else {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }
}

asio::awaitable<Status> AggregatorLink::Connect(std::chrono::steady_clock::time_point deadline) {
  Result<sparsereduce::tcp::HostPort> hp = sparsereduce::tcp::ParseHostPort(address_);
  if (!hp.ok()) co_return hp.status();
  auto backoff = std::chrono::milliseconds(20);
  std::string last_error;
  while (!closing_) {
    Result<std::vector<tcp::endpoint>> endpoints = co_await LookUpHost(hp->host, hp->port, lookup_wait_, deadline);
    if (closing_) break;
    if (!endpoints.ok()) {
      last_error = "cannot resolve " + hp->host + ": " + endpoints.status().message();
    } else {
      // Bound each attempt by the deadline: a SYN to a silent host would otherwise wait for the kernel's timeout.
      // `cut` outlives this frame: an expiry already queued when the attempt ends finds `ended` and does nothing.
      struct AttemptCut {
        bool ended = false;
        bool fired = false;
      };
      auto cut = std::make_shared<AttemptCut>();
      asio::steady_timer attempt_timer(io_, deadline);
      attempt_timer.async_wait([this, cut](const boost::system::error_code& ec) {
        if (ec || cut->ended) return;
        cut->fired = true;
        boost::system::error_code ignored;
        socket_.close(ignored);
      });
      auto [cec, endpoint] = co_await asio::async_connect(socket_, *endpoints, asio::as_tuple(asio::use_awaitable));
      cut->ended = true;
      attempt_timer.cancel();
      if (!cec) {
        if (Status st = transport::SetCloseOnExec(socket_.native_handle()); !st.ok()) {
          co_return st.WithContext("connection to " + Name());
        }
        boost::system::error_code ignored;
        socket_.set_option(tcp::no_delay(true), ignored);
        if (options_.tcp_send_buffer > 0) {
          boost::system::error_code sec;
          socket_.set_option(asio::socket_base::send_buffer_size(static_cast<int>(options_.tcp_send_buffer)), sec);
          if (sec) {
            co_return Status(StatusCode::kInvalidArgument, "tcp_send_buffer " +
                                                               std::to_string(options_.tcp_send_buffer) +
                                                               ": cannot set SO_SNDBUF: " + sec.message());
          }
        }
        // Keepalive finds an aggregator host that vanished while this worker is idle between collectives.
        (void)sparsereduce::tcp::ApplyLiveness(socket_, {});
        co_return Status::Ok();
      }
      // A cut attempt reports why, not the "Operation canceled" of the socket the deadline closed.
      last_error = cut->fired ? "no answer within the connect timeout (the host drops or does not answer the "
                                "connection request)"
                              : cec.message();
      if (!cut->fired && cec == asio::error::operation_aborted) {
        // Asio's range connect reports a socket it could not open as cancelled: say why it could not.
        tcp::socket probe(io_);
        boost::system::error_code oec;
        probe.open(endpoints->front().protocol(), oec);
        if (oec) last_error = "cannot open a socket: " + oec.message();
      }
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
    if (std::chrono::steady_clock::now() + backoff >= deadline) break;
    if (closing_) break;
    // Close() cancels the pause (it was a local timer: a link closed meanwhile waited up to a second more).
    retry_timer_.expires_after(backoff);
    co_await retry_timer_.async_wait(asio::as_tuple(asio::use_awaitable));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  co_return Status(StatusCode::kUnavailable, "cannot connect: " + last_error);
}

asio::awaitable<Status> AggregatorLink::TakeOffer(const proto::TransportOffer& offer) {
  if (job_ready_ || std::string_view(channel_->kind()) != "tcp" || !channel_->idle()) {
    co_return ProtocolError("TransportOffer after JobReady, after the connection moved, or with TCP writes pending");
  }
  if (offer.kind() == "shm" && (options_.transport == "auto" || options_.transport == "shm")) {
    co_return co_await TakeShmOffer(offer);
  }
  if (offer.kind() == "rdma" && options_.transport == "rdma") co_return co_await TakeRdmaOffer(offer);
  co_return ProtocolError("unexpected TransportOffer of '" + offer.kind() + "' (this worker asked for " +
                          options_.transport + ")");
}

void AggregatorLink::Decline(const std::string& reason) {
  proto::ControlMessage decline;
  decline.mutable_transport_decline()->set_reason(reason);
  Send(EncodeControl(decline));
}

asio::awaitable<Status> AggregatorLink::TakeShmOffer(const proto::TransportOffer& offer) {
  const auto deadline =
      std::min(DeadlineAfter(std::chrono::steady_clock::now(), options_.setup_timeout), join_deadline_);
  if (closing_) co_return Status(StatusCode::kAborted, "the connection was closed");
  // Close() ends the wait below (the handoff's own socket is out of its reach): without this a worker that failed
  // or was cancelled meanwhile waited for the descriptors until the deadline, and so did its I/O thread and the
  // constructor's failure path.
  setup_cancel_.expires_at(std::chrono::steady_clock::time_point::max());
  using namespace asio::experimental::awaitable_operators;
  auto outcome = co_await (shm::AttachShm(io_.get_executor(), offer.shm_socket(), offer.token(), deadline) ||
                           setup_cancel_.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (closing_ || outcome.index() == 1) {
    co_return Status(StatusCode::kAborted, "the connection was closed while it moved to shared memory");
  }
  Result<shm::ShmAttachment> attached = std::move(std::get<0>(outcome));
  if (!attached.ok()) {
    // Unreachable socket: another host (or network namespace). Anything else is a broken handoff.
    if (attached.status().code() == StatusCode::kUnavailable && options_.transport == "auto") {
      Decline(attached.status().message());
      co_return Status::Ok();
    }
    co_return attached.status().WithContext("moving the connection to shared memory");
  }
  auto* tcp_channel = static_cast<sparsereduce::tcp::TcpChannel*>(channel_.get());
  Result<tcp::socket> socket = tcp_channel->ReleaseSocket();
  if (!socket.ok()) co_return socket.status().WithContext("moving the connection to shared memory");
  UseChannel(attached->MakeChannel(std::move(*socket), io_.get_executor()));
  co_return Status::Ok();
}

asio::awaitable<Status> AggregatorLink::TakeRdmaOffer(const proto::TransportOffer& offer) {
#if SPARSEREDUCE_HAVE_RDMA
  Result<std::unique_ptr<rdma::RdmaConnection>> connection =
      rdma::RdmaConnection::Create(rdma_device_, offer.rdma().ring_capacity());
  if (!connection.ok()) co_return connection.status().WithContext("RDMA connection");
  if (Status st = (*connection)->Connect(offer.rdma()); !st.ok()) co_return st.WithContext("RDMA connection");
  // The accept is the last frame on TCP: written here, before the socket becomes the RDMA channel's liveness.
  proto::ControlMessage accept;
  *accept.mutable_transport_accept()->mutable_rdma() = (*connection)->LocalEndpoint();
  const ByteBuffer frame = EncodeControl(accept);
  auto* tcp_channel = static_cast<sparsereduce::tcp::TcpChannel*>(channel_.get());
  Result<tcp::socket> socket = tcp_channel->ReleaseSocket();
  if (!socket.ok()) co_return socket.status().WithContext("RDMA connection");
  auto [ec, written] = co_await asio::async_write(*socket, asio::buffer(frame.data(), frame.size()),
                                                  asio::as_tuple(asio::use_awaitable));
  if (ec) co_return Status(StatusCode::kUnavailable, "sending TransportAccept: " + ec.message());
  Count(written);
  // Closed while the accept was written: Close() has run against the TCP channel, and would not end this one.
  if (closing_) co_return Status(StatusCode::kAborted, "the connection was closed while it moved to RDMA");
  UseChannel(rdma::RdmaConnection::MakeChannel(std::move(*connection), std::move(*socket), io_.get_executor()));
  co_return Status::Ok();
#else
  (void)offer;
  co_return Status(StatusCode::kUnsupported, "this build has no RDMA transport");
#endif
}

asio::awaitable<void> AggregatorLink::Run(proto::Hello hello, std::chrono::steady_clock::time_point deadline,
                                          std::chrono::steady_clock::time_point join_deadline) {
  join_deadline_ = join_deadline;
  if (Status st = co_await Connect(deadline); !st.ok()) {
    if (!closing_) handler_.OnFailure(*this, st);
    co_return;
  }
  connected_ = true;
  UseChannel(std::make_unique<sparsereduce::tcp::TcpChannel>(std::move(socket_), io_.get_executor()));
  proto::ControlMessage message;
  *message.mutable_hello() = std::move(hello);
  Send(EncodeControl(message));

  while (true) {
    Result<FrameHeader> header = co_await channel_->ReadHeader();
    if (!header.ok()) {
      if (!closing_) handler_.OnFailure(*this, header.status());
      co_return;
    }
    uint64_t limit = kMaxControlPayload;
    if (header->type == FrameType::kResult) {
      Result<uint64_t> result_limit = handler_.ResultLimit(*this, *header);
      if (!result_limit.ok()) {
        handler_.OnFailure(*this, result_limit.status());
        co_return;
      }
      limit = *result_limit;
    } else if (header->type != FrameType::kControl) {
      handler_.OnFailure(*this, ProtocolError("aggregators may not send CONTRIBUTION frames"));
      co_return;
    }
    if (header->payload_length > limit) {
      handler_.OnFailure(*this, ProtocolError("frame payload of " + std::to_string(header->payload_length) +
                                              " bytes exceeds the limit of " + std::to_string(limit)));
      co_return;
    }
    if (header->type == FrameType::kResult) {
      if (Status st = co_await ReadResult(*header); !st.ok()) {
        if (!closing_) handler_.OnFailure(*this, st);
        co_return;
      }
      if (closing_) co_return;
      continue;
    }
    Result<ByteBuffer> payload = co_await channel_->ReadPayload(header->payload_length, nullptr);
    if (!payload.ok()) {
      if (!closing_) handler_.OnFailure(*this, payload.status());
      co_return;
    }
    bytes_received_ += kFrameHeaderSize + header->payload_length;
    Result<proto::ControlMessage> control = DecodeControl(payload->span());
    if (!control.ok()) {
      handler_.OnFailure(*this, control.status());
      co_return;
    }
    if (control->body_case() == proto::ControlMessage::kTransportOffer) {
      if (Status st = handler_.TransportOfferAllowed(*this); !st.ok()) {
        handler_.OnFailure(*this, st);
        co_return;
      }
      if (Status st = co_await TakeOffer(control->transport_offer()); !st.ok()) {
        if (!closing_) handler_.OnFailure(*this, st);
        co_return;
      }
      if (closing_) co_return;
      continue;
    }
    if (control->body_case() == proto::ControlMessage::kJobReady) job_ready_ = true;
    handler_.OnControl(*this, *control);
    if (closing_) co_return;
  }
}

asio::awaitable<Status> AggregatorLink::ReadResult(const FrameHeader& header) {
  // DecodeFrameHeader has checked that the table fits the payload.
  const uint64_t table_bytes = uint64_t{header.entry_count} * kEntrySize;
  result_table_.resize(table_bytes);
  const std::array table_target{asio::buffer(result_table_)};
  if (Status st = co_await channel_->ReadInto(table_target); !st.ok()) co_return st;
  bytes_received_ += kFrameHeaderSize + table_bytes;
  const uint64_t data_bytes = header.payload_length - table_bytes;
  result_targets_.clear();
  if (!handler_.BeginResult(*this, header, result_table_, &result_targets_)) {
    bytes_received_ += data_bytes;
    co_return co_await channel_->Discard(data_bytes);
  }
  uint64_t target_bytes = 0;
  for (const asio::mutable_buffer& t : result_targets_) target_bytes += t.size();
  if (target_bytes != data_bytes) {  // a bug on this side; reading on would lose the frame boundaries
    co_return Status(StatusCode::kInternal, "RESULT targets hold " + std::to_string(target_bytes) +
                                                " bytes, the frame " + std::to_string(data_bytes));
  }
  reading_result_data_ = true;
  Status st = co_await channel_->ReadInto(result_targets_);
  reading_result_data_ = false;
  if (!st.ok()) co_return st;
  bytes_received_ += data_bytes;
  handler_.EndResult(*this);
  co_return Status::Ok();
}

}  // namespace sparsereduce::worker
