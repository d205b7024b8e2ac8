#include "tests/integration/raw_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstring>

#include "protocol/control.h"
#include "protocol/frame_format.h"

namespace sparsereduce::testing {

int AcceptWithin(int listener, std::chrono::milliseconds timeout) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return -1;
  return accept(listener, nullptr, nullptr);
}

int ConnectToLoopback(uint16_t port, int receive_buffer) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (receive_buffer > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  close(fd);
  return -1;
}

int ConnectToLoopback(const std::string& address, int receive_buffer) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  return ConnectToLoopback(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))), receive_buffer);
}

int ListenOnLoopback(uint16_t* port, int receive_buffer) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (receive_buffer > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

namespace {

// The address of the abstract Unix socket `name`: a NUL, then the name, not NUL-terminated. False if too long.
bool AbstractAddress(const std::string& name, sockaddr_un* addr, socklen_t* length) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr->sun_path) return false;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return true;
}

}  // namespace

int ConnectToAbstract(const std::string& name) {
  sockaddr_un addr;
  socklen_t length;
  if (!AbstractAddress(name, &addr, &length)) return -1;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), length) == 0) return fd;
  close(fd);
  return -1;
}

int ListenOnAbstract(const std::string& name) {
  sockaddr_un addr;
  socklen_t length;
  if (!AbstractAddress(name, &addr, &length)) return -1;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), length) == 0 && listen(fd, 4) == 0) return fd;
  close(fd);
  return -1;
}

bool WriteAll(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n <= 0) return false;
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return true;
}

bool SendControl(int fd, const proto::ControlMessage& message) {
  const ByteBuffer frame = EncodeControl(message);
  return WriteAll(fd, std::span(frame.data(), frame.size()));
}

proto::ControlMessage RawJobReady(const std::string& transport) {
  proto::ControlMessage message;
  message.mutable_job_ready()->set_protocol_version(kProtocolVersion);
  message.mutable_job_ready()->set_transport(transport);
  return message;
}

proto::ControlMessage RawHello(uint64_t job, uint32_t rank, uint32_t world_size, uint32_t num_aggregators,
                               const WorkerOptions& shape) {
  proto::ControlMessage message;
  proto::Hello& hello = *message.mutable_hello();
  hello.set_protocol_version(kProtocolVersion);
  hello.set_job_id(job);
  hello.set_rank(rank);
  hello.set_world_size(world_size);
  hello.set_num_aggregators(num_aggregators);
  hello.set_slots(shape.slots);
  hello.set_blocks_per_message(shape.blocks_per_message);
  hello.set_window(shape.window);
  return message;
}

bool ReadExactly(int fd, void* out, size_t n, std::chrono::milliseconds idle_timeout) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(idle_timeout.count())) != 1) return false;
    const ssize_t got = read(fd, p, n);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

std::optional<RawFrame> ReadFrame(int fd) {
  std::array<std::byte, kFrameHeaderSize> bytes;
  if (!ReadExactly(fd, bytes.data(), bytes.size())) return std::nullopt;
  Result<FrameHeader> header = DecodeFrameHeader(bytes);
  if (!header.ok()) return std::nullopt;
  RawFrame frame{*header, std::vector<std::byte>(header->payload_length)};
  if (!ReadExactly(fd, frame.payload.data(), frame.payload.size())) return std::nullopt;
  return frame;
}

std::optional<proto::ControlMessage> ReadControlFrame(int fd) {
  const std::optional<RawFrame> frame = ReadFrame(fd);
  if (!frame || frame->header.type != FrameType::kControl) return std::nullopt;
  Result<proto::ControlMessage> message = DecodeControl(frame->payload);
  if (!message.ok()) return std::nullopt;
  return std::move(*message);
}

std::optional<std::string> ReadUntilClosed(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string bytes;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) != 1) return std::nullopt;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return bytes;  // EOF (or a reset, which also ends the connection)
    bytes.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace sparsereduce::testing
