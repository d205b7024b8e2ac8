#include "aggregator/http_endpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <optional>

#include "core/exception_text.h"
#include "transport/tcp/listener.h"

namespace sparsereduce::aggregator {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

constexpr auto kRequestDeadline = std::chrono::seconds(10);
constexpr size_t kMaxRequestBytes = 16 * 1024;  // a scrape or probe needs a few hundred

http::response<http::string_body> Respond(const http::request<http::string_body>& request,
                                          const HttpEndpoint::Handlers& handlers) {
  http::response<http::string_body> response;
  response.version(request.version());
  response.keep_alive(request.keep_alive());
  response.set(http::field::content_type, "text/plain; charset=utf-8");
  const std::string_view target(request.target().data(), request.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  if (request.method() != http::verb::get && request.method() != http::verb::head) {
    response.result(http::status::method_not_allowed);
    response.set(http::field::allow, "GET, HEAD");
    response.body() = "only GET and HEAD\n";
  } else if (path == "/metrics") {
    response.result(http::status::ok);
    response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    response.body() = handlers.metrics();
  } else if (path == "/healthz") {
    response.result(http::status::ok);
    response.body() = "ok\n";
  } else if (path == "/readyz") {
    const bool ready = handlers.ready();
    response.result(ready ? http::status::ok : http::status::service_unavailable);
    response.body() = ready ? "ready\n" : "not ready (starting or draining)\n";
  } else {
    response.result(http::status::not_found);
    response.body() = "not found; try /metrics, /healthz or /readyz\n";
  }
  response.prepare_payload();
  if (request.method() == http::verb::head) response.body().clear();
  return response;
}

asio::awaitable<void> Serve(std::shared_ptr<beast::tcp_stream> connection, const HttpEndpoint::Handlers& handlers,
                            ConnectionSet& connections, uint64_t id) {
  struct Registered {
    ConnectionSet& connections;
    uint64_t id;
    ~Registered() { connections.Remove(id); }
  } registered{connections, id};
  beast::tcp_stream& stream = *connection;
  beast::flat_buffer buffer;
  while (true) {
    stream.expires_after(kRequestDeadline);
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxRequestBytes);
    parser.body_limit(kMaxRequestBytes);
    auto [read_error, read] = co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
    if (read_error) break;  // closed, timed out or malformed: nothing useful to answer
    const http::request<http::string_body> request = parser.release();
    http::response<http::string_body> response = Respond(request, handlers);
    const bool keep_alive = response.keep_alive();
    auto [write_error, written] =
        co_await http::async_write(stream, response, asio::as_tuple(asio::use_awaitable));
    if (write_error || !keep_alive) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.socket().close(ignored);  // now, so that the completion handler can take the descriptor back as the spare
}

bool OutOfDescriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system;
}

}  // namespace

HttpEndpoint::HttpEndpoint(asio::io_context& io, Handlers handlers, LogThrottle& accept_failures)
    : io_(io), strand_(asio::make_strand(io)), handlers_(std::move(handlers)), accept_failures_(accept_failures) {}

Result<tcp::endpoint> HttpEndpoint::Listen(const std::string& address) {
  auto acceptor = sparsereduce::tcp::OpenListener(strand_, address, "metrics address");
  if (!acceptor.ok()) return acceptor.status();
  acceptor_ = std::move(*acceptor);
  // Accepts in the spare's place are synchronous (right after the spare is closed) and must not block.
  boost::system::error_code ec;
  acceptor_->non_blocking(true, ec);
  if (ec) return Status(StatusCode::kInternal, "metrics endpoint: non-blocking listener: " + ec.message());
  ReserveSpare();
  return acceptor_->local_endpoint();
}

HttpEndpoint::~HttpEndpoint() { ReleaseSpare(); }

void HttpEndpoint::ReserveSpare() {
  if (spare_ < 0) spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // -1 at the limit: tried again later
}

void HttpEndpoint::ReleaseSpare() {
  if (spare_ >= 0) ::close(spare_);
  spare_ = -1;
}

void HttpEndpoint::Start() {
  asio::co_spawn(strand_, AcceptLoop(), [this](std::exception_ptr error) {  // on strand_
    if (!error) return;
    spdlog::error("metrics endpoint: stopped accepting: {}", ExceptionText(error));
    // Closed, so that connections are refused rather than left in the backlog: /healthz fails at once and a
    // liveness probe restarts the daemon.
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
  });
}

void HttpEndpoint::Stop() {
  asio::dispatch(strand_, [this] {
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
    ReleaseSpare();
  });
  connections_.CloseAll();
}

asio::awaitable<void> HttpEndpoint::AcceptLoop() {
  while (acceptor_ && acceptor_->is_open()) {
    ReserveSpare();  // if a connection used it, and has ended or some other descriptor was freed since
    // Waits for a pending connection, then accepts it without blocking. (Not async_accept: out of descriptors,
    // accept() fails with EMFILE before it looks at the queue, so that fails also with none pending, and spare_
    // could not tell a probe from nothing.)
    auto [wait_error] = co_await acceptor_->async_wait(tcp::acceptor::wait_read, asio::as_tuple(asio::use_awaitable));
    if (wait_error == asio::error::operation_aborted || !acceptor_->is_open()) break;
    boost::system::error_code ec;  // (any other wait_error shows in the accept too)
    auto socket = acceptor_->accept(asio::make_strand(io_), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;  // gone meanwhile
    if (OutOfDescriptors(ec) && spare_ >= 0) {
      // Out of descriptors (the data-plane connections have taken them all): the spare makes room for this one
      // connection, accepted at once, before anything else can take the freed descriptor (an I/O thread could in
      // the moment between, and then this accept fails as it would have). So the kubelet's liveness and readiness
      // probes are answered while the data-plane listeners pause; the spare is taken back when a connection ends.
      ReleaseSpare();
      ec = {};
      socket = acceptor_->accept(asio::make_strand(io_), ec);
    }
    if (ec) {
      // Pause instead of spinning (sparsereduce::tcp::kAcceptRetryDelay), as the data-plane listeners do.
      if (accept_failures_.Admit()) {
        spdlog::warn("metrics endpoint: accept failed: {}; retrying in {} ms", ec.message(),
                     sparsereduce::tcp::kAcceptRetryDelay.count());
      }
      asio::steady_timer pause(strand_, sparsereduce::tcp::kAcceptRetryDelay);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    auto executor = socket.get_executor();
    auto connection = std::make_shared<beast::tcp_stream>(std::move(socket));
    // Closed on its own strand, which ends whatever it waits for.
    auto close = [weak = std::weak_ptr<beast::tcp_stream>(connection)] {
      if (auto held = weak.lock()) asio::post(held->get_executor(), [held] { held->close(); });
    };
    // At the limit the longest-open connection makes room, so that a client holding kMaxConnections idle
    // connections cannot keep the kubelet's probes or the scraper out (which would get the daemon restarted). Not
    // logged: that would let the client flood the log instead.
    if (connections_.size() >= kMaxConnections) connections_.CloseOldest();
    const std::optional<uint64_t> id = connections_.Add(close);
    if (!id) {  // stopped
      boost::system::error_code ignored;
      connection->socket().close(ignored);
      continue;
    }
    asio::co_spawn(executor, Serve(std::move(connection), handlers_, connections_, *id),
                   [this](std::exception_ptr error) {  // the connection closes as the coroutine's frame goes
                     if (error) spdlog::error("metrics endpoint: a connection ended by an exception: {}",
                                              ExceptionText(error));
                     // Its descriptor is free: the spare, if a connection used it, takes it back.
                     asio::dispatch(strand_, [this] {
                       if (acceptor_ && acceptor_->is_open()) ReserveSpare();
                     });
                   });
  }
}

}  // namespace sparsereduce::aggregator
