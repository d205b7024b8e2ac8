#include "tests/integration/metrics_probe.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <regex>

namespace sparsereduce::testing {

namespace http = boost::beast::http;

HttpReply HttpGet(uint16_t port, const std::string& target) {
  boost::asio::io_context io;
  boost::beast::tcp_stream stream(io);
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "127.0.0.1");
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  boost::system::error_code failure;
  // Asynchronous steps: the stream's expiry bounds only those (the synchronous ones waited without end on a daemon
  // that accepts and never answers, the kind of defect these probes look for).
  stream.expires_after(std::chrono::seconds(5));
  stream.async_connect(
      boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port),
      [&](const boost::system::error_code& connect_ec) {
        if (connect_ec) {
          failure = connect_ec;
          return;
        }
        http::async_write(stream, request, [&](const boost::system::error_code& write_ec, size_t) {
          if (write_ec) {
            failure = write_ec;
            return;
          }
          http::async_read(stream, buffer, response,
                           [&](const boost::system::error_code& read_ec, size_t) { failure = read_ec; });
        });
      });
  io.run();
  if (failure) throw boost::system::system_error(failure, "GET " + target + " from 127.0.0.1:" + std::to_string(port));
  return {static_cast<int>(response.result_int()), response.body()};
}

double Sample(const std::string& metrics, const std::string& series) {
  const std::regex line("^" + series + " ([0-9.e+-]+)$", std::regex::multiline);
  std::smatch m;
  return std::regex_search(metrics, m, line) ? std::stod(m[1]) : -1;
}

}  // namespace sparsereduce::testing
