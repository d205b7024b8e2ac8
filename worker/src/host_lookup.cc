#include "worker/src/host_lookup.h"

#include <netdb.h>
#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace sparsereduce::worker {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

Result<std::vector<tcp::endpoint>> GetAddrInfo(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return Status(StatusCode::kUnavailable, std::string(gai_strerror(rc)));
  std::vector<tcp::endpoint> endpoints;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    tcp::endpoint endpoint;
    std::memcpy(endpoint.data(), a->ai_addr, a->ai_addrlen);
    endpoint.resize(a->ai_addrlen);
    endpoints.push_back(endpoint);
  }
  freeaddrinfo(found);
  if (endpoints.empty()) return Status(StatusCode::kUnavailable, "no IPv4 or IPv6 address");
  return endpoints;
}

// Shared by the waiting coroutine and the lookup's thread. Once `given_up`, the thread touches nothing else: the
// executor and the timer may be gone.
struct Lookup {
  std::mutex mutex;
  bool given_up = false;
  std::optional<Result<std::vector<tcp::endpoint>>> result;
  asio::any_io_executor executor;
  asio::steady_timer* wait = nullptr;
};

}  // namespace

asio::awaitable<Result<std::vector<tcp::endpoint>>> LookUpHost(const std::string& host, uint16_t port,
                                                                asio::steady_timer& wait,
                                                                std::chrono::steady_clock::time_point deadline) {
  auto lookup = std::make_shared<Lookup>();
  lookup->executor = co_await asio::this_coro::executor;
  lookup->wait = &wait;
  wait.expires_at(deadline);
  std::thread([lookup, host, port] {
    Result<std::vector<tcp::endpoint>> found = GetAddrInfo(host, port);
    std::lock_guard lock(lookup->mutex);
    lookup->result = std::move(found);
    if (lookup->given_up) return;
    // Wakes the waiting coroutine (on its executor: the timer is not thread-safe).
    asio::post(lookup->executor, [lookup] {
      std::lock_guard lock(lookup->mutex);
      if (!lookup->given_up) lookup->wait->cancel();
    });
  }).detach();
  auto [ec] = co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
  std::lock_guard lock(lookup->mutex);
  lookup->given_up = true;
  if (lookup->result) co_return std::move(*lookup->result);
  if (ec == asio::error::operation_aborted) co_return Status(StatusCode::kAborted, "closed while looking it up");
  co_return Status(StatusCode::kDeadlineExceeded, "no answer from the resolver in time");
}

}  // namespace sparsereduce::worker
