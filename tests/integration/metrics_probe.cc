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
  stream.expires_after(std::chrono::seconds(5));
  stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "127.0.0.1");
  http::write(stream, request);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(stream, buffer, response);
  return {static_cast<int>(response.result_int()), response.body()};
}

double Sample(const std::string& metrics, const std::string& series) {
  const std::regex line("^" + series + " ([0-9.e+-]+)$", std::regex::multiline);
  std::smatch m;
  return std::regex_search(metrics, m, line) ? std::stod(m[1]) : -1;
}

}  // namespace sparsereduce::testing
