#include "worker/src/worker_environment.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "protocol/auth.h"

namespace sparsereduce::worker {
namespace {

std::string Get(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    const size_t begin = item.find_first_not_of(" \t");
    const size_t end = item.find_last_not_of(" \t");
    if (begin != std::string::npos) out.push_back(item.substr(begin, end - begin + 1));
  }
  return out;
}

}  // namespace

Result<WorkerOptions> ApplyEnvironment(WorkerOptions options) {
  if (options.aggregators.empty()) options.aggregators = SplitList(Get("SPARSEREDUCE_AGGREGATORS"));
  if (options.aggregators.empty()) {
    return InvalidArgument("no aggregators given (WorkerOptions::aggregators or SPARSEREDUCE_AGGREGATORS)");
  }
  if (options.transport.empty()) options.transport = Get("SPARSEREDUCE_TRANSPORT");
  if (options.transport.empty()) options.transport = "auto";
  if (options.transport != "auto" && options.transport != "tcp" && options.transport != "shm" &&
      options.transport != "rdma") {
    return InvalidArgument("unknown transport '" + options.transport + "' (auto, tcp, shm or rdma; "
                           "WorkerOptions::transport or SPARSEREDUCE_TRANSPORT)");
  }
  if (options.rdma_device.empty()) options.rdma_device = Get("SPARSEREDUCE_RDMA_DEVICE");
  if (options.tcp_send_buffer == 0) {
    if (std::string text = Get("SPARSEREDUCE_TCP_SEND_BUFFER"); !text.empty()) {
      uint64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || value > kMaxTcpSendBuffer) {
        return InvalidArgument("SPARSEREDUCE_TCP_SEND_BUFFER '" + text + "' is not a byte count from 0 to " +
                               std::to_string(kMaxTcpSendBuffer));
      }
      options.tcp_send_buffer = static_cast<uint32_t>(value);
    }
  }
  if (options.tcp_send_buffer > kMaxTcpSendBuffer) {
    return InvalidArgument("tcp_send_buffer " + std::to_string(options.tcp_send_buffer) + " is above " +
                           std::to_string(kMaxTcpSendBuffer) + " bytes");
  }
  // The secret and where it came from (named in errors). Every source gets the rule of the aggregator's secret
  // files, one trailing newline dropped: a secret that ends in one could never match theirs.
  std::string source;
  if (!options.secret.empty()) {
    source = "WorkerOptions::secret";
  } else if (std::string secret = Get("SPARSEREDUCE_SECRET"); !secret.empty()) {
    options.secret = std::move(secret);
    source = "SPARSEREDUCE_SECRET";
  } else if (std::string path = Get("SPARSEREDUCE_SECRET_FILE"); !path.empty()) {
    std::ifstream file(path, std::ios::binary);
    if (!file) {
      return InvalidArgument("cannot read SPARSEREDUCE_SECRET_FILE " + path + ": " + std::strerror(errno));
    }
    std::ostringstream contents;
    contents << file.rdbuf();
    options.secret = contents.str();
    source = "SPARSEREDUCE_SECRET_FILE " + path;
  }
  if (source.empty()) return options;
  Result<std::string> normalized = auth::NormalizeSecret(std::move(options.secret), source);
  if (!normalized.ok()) return normalized.status();
  options.secret = std::move(*normalized);
  return options;
}

}  // namespace sparsereduce::worker
