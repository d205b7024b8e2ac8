#include "aggregator/session.h"

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <boost/asio/use_awaitable.hpp>

#include "aggregator/job.h"
#include "aggregator/job_registry.h"
#include "protocol/control.h"

namespace sparsereduce::aggregator {

namespace asio = boost::asio;

namespace {

std::string PeerName(const tcp::Socket& socket) {
  boost::system::error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  if (ec) return "?";
  const std::string address = endpoint.address().to_string();
  return (endpoint.address().is_v6() ? "[" + address + "]" : address) + ":" + std::to_string(endpoint.port());
}

Status ValidateHello(const proto::Hello& h, const ServerOptions& o) {
  if (h.protocol_version() != kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch, "protocol version " + std::to_string(h.protocol_version()) +
                                                    " is not supported (this aggregator speaks " +
                                                    std::to_string(kProtocolVersion) + ")");
  }
  JobShape shape{h.world_size(), h.num_aggregators(), h.slots(), h.blocks_per_message()};
  if (Status st = ValidateShape(shape); !st.ok()) return st;
  if (h.rank() >= h.world_size()) {
    return InvalidArgument("rank " + std::to_string(h.rank()) + " is out of range for world_size " +
                           std::to_string(h.world_size()));
  }
  if (h.aggregator_index() >= h.num_aggregators()) {
    return InvalidArgument("aggregator_index " + std::to_string(h.aggregator_index()) +
                           " is out of range for num_aggregators " + std::to_string(h.num_aggregators()));
  }
  auto limit = [](const char* what, uint32_t value, uint32_t max) {
    return value <= max ? Status::Ok()
                        : Status(StatusCode::kResourceExhausted, std::string(what) + " " + std::to_string(value) +
                                                                     " exceeds this aggregator's limit of " +
                                                                     std::to_string(max));
  };
  if (Status st = limit("world_size", h.world_size(), o.max_world_size); !st.ok()) return st;
  if (Status st = limit("slots", h.slots(), o.max_slots); !st.ok()) return st;
  return limit("blocks_per_message", h.blocks_per_message(), o.max_blocks_per_message);
}

}  // namespace

Session::Session(tcp::Socket socket, JobRegistry& registry, const ServerOptions& options)
    : socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      registry_(registry),
      options_(options),
      peer_(PeerName(socket_)) {}

void Session::Start() {
  asio::co_spawn(socket_.get_executor(), [self = shared_from_this()] { return self->Handshake(); }, asio::detached);
}

void Session::SendControl(const proto::ControlMessage& message) {
  writer_->Send(EncodeControl(message));
}

void Session::Fail(const Status& error, uint64_t seq, const std::vector<uint32_t>& ranks) {
  if (closed_) return;
  proto::ControlMessage message;
  proto::Error* e = message.mutable_error();
  e->set_code(ToProtoCode(error.code()));
  e->set_message(error.message());
  e->set_seq(seq);
  for (uint32_t r : ranks) e->add_ranks(r);
  writer_->Send(EncodeControl(message));
  Close();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  // Only the sending side: the read loop keeps draining what the worker still sends until it closes, so the
  // close never turns into a reset that could destroy the Error frame before the worker reads it.
  writer_->CloseAfterFlush(/*both=*/false);
  auto timer = std::make_shared<asio::steady_timer>(executor_, std::chrono::seconds(5));
  timer->async_wait([self = shared_from_this(), timer](const boost::system::error_code& ec) {
    if (ec) return;
    boost::system::error_code ignored;
    self->socket_.close(ignored);  // the worker did not close within the grace period
  });
}

void Session::RejectBeforeJoin(const Status& error) {
  spdlog::warn("peer {}: rejected before joining: {}", peer_, error.ToString());
  writer_ = std::make_unique<tcp::FrameWriter>(socket_, socket_.get_executor());
  Fail(error, 0, {});
}

asio::awaitable<void> Session::Handshake() {
  // A connection that does not complete its Hello in time is dropped (slowloris).
  asio::steady_timer deadline(socket_.get_executor(), options_.handshake_timeout);
  bool timed_out = false;
  deadline.async_wait([this, &timed_out](const boost::system::error_code& ec) {
    if (!ec) {
      timed_out = true;
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
  });
  Result<FrameHeader> header = co_await tcp::ReadFrameHeader(socket_);
  Result<proto::ControlMessage> message = Status(StatusCode::kInternal, "unset");
  if (header.ok()) {
    if (header->type != FrameType::kControl) {
      message = ProtocolError(std::string("first frame must be CONTROL Hello, got ") + FrameTypeName(header->type));
    } else {
      Result<ByteBuffer> payload = co_await tcp::ReadPayload(socket_, header->payload_length);
      message = payload.ok() ? DecodeControl(payload->span()) : Result<proto::ControlMessage>(payload.status());
    }
  } else {
    message = header.status();
  }
  deadline.cancel();
  if (timed_out) {
    spdlog::warn("peer {}: no Hello within {} ms; connection dropped", peer_, options_.handshake_timeout.count());
    co_return;
  }
  if (!message.ok()) {
    if (message.status().code() == StatusCode::kUnavailable) {
      spdlog::info("peer {}: closed before Hello: {}", peer_, message.status().message());
      co_return;
    }
    RejectBeforeJoin(message.status().WithContext("handshake"));
    co_return;
  }
  if (message->body_case() != proto::ControlMessage::kHello) {
    RejectBeforeJoin(ProtocolError("first message must be Hello"));
    co_return;
  }
  hello_ = message->hello();
  if (Status st = ValidateHello(hello_, options_); !st.ok()) {
    const Status error = st.WithContext("job " + std::to_string(hello_.job_id()) + " rank " +
                                        std::to_string(hello_.rank()) + " (" + peer_ + ") Hello");
    RejectBeforeJoin(error);
    if (auto job = registry_.Find(hello_.job_id())) {
      asio::post(job->strand(), [job, error, rank = hello_.rank()] { job->AbortIfForming(error, rank); });
    }
    co_return;
  }
  Result<std::shared_ptr<Job>> job = registry_.FindOrCreate(hello_.job_id());
  if (!job.ok()) {
    RejectBeforeJoin(job.status().WithContext("job " + std::to_string(hello_.job_id())));
    co_return;
  }
  auto self = shared_from_this();
  asio::co_spawn((*job)->strand(), [self, job = *job] { return self->ReadLoop(job); }, asio::detached);
}

asio::awaitable<void> Session::ReadLoop(std::shared_ptr<Job> job) {
  // Now on the job's strand; the writer's completions run here too.
  executor_ = job->strand();
  writer_ = std::make_unique<tcp::FrameWriter>(socket_, job->strand());
  writer_->set_error_handler([](const Status&) {});  // the read side reports the failure
  while (true) {
    Job::JoinOutcome outcome = job->Join(shared_from_this());
    if (outcome == Job::JoinOutcome::kRejected) co_return;
    if (outcome == Job::JoinOutcome::kJoined) break;
    auto fresh = registry_.Replace(hello_.job_id(), job);
    if (fresh->strand() != job->strand()) {
      auto self = shared_from_this();
      asio::co_spawn(fresh->strand(), [self, fresh] { return self->ReadLoop(fresh); }, asio::detached);
      co_return;
    }
    job = fresh;
  }

  const uint32_t rank = hello_.rank();
  while (true) {
    Result<FrameHeader> header = co_await tcp::ReadFrameHeader(socket_);
    if (!header.ok()) {
      job->OnDisconnect(rank, this, header.status());
      co_return;
    }
    if (closed_ || job->dead()) {
      // Draining after an abort or goodbye: drop frames until the worker closes.
      if (Status st = co_await tcp::DiscardBytes(socket_, header->payload_length); !st.ok()) {
        job->OnDisconnect(rank, this, st);
        co_return;
      }
      continue;
    }
    if (header->type == FrameType::kControl) {
      Result<ByteBuffer> payload = co_await tcp::ReadPayload(socket_, header->payload_length);
      if (!payload.ok()) {
        job->OnDisconnect(rank, this, payload.status());
        co_return;
      }
      Result<proto::ControlMessage> message = DecodeControl(payload->span());
      if (!message.ok()) {
        job->OnDisconnect(rank, this, message.status());
        co_return;
      }
      job->OnControl(rank, *message);
    } else if (header->type == FrameType::kContribution) {
      Result<uint64_t> limit = job->CheckContribution(rank, *header);
      if (!limit.ok()) {
        job->OnDisconnect(rank, this, limit.status());
        co_return;
      }
      Result<ByteBuffer> payload = co_await tcp::ReadPayload(socket_, header->payload_length);
      if (!payload.ok()) {
        job->OnDisconnect(rank, this, payload.status());
        co_return;
      }
      job->OnContribution(rank, *header, std::move(*payload));
    } else {
      job->OnDisconnect(rank, this, ProtocolError("workers may not send RESULT frames"));
      co_return;
    }
  }
}

}  // namespace sparsereduce::aggregator
