#include "aggregator/session.h"

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <algorithm>
#include <tuple>
#include <variant>

#include "aggregator/job.h"
#include "aggregator/job_registry.h"
#include "aggregator/peer_text.h"
#include "aggregator/service_context.h"
#include "core/exception_text.h"
#include "protocol/auth.h"
#include "protocol/control.h"
#include "transport/deadline.h"
#include "transport/tcp/channel.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/readable.h"

namespace sparsereduce::aggregator {

namespace asio = boost::asio;

namespace {

std::string PeerName(const tcp::Socket& socket) {
  boost::system::error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  if (ec) return "?";
  return sparsereduce::tcp::EndpointText(endpoint);
}

Status ValidateHello(const proto::Hello& h, const ServerOptions& o) {
  if (h.protocol_version() != kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch, "protocol version " + std::to_string(h.protocol_version()) +
                                                    " is not supported (this aggregator speaks " +
                                                    std::to_string(kProtocolVersion) + ")");
  }
  JobShape shape{h.world_size(), h.num_aggregators(), h.slots(), h.blocks_per_message(), h.window()};
  if (Status st = ValidateShape(shape); !st.ok()) return st;
  if (h.rank() >= h.world_size()) {
    return InvalidArgument("rank " + std::to_string(h.rank()) + " is out of range for world_size " +
                           std::to_string(h.world_size()));
  }
  if (h.aggregator_index() >= h.num_aggregators()) {
    return InvalidArgument("aggregator_index " + std::to_string(h.aggregator_index()) +
                           " is out of range for num_aggregators " + std::to_string(h.num_aggregators()));
  }
  // `source`: what sets the limit, so the refusal says what to change.
  auto limit = [](const char* what, uint32_t value, uint32_t max, const char* source) {
    return value <= max ? Status::Ok()
                        : Status(StatusCode::kResourceExhausted, std::string(what) + " " + std::to_string(value) +
                                                                     " exceeds this aggregator's limit of " +
                                                                     std::to_string(max) + " (" + source + ")");
  };
  if (Status st = limit("world_size", h.world_size(), o.max_world_size, "--max-world-size"); !st.ok()) return st;
  if (Status st = limit("slots", h.slots(), o.max_slots, "docs/PROTOCOL.md §5"); !st.ok()) return st;
  if (Status st = limit("window", h.window(), o.max_window, "docs/PROTOCOL.md §5"); !st.ok()) return st;
  return limit("blocks_per_message", h.blocks_per_message(), o.max_blocks_per_message, "docs/PROTOCOL.md §5");
}

}  // namespace

Session::Session(tcp::Socket socket, JobRegistry& registry, ServiceContext& context)
    : socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      handshake_strand_(socket_.get_executor()),
      registry_(registry),
      context_(context),
      peer_(PeerName(socket_)) {}

void Session::Send(std::shared_ptr<const ByteBuffer> frame) {
  context_.metrics.BytesSent(frame->size());
  channel_->Send(std::move(frame));
}

void Session::Start(std::optional<HandshakeLimit::Slot> slot) {
  handshake_slot_ = std::move(slot);
  handshake_id_ = context_.handshakes.Add([weak = weak_from_this(), strand = handshake_strand_] {
    asio::dispatch(strand, [weak] {
      if (auto self = weak.lock()) self->StopHandshake();
    });
  });
  if (!handshake_id_) {  // the server is stopping
    boost::system::error_code ignored;
    socket_.close(ignored);
    return;
  }
  asio::co_spawn(socket_.get_executor(), [self = shared_from_this()] { return self->Handshake(); },
                 [self = shared_from_this()](std::exception_ptr error) {
                   if (error) self->EndOnException("the handshake", nullptr, error);
                 });
}

Session::~Session() {
  if (handshake_id_) context_.handshakes.Remove(*handshake_id_);
}

void Session::HandOverToJob() {
  if (handshake_id_) context_.handshakes.Remove(*handshake_id_);
  handshake_id_.reset();
}

void Session::StopHandshake() {
  if (!handshake_id_) return;  // the connection is the job strand's now
  handshake_stopped_ = true;
  if (channel_) {
    // Refused, waiting for the worker to close: not any longer.
    channel_->Abort();
    if (close_grace_) close_grace_->cancel();
    return;
  }
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void Session::SendControl(const proto::ControlMessage& message) {
  Send(std::make_shared<const ByteBuffer>(EncodeControl(message)));
}

void Session::Fail(const Status& error, uint64_t seq, const std::vector<uint32_t>& ranks) {
  if (closed_) return;
  proto::ControlMessage message;
  proto::Error* e = message.mutable_error();
  e->set_code(ToProtoCode(error.code()));
  // Bounded, so that the Error always fits a CONTROL frame the worker can read, whatever it quotes.
  e->set_message(CutText(error.message(), kMaxErrorMessage));
  e->set_seq(seq);
  for (size_t i = 0; i < std::min(ranks.size(), kMaxErrorRanks); ++i) e->add_ranks(ranks[i]);
  SendControl(message);
  Close();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  // Only the sending side: the read loop keeps draining what the worker still sends until it closes, so the
  // close never turns into a reset that could destroy the Error frame before the worker reads it.
  channel_->CloseAfterFlush(/*both=*/false);
  ArmCloseGrace();
}

void Session::ArmCloseGrace() {
  close_grace_ = std::make_shared<asio::steady_timer>(executor_, std::chrono::seconds(5));
  close_grace_->async_wait([self = shared_from_this(), timer = close_grace_](const boost::system::error_code& ec) {
    if (ec) return;
    self->channel_->Abort();  // the worker did not close within the grace period
  });
}

void Session::RejectBeforeJoin(const Status& error) {
  if (context_.refusal_log.Admit()) spdlog::warn("peer {}: rejected before joining: {}", peer_, error.ToString());
  context_.metrics.Error(error.code());
  if (worker_left_tcp_) {
    // An Error on TCP would reach the worker as data after its switch, a protocol violation of ours that hides the
    // reason; the close ends its connection, and the reason is in the line above.
    boost::system::error_code ignored;
    socket_.close(ignored);
    return;
  }
  channel_ = MakeChannel(executor_);
  Fail(error, 0, {});
  asio::co_spawn(executor_, [self = shared_from_this()] { return self->DrainUntilClosed(); },
                 [peer = peer_](std::exception_ptr error) {
                   if (error) spdlog::error("peer {}: draining a refused connection: {}", peer, ExceptionText(error));
                 });
}

asio::awaitable<void> Session::EndMembership(Job& job, uint32_t rank, const Status& reason) {
  job.OnDisconnect(rank, this, reason);
  // UNAVAILABLE: the stream ended or broke, and there is nothing left to read (a read after the end of stream may
  // not complete before the close grace does).
  if (!closed_ || reason.code() == StatusCode::kUnavailable) co_return;
  // Dropped in chunks, framed or not: after a header that does not decode, nothing tells where a frame starts.
  constexpr uint64_t kChunk = 64 << 10;
  while ((co_await channel_->Discard(kChunk)).ok()) {
  }
}

asio::awaitable<void> Session::DrainUntilClosed() {
  while (true) {
    Result<FrameHeader> header = co_await channel_->ReadHeader();
    if (!header.ok() || !(co_await channel_->Discard(header->payload_length)).ok()) break;
  }
  if (close_grace_) close_grace_->cancel();
}

asio::awaitable<Result<proto::ControlMessage>> Session::ReadControl() {
  Result<FrameHeader> header = co_await tcp::ReadFrameHeader(socket_);
  if (!header.ok()) co_return header.status();
  if (header->type != FrameType::kControl) {
    co_return ProtocolError(std::string("expected a CONTROL frame in the handshake, got ") +
                            FrameTypeName(header->type));
  }
  context_.metrics.BytesReceived(kFrameHeaderSize + header->payload_length);
  Result<ByteBuffer> payload = co_await tcp::ReadPayload(socket_, header->payload_length);
  if (!payload.ok()) co_return payload.status();
  co_return DecodeControl(payload->span());
}

asio::awaitable<void> Session::Handshake() {
  boost::system::error_code ec;
  const auto remote = socket_.remote_endpoint(ec);
  if (!ec && !context_.allowlist.Allows(remote.address())) {
    RejectBeforeJoin(Status(StatusCode::kPermissionDenied,
                            "client " + peer_ + " is outside this aggregator's allowed networks (--allow-network)"));
    co_return;
  }
  // A connection that does not complete its handshake in time is dropped (slowloris).
  // On this connection's strand; once cancelled it leaves the socket alone, which the job's strand reads next.
  transport::Deadline deadline(socket_.get_executor(),
                               std::chrono::steady_clock::now() + context_.options.handshake_timeout, socket_);
  Result<proto::ControlMessage> message = co_await ReadControl();
  const bool got_hello = message.ok() && message->body_case() == proto::ControlMessage::kHello;
  Status st = message.ok() ? Status::Ok() : message.status();
  if (st.ok() && !got_hello) st = ProtocolError("first message must be Hello");
  if (st.ok()) {
    hello_ = message->hello();
    st = ValidateHello(hello_, context_.options);
    if (!st.ok()) {
      st = st.WithContext(Who() + " Hello");
      // The other ranks of a forming job learn at once that it cannot form, instead of at their join timeout; but
      // only for a job anyone may join: this peer is not authenticated, and must not be able to end a job that
      // requires a secret.
      Result<std::optional<std::string>> secret = context_.secrets.Lookup(hello_.job_id());
      const bool open_job = secret.ok() && !*secret && !context_.options.require_auth;
      if (auto job = open_job ? registry_.Find(hello_.job_id()) : nullptr) {
        asio::post(job->strand(), [job, st, rank = hello_.rank()] { job->AbortIfForming(st, rank); });
      }
    } else {
      handshake_step_ = "authenticating";
      st = co_await Authenticate();
      if (st.ok()) st = co_await OfferTransport(deadline.expiry());
      if (!st.ok()) st = st.WithContext(Who());
    }
  }
  deadline.Cancel();
  if (handshake_stopped_) {
    if (context_.early_close_log.Admit()) {
      spdlog::info("{}: handshake ended: the aggregator is stopping", got_hello ? Who() : "peer " + peer_);
    }
    co_return;
  }
  if (deadline.expired()) {
    if (context_.refusal_log.Admit()) {
      spdlog::warn("{}: no complete handshake within {} ms ({}); connection dropped",
                   got_hello ? Who() : "peer " + peer_, context_.options.handshake_timeout.count(), handshake_step_);
    }
    context_.metrics.Error(StatusCode::kDeadlineExceeded);
    co_return;
  }
  if (!st.ok()) {
    if (st.code() == StatusCode::kUnavailable) {
      if (context_.early_close_log.Admit()) {
        spdlog::info("peer {}: closed during the handshake: {}", peer_, st.message());
      }
      co_return;
    }
    RejectBeforeJoin(st.WithContext("handshake"));
    co_return;
  }
  Result<std::shared_ptr<Job>> job = registry_.FindOrCreate(hello_.job_id());
  if (!job.ok()) {
    RejectBeforeJoin(job.status().WithContext(Who()));  // --max-jobs, or draining: the rank and peer too
    co_return;
  }
  HandOverToJob();
  SpawnReadLoop(*job);
}

void Session::SpawnReadLoop(const std::shared_ptr<Job>& job) {
  asio::co_spawn(
      job->strand(), [self = shared_from_this(), job] { return self->ReadLoop(job); },
      [self = shared_from_this(), job](std::exception_ptr error) {
        if (error) self->EndOnException("the read loop", job, error);
      });
}

void Session::EndOnException(const char* what, const std::shared_ptr<Job>& job, const std::exception_ptr& error) {
  try {
    const Status status(StatusCode::kInternal, std::string(what) + " ended by an exception: " + ExceptionText(error));
    spdlog::error("{}: {}", hello_.world_size() > 0 ? Who() : "peer " + peer_, status.message());
    context_.metrics.Error(status.code());
    if (channel_ && !closed_) {
      // First, so that the job's abort below (which would tell this worker PEER_LEFT about itself) passes it by.
      // Nothing reads the connection any more: the close grace ends it.
      Fail(status, 0, {});
    } else if (channel_) {
      ArmCloseGrace();  // closing already; the read loop's exit cancelled the grace that would have ended it
    } else {
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
    if (job) job->OnDisconnect(hello_.rank(), this, status);  // the job's strand: its other ranks learn at once
  } catch (...) {
    // A second exception (std::bad_alloc again): nothing more can be done here, and it must not leave the
    // io_context's run, which would end the daemon for every job.
  }
}

// Errors are returned without naming the job, rank and peer: Handshake adds Who() to every one.
asio::awaitable<Status> Session::Authenticate() {
  Result<std::optional<std::string>> secret = context_.secrets.Lookup(hello_.job_id());
  if (!secret.ok()) co_return secret.status();
  const std::string& client_nonce = hello_.auth_nonce();
  if (!*secret) {
    if (context_.options.require_auth) {
      co_return Status(StatusCode::kUnauthenticated,
                       "this aggregator requires authentication (--require-auth) and holds no secret for "
                             "the job; add it to --job-secrets-dir");
    }
    if (!client_nonce.empty()) {
      // The worker expects an authenticated job; going on without would silently drop the protection it asked for.
      co_return Status(StatusCode::kUnauthenticated,
                       "the worker has a secret for the job but this aggregator holds none; add it to "
                             "--job-secrets-dir or remove it from the worker");
    }
    co_return Status::Ok();
  }
  if (client_nonce.empty()) {
    co_return Status(StatusCode::kUnauthenticated,
                     "the job requires authentication but the worker sent no credentials; give it the "
                           "job's secret (SPARSEREDUCE_SECRET or SPARSEREDUCE_SECRET_FILE)");
  }
  if (client_nonce.size() != auth::kNonceSize) {
    co_return ProtocolError("Hello auth_nonce of " + std::to_string(client_nonce.size()) + " bytes, expected " +
                            std::to_string(auth::kNonceSize));
  }
  const std::string server_nonce = auth::RandomNonce();
  const auth::Transcript transcript{hello_.job_id(), hello_.rank(), hello_.world_size(), hello_.aggregator_index(),
                                    client_nonce, server_nonce};
  proto::ControlMessage challenge;
  challenge.mutable_auth_challenge()->set_server_nonce(server_nonce);
  challenge.mutable_auth_challenge()->set_server_proof(auth::ServerProof(**secret, transcript));
  if (Status st = co_await WriteControl(challenge); !st.ok()) co_return st.WithContext("sending AuthChallenge");
  Result<proto::ControlMessage> response = co_await ReadControl();
  if (!response.ok() && response.status().code() == StatusCode::kUnavailable) {
    // A worker that finds the aggregator's proof wrong closes without a word: without this, a mismatched secret
    // (the common case: one side rotated) would show only as an early close, neither warned about nor counted.
    co_return Status(StatusCode::kUnauthenticated,
                     "closed the connection after the AuthChallenge instead of answering it: most likely its secret "
                     "for the job differs from this aggregator's (a worker refuses an aggregator whose proof is "
                     "wrong)");
  }
  if (!response.ok()) co_return response.status();
  if (response->body_case() != proto::ControlMessage::kAuthResponse) {
    co_return ProtocolError("expected AuthResponse after AuthChallenge");
  }
  if (!auth::ProofMatches(auth::ClientProof(**secret, transcript), response->auth_response().client_proof())) {
    co_return Status(StatusCode::kUnauthenticated,
                     "authentication failed: the worker's secret for the job differs from this aggregator's");
  }
  spdlog::debug("{}: authenticated", Who());
  co_return Status::Ok();
}

asio::awaitable<Status> Session::WriteControl(const proto::ControlMessage& message) {
  const ByteBuffer frame = EncodeControl(message);
  auto [ec, written] = co_await asio::async_write(socket_, asio::buffer(frame.data(), frame.size()),
                                                  asio::as_tuple(asio::use_awaitable));
  if (ec) co_return Status(StatusCode::kUnavailable, "write failed: " + ec.message());
  context_.metrics.BytesSent(written);
  co_return Status::Ok();
}

asio::awaitable<Status> Session::OfferTransport(std::chrono::steady_clock::time_point deadline) {
  // `capability`: what the worker lists in Hello for the transport the aggregator's option names `kind`.
  auto both = [&](const std::string& kind, const std::string& capability) {
    const auto& offered = context_.options.transports;
    return std::find(hello_.transports().begin(), hello_.transports().end(), capability) !=
               hello_.transports().end() &&
           std::find(offered.begin(), offered.end(), kind) != offered.end();
  };
  // Shared memory first: it is only taken by a worker on this host, for which it is the faster path.
  if (both("shm", shm::kShmCapability)) {
    Status st = co_await OfferShm(deadline);
    if (!st.ok() || shm_) co_return st;
  }
#if SPARSEREDUCE_HAVE_RDMA
  if (both("rdma", "rdma") && context_.rdma) co_return co_await OfferRdma(deadline);
#endif
  co_return Status::Ok();
}

std::string Session::Who() const {
  return "job " + std::to_string(hello_.job_id()) + " rank " + std::to_string(hello_.rank()) + " (" + peer_ + ")";
}

asio::awaitable<Status> Session::OfferShm(std::chrono::steady_clock::time_point deadline) {
  if (const shm::PendingOffers& pending = context_.shm_offers; pending.full()) {
    spdlog::warn("{}: not offering shared memory, staying on TCP: {} earlier offers still wait for their workers to "
                 "receive the descriptors",
                 Who(), pending.count());
    co_return Status::Ok();
  }
  Result<std::unique_ptr<shm::ShmOffer>> offer =
      shm::ShmOffer::Create(executor_, context_.options.ring_bytes, context_.shm_offers);
  if (!offer.ok()) {
    spdlog::warn("{}: cannot offer shared memory, staying on TCP: {}", Who(), offer.status().ToString());
    co_return Status::Ok();
  }
  proto::ControlMessage message;
  proto::TransportOffer* o = message.mutable_transport_offer();
  o->set_kind("shm");
  o->set_shm_socket((*offer)->socket_name());
  o->set_token((*offer)->token());
  handshake_step_ = "sending the shared-memory offer";
  if (Status st = co_await WriteControl(message); !st.ok()) co_return st.WithContext("sending TransportOffer");
  // The worker either presents the token on the socket, or says on TCP why it cannot (another host).
  handshake_step_ = "waiting for the worker to present the shared-memory token, or to decline on TCP";
  using namespace asio::experimental::awaitable_operators;
  std::variant<Status, Result<proto::ControlMessage>> outcome =
      co_await ((*offer)->AcceptWorker(deadline) || ReadControl());
  if (outcome.index() == 0) {
    if (const Status& st = std::get<0>(outcome); !st.ok()) co_return st.WithContext("shared-memory handoff");
    // Raced with TCP becoming readable, not with a read of it: a worker that received the descriptors and cannot map
    // them closes the Unix socket and declines on TCP at once, and a read cut short by the other end of the race
    // would lose the decline. Readable is that decline, or the worker's close; the handshake deadline and
    // Server::Stop close the socket, which ends the wait too (a hoarder that never acknowledges kept it).
    handshake_step_ = "handing the shared-memory segment over: waiting for the worker's acknowledgement";
    // Readable for real: the wait can complete with nothing to read (seen under load with two I/O threads: 0 bytes
    // readable, the descriptors not yet received). That ended the handover as if the worker had declined; the
    // worker then took the segment, and the daemon waited for a decline that never came until the handshake
    // deadline (a CI flake of shm.MultiProcess.Int32AndSmallBlocks).
    std::variant<Status, boost::system::error_code> handed =
        co_await ((*offer)->HandOver(deadline) || tcp::WaitUntilReadable(socket_));
    if (handed.index() == 1 && std::get<1>(handed)) {
      // The TCP socket was closed under the wait (the handshake deadline, Server::Stop): the handoff ended there,
      // and where it stood is what the warning about it should say.
      handshake_step_ = "handing the shared-memory segment over: " + (*offer)->handover_progress();
      co_return Status(StatusCode::kUnavailable, "the connection was closed during the shared-memory handoff (" +
                                                     (*offer)->handover_progress() + ")");
    }
    const Status st = handed.index() == 0 ? std::get<0>(handed)
                                           : Status(StatusCode::kAborted, "the worker answered on TCP instead");
    // Where it stood, for the handshake deadline's line too: the offer's own timer expires at the same instant as
    // the handshake's, and when it ends the handover first, the line said only that the acknowledgement was awaited.
    if (!st.ok()) handshake_step_ = "handing the shared-memory segment over: " + (*offer)->handover_progress();
    if (st.code() == StatusCode::kResourceExhausted || st.code() == StatusCode::kAborted) {
      // kResourceExhausted, not the worker's fault: withdrawing the offer closes its Unix connection, and it
      // answers on TCP with a TransportDecline and stays there. kAborted: the worker gave the segment back.
      if (st.code() == StatusCode::kResourceExhausted) {
        spdlog::warn("{}: shared-memory offer withdrawn, staying on TCP: {}", Who(), st.message());
      }
      handshake_step_ = "waiting for the worker's TransportDecline after the shared-memory offer ended: " +
                        st.message() + "; " + (*offer)->handover_progress();
      offer->reset();
      Result<proto::ControlMessage> reply = co_await ReadControl();
      if (!reply.ok()) co_return reply.status();
      if (reply->body_case() != proto::ControlMessage::kTransportDecline) {
        co_return ProtocolError("expected TransportDecline after the shm offer was withdrawn or given back");
      }
      if (st.code() == StatusCode::kAborted) {
        spdlog::info("{}: the worker could not use the shared-memory segment, staying on TCP: {}", Who(),
                     PeerText(reply->transport_decline().reason()));
      }
      co_return Status::Ok();
    }
    if (!st.ok()) co_return st.WithContext("shared-memory handoff");
    shm_ = std::move(*offer);
    spdlog::debug("{}: connection moved to shared memory", Who());
    co_return Status::Ok();
  }
  const Result<proto::ControlMessage>& reply = std::get<1>(outcome);
  if (!reply.ok()) co_return reply.status();
  if (reply->body_case() != proto::ControlMessage::kTransportDecline) {
    co_return ProtocolError("expected TransportDecline (or the shm handoff) after TransportOffer");
  }
  spdlog::debug("{}: no shared memory: {}", Who(), PeerText(reply->transport_decline().reason()));
  co_return Status::Ok();
}

#if SPARSEREDUCE_HAVE_RDMA
asio::awaitable<Status> Session::OfferRdma(std::chrono::steady_clock::time_point) {
  Result<std::unique_ptr<rdma::RdmaConnection>> connection =
      rdma::RdmaConnection::Create(context_.rdma, context_.options.ring_bytes);
  if (!connection.ok()) {
    spdlog::warn("{}: cannot offer RDMA, staying on TCP: {}", Who(), connection.status().ToString());
    co_return Status::Ok();
  }
  proto::ControlMessage message;
  message.mutable_transport_offer()->set_kind("rdma");
  *message.mutable_transport_offer()->mutable_rdma() = (*connection)->LocalEndpoint();
  handshake_step_ = "sending the RDMA offer";
  if (Status st = co_await WriteControl(message); !st.ok()) co_return st.WithContext("sending TransportOffer");
  handshake_step_ = "waiting for the worker's answer to the RDMA offer";
  // Bounded by the handshake deadline, which closes the socket.
  Result<proto::ControlMessage> reply = co_await ReadControl();
  if (!reply.ok()) co_return reply.status();
  if (reply->body_case() == proto::ControlMessage::kTransportDecline) {
    spdlog::debug("{}: no RDMA: {}", Who(), PeerText(reply->transport_decline().reason()));
    co_return Status::Ok();
  }
  if (reply->body_case() != proto::ControlMessage::kTransportAccept) {
    co_return ProtocolError("expected TransportAccept or TransportDecline after an RDMA TransportOffer");
  }
  if (Status st = (*connection)->Connect(reply->transport_accept().rdma()); !st.ok()) {
    worker_left_tcp_ = true;  // it switched to RDMA with its accept (docs/PROTOCOL.md §10.4)
    co_return st.WithContext("RDMA connection");
  }
  rdma_ = std::move(*connection);
  spdlog::debug("{}: connection moved to RDMA", Who());
  co_return Status::Ok();
}
#endif

std::unique_ptr<transport::Channel> Session::MakeChannel(const asio::any_io_executor& executor) {
  if (shm_) return shm_->MakeChannel(std::move(socket_), executor);
#if SPARSEREDUCE_HAVE_RDMA
  if (rdma_) return rdma::RdmaConnection::MakeChannel(std::move(rdma_), std::move(socket_), executor);
#endif
  return std::make_unique<tcp::TcpChannel>(std::move(socket_), executor);
}

asio::awaitable<void> Session::ReadLoop(std::shared_ptr<Job> job) {
  // Now on the job's strand.
  executor_ = job->strand();
  if (job->Retired(shared_from_this())) {
    // Asked before the channel exists: its writer's and liveness completions run on the executor it is made with,
    // which must be the strand of the job it serves (it was the first job's, racing the fresh job's strand).
    Result<std::shared_ptr<Job>> replaced = registry_.Replace(hello_.job_id(), job);
    if (!replaced.ok()) {  // draining, or full: refused as any Hello then is (docs/PROTOCOL.md §5 item 1)
      RejectBeforeJoin(replaced.status().WithContext(Who()));
      co_return;
    }
    // The fresh job's own read loop (on its strand), so that the exception handler names the job it runs for.
    SpawnReadLoop(*replaced);
    co_return;
  }
  channel_ = MakeChannel(executor_);
  channel_->set_error_handler([](const Status&) {});  // the read side reports the failure
  if (job->Join(shared_from_this()) == Job::JoinOutcome::kRejected) {
    co_await DrainUntilClosed();
    co_return;
  }
  handshake_slot_.reset();  // a member now: the job's limits apply

  const uint32_t rank = hello_.rank();
  // The job holds what the channel lends until its blocks are aggregated; the channel calls this (on the strand,
  // inside a read) when it needs that memory back.
  channel_->set_recall_handler([weak = std::weak_ptr<Job>(job), rank, &metrics = context_.metrics] {
    metrics.RingRecalled();
    if (std::shared_ptr<Job> held = weak.lock()) held->ReturnLoans(rank);
  });
  // The job holds the memory of RESULTs until they are written (on the strand, like the writer's completions).
  channel_->set_idle_handler([weak = std::weak_ptr<Job>(job)] {
    if (std::shared_ptr<Job> held = weak.lock()) held->OnMemberIdle();
  });
  context_.metrics.WorkerJoined();
  // However the loop ends, the connection is done: no grace timer keeps the session (and the daemon's shutdown)
  // waiting once the worker has closed its side.
  struct OnExit {
    Session& session;
    ~OnExit() {
      session.context_.metrics.WorkerLeft();
      if (session.close_grace_) session.close_grace_->cancel();
    }
  } on_exit{*this};
  while (true) {
    co_await job->WaitWhileCongested(rank);
    Result<FrameHeader> header = co_await channel_->ReadHeader();
    if (!header.ok()) {
      co_await EndMembership(*job, rank, header.status());
      co_return;
    }
    context_.metrics.BytesReceived(kFrameHeaderSize + header->payload_length);
    if (closed_ || job->dead()) {
      // Draining after an abort or goodbye: drop frames until the worker closes.
      if (Status st = co_await channel_->Discard(header->payload_length); !st.ok()) {
        job->OnDisconnect(rank, this, st);
        co_return;
      }
      continue;
    }
    if (header->type == FrameType::kControl) {
      Result<ByteBuffer> payload = co_await channel_->ReadPayload(header->payload_length, nullptr);
      if (!payload.ok()) {
        co_await EndMembership(*job, rank, payload.status());
        co_return;
      }
      Result<proto::ControlMessage> message = DecodeControl(payload->span());
      if (!message.ok()) {
        co_await EndMembership(*job, rank, message.status());
        co_return;
      }
      job->OnControl(rank, *message);
    } else if (header->type == FrameType::kContribution) {
      Result<uint64_t> limit = job->CheckContribution(rank, *header);
      if (!limit.ok()) {
        co_await EndMembership(*job, rank, limit.status());
        co_return;
      }
      // In place where the transport can lend its receive memory (shared memory): no copy before the sum.
      Result<ByteBuffer> payload = co_await channel_->ReadPayloadLent(header->payload_length, context_.buffers.get());
      if (!payload.ok()) {
        co_await EndMembership(*job, rank, payload.status());
        co_return;
      }
      if (payload->on_loan()) context_.metrics.ContributionInPlace();
      job->OnContribution(rank, *header, std::move(*payload));
    } else {
      co_await EndMembership(*job, rank, ProtocolError("workers may not send RESULT frames"));
      co_return;
    }
  }
}

}  // namespace sparsereduce::aggregator
