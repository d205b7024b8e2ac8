// The Worker's lifecycle against aggregators played by hand (raw_peer.h): every way its constructor, a collective
// or its destructor can end must end within its timeouts, or at once when it is cancelled or another aggregator
// fails, whatever phase of the handshake a connection is in. Every wait here is bounded: a Worker that hangs fails
// the test instead of hanging it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "protocol/control.h"
#include "protocol/frame.h"
#include "protocol/frame_format.h"
#include "sparsereduce/worker.h"
#include "tests/integration/destroy_within.h"
#include "tests/integration/raw_peer.h"
#include "tests/test_time.h"

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;

// The bound on "at once" where a test measures it, scaled for sanitizer builds (tests/test_time.h).
std::chrono::milliseconds AtOnce(std::chrono::milliseconds bound) { return TestTime(bound); }

std::string UniqueName(const std::string& what) {
  return "sparsereduce-test/" + what + "/" + std::to_string(getpid());
}

proto::ControlMessage ShmOffer(const std::string& name) {
  proto::ControlMessage offer;
  offer.mutable_transport_offer()->set_kind("shm");
  offer.mutable_transport_offer()->set_shm_socket(name);
  offer.mutable_transport_offer()->set_token(std::string(16, 't'));
  return offer;
}

// The descriptors open now, of sockets only.
std::set<int> OpenSockets() {
  std::set<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) fds.insert(fd);
  }
  return fds;
}

// A Worker (world size 1, cancellable) in the middle of taking a shared-memory offer from an aggregator played by
// hand: it connected to the offer's socket and presented its token, and now waits for the descriptors, which never
// come. The descriptors `before` were open before the Worker started (the test's own listeners among them).
class WorkerTakingAnOffer {
 public:
  explicit WorkerTakingAnOffer(const std::string& what, uint64_t job) {
    listener_ = ListenOnLoopback(&port_);
    shm_listener_ = ListenOnAbstract(UniqueName(what));
    if (listener_ < 0 || shm_listener_ < 0) return;
    before = OpenSockets();
    WorkerOptions options;
    options.aggregators = {"127.0.0.1:" + std::to_string(port_)};
    options.job = job;
    options.world_size = 1;
    options.transport = "auto";
    options.connect_timeout = options.join_timeout = 15s;  // bounds the test if the Worker hangs
    options.cancel = stop.get_token();
    joined = std::async(std::launch::async, [options] { return std::make_unique<Worker>(options); });
    tcp = AcceptWithin(listener_, 10s);
    if (tcp < 0 || !ReadFrame(tcp) || !SendControl(tcp, ShmOffer(UniqueName(what)))) return;  // Hello, then the offer
    shm = AcceptWithin(shm_listener_, 10s);
    char token[16];
    taking = shm >= 0 && ReadExactly(shm, token, sizeof token);
  }
  ~WorkerTakingAnOffer() {
    stop.request_stop();
    if (joined.valid()) joined.wait_for(20s);
    for (int fd : {shm, tcp, shm_listener_, listener_}) {
      if (fd >= 0) close(fd);
    }
  }

  bool taking = false;  // the Worker got as far as waiting for the descriptors
  std::stop_source stop;
  std::future<std::unique_ptr<Worker>> joined;
  int tcp = -1, shm = -1;  // the aggregator's ends of the Worker's connections
  std::set<int> before;

 private:
  uint16_t port_ = 0;
  int listener_ = -1, shm_listener_ = -1;
};

// A worker in the middle of taking a shared-memory offer (it connected to the offer's socket and presented its
// token; the aggregator never hands the segment over) leaves at once when the join is cancelled. Close() did not
// reach the handoff, which went on waiting for the descriptors until the connect timeout, and with it the I/O
// thread and the cancelled constructor.
TEST(WorkerLifecycle, CancelDuringASharedMemoryHandoffEndsTheConstructorAtOnce) {
  WorkerTakingAnOffer worker("cancel-handoff", 40);
  ASSERT_TRUE(worker.taking) << "the worker did not take the offer";
  worker.stop.request_stop();
  const auto cancelled = std::chrono::steady_clock::now();
  const bool ended = worker.joined.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(ended) << "the constructor was still waiting 5 s after its join was cancelled during a handoff";
  try {
    worker.joined.get();  // after the connect timeout at the latest
    ADD_FAILURE() << "joined without a JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled, 5s);
}

// The Worker's sockets (its connection to the aggregator, the shared-memory handoff's) are close-on-exec: Asio
// opens sockets without SOCK_CLOEXEC, so a training process that ran a program (system(), a launcher) handed it
// the worker's connections, and the aggregator did not see the worker die while that program lived.
TEST(WorkerLifecycle, TheWorkersSocketsAreNotInheritedByPrograms) {
  WorkerTakingAnOffer worker("cloexec", 44);
  ASSERT_TRUE(worker.taking) << "the worker did not take the offer";  // both of its sockets are open now
  size_t workers_sockets = 0;
  for (const int socket : OpenSockets()) {
    if (worker.before.contains(socket) || socket == worker.tcp || socket == worker.shm) continue;  // the test's own
    ++workers_sockets;
    EXPECT_NE(fcntl(socket, F_GETFD) & FD_CLOEXEC, 0) << "descriptor " << socket << " is inherited by exec";
  }
  EXPECT_GE(workers_sockets, 2u) << "the worker's TCP connection and its handoff socket";
}

// The same when another aggregator refuses the job while the first connection takes its offer: the constructor
// throws that aggregator's error at once instead of after the handoff's deadline.
TEST(WorkerLifecycle, AnotherAggregatorsErrorDuringAHandoffEndsTheConstructorAtOnce) {
  uint16_t port0 = 0, port1 = 0;
  const int listener0 = ListenOnLoopback(&port0);
  const int listener1 = ListenOnLoopback(&port1);
  ASSERT_GE(listener0, 0);
  ASSERT_GE(listener1, 0);
  const std::string name = UniqueName("error-during-handoff");
  const int shm_listener = ListenOnAbstract(name);
  ASSERT_GE(shm_listener, 0) << std::strerror(errno);

  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port0), "127.0.0.1:" + std::to_string(port1)};
  options.job = 41;
  options.world_size = 1;
  options.transport = "auto";
  options.connect_timeout = options.join_timeout = 15s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd0 = AcceptWithin(listener0, 10s);
  const int fd1 = AcceptWithin(listener1, 10s);
  ASSERT_GE(fd0, 0);
  ASSERT_GE(fd1, 0);
  ASSERT_TRUE(ReadFrame(fd0));  // Hello
  ASSERT_TRUE(ReadFrame(fd1));
  ASSERT_TRUE(SendControl(fd0, ShmOffer(name)));
  const int shm_fd = AcceptWithin(shm_listener, 10s);
  ASSERT_GE(shm_fd, 0) << "the worker did not take the offer";
  char token[16];
  ASSERT_TRUE(ReadExactly(shm_fd, token, sizeof token));

  proto::ControlMessage error;
  error.mutable_error()->set_code(proto::JOB_CONFIG_MISMATCH);
  error.mutable_error()->set_message("job 41 is configured otherwise");
  ASSERT_TRUE(SendControl(fd1, error));
  const auto refused = std::chrono::steady_clock::now();
  const bool ended = joined.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(ended) << "the constructor was still waiting 5 s after aggregator 1 refused the job";
  try {
    joined.get();
    ADD_FAILURE() << "joined without a JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "JOB_CONFIG_MISMATCH") << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - refused, 5s);
  // Aggregator 0 is in its handshake, where a Goodbye would be a protocol violation (it waits for the decline or
  // the acknowledgement): the worker only closes the connection. It sent a Goodbye.
  const std::optional<std::string> after_hello = ReadUntilClosed(fd0);
  ASSERT_TRUE(after_hello) << "the worker kept its connection to aggregator 0";
  EXPECT_EQ(after_hello->size(), 0u) << "the worker sent aggregator 0 more than its Hello";
  close(shm_fd);
  close(fd0);
  close(fd1);
  close(shm_listener);
  close(listener0);
  close(listener1);
}


// A Worker of one rank joined through a hand-played aggregator (`fd`, TCP).
struct Joined {
  int listener = -1;
  int fd = -1;
  std::unique_ptr<Worker> worker;
  ~Joined() {
    worker.reset();
    if (fd >= 0) close(fd);
    if (listener >= 0) close(listener);
  }
};

void Join(WorkerOptions options, Joined* out, int receive_buffer = 0) {
  uint16_t port = 0;
  out->listener = ListenOnLoopback(&port, receive_buffer);
  ASSERT_GE(out->listener, 0);
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.world_size = 1;
  options.transport = "tcp";
  options.connect_timeout = options.join_timeout = 10s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  out->fd = AcceptWithin(out->listener, 10s);
  ASSERT_GE(out->fd, 0);
  ASSERT_TRUE(ReadFrame(out->fd));  // Hello
  const proto::ControlMessage ready = RawJobReady("tcp");
  ASSERT_TRUE(SendControl(out->fd, ready));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  out->worker = joined.get();
}

// Options whose TCP send buffer (4 KiB, and the hand-played aggregator's receive buffer, JoinBlocked) fills with the
// first frames of a collective the aggregator does not read: its writes block.
WorkerOptions SmallBuffers(uint64_t job, std::chrono::seconds collective_timeout) {
  WorkerOptions options;
  options.job = job;
  options.tcp_send_buffer = 4096;
  options.collective_timeout = collective_timeout;
  return options;
}

void JoinBlocked(const WorkerOptions& options, Joined* out) { Join(options, out, /*receive_buffer=*/4096); }

// One block of 4 floats, one slot, one block per message: the collective is CollectiveBegin, the announce and one
// CONTRIBUTION, answered by CollectiveAccepted, the announce reply and one RESULT.
WorkerOptions OneBlockShape(uint64_t job) {
  WorkerOptions options;
  options.job = job;
  options.block_size = 4;
  options.slots = 1;
  options.blocks_per_message = 1;
  options.window = 1;
  options.collective_timeout = 1s;
  return options;
}

// Reads the worker's three frames of a one-block collective and answers up to the RESULT's header and entry table
// and `data_bytes_sent` of its 16 data bytes.
void AnswerOneBlockPartly(int fd, uint64_t job, size_t data_bytes_sent) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(fd)) << "frame " << i;  // begin, announce, contribution
  proto::ControlMessage accepted;
  accepted.mutable_collective_accepted()->set_seq(1);
  ASSERT_TRUE(SendControl(fd, accepted));
  const FrameHeader header{FrameType::kResult, 0, 0, job, 1, 1};
  const std::array announce_reply{Entry{0, 0, 0}};
  const ByteBuffer reply = EncodeDataFrame(header, announce_reply, {});
  ASSERT_TRUE(WriteAll(fd, reply.span()));
  const std::array sum{7.0f, 7.0f, 7.0f, 7.0f};
  const std::array result_entry{Entry{0, kEndOfColumn, 16}};
  const std::array<std::span<const std::byte>, 1> data{std::as_bytes(std::span(sum))};
  const ByteBuffer result = EncodeDataFrame(header, result_entry, data);
  ASSERT_TRUE(WriteAll(fd, result.span().first(kFrameHeaderSize + kEntrySize + data_bytes_sent)));
}

// An aggregator that stops in the middle of a RESULT's data: the collective timeout still ends the collective, and
// the caller gets its input back although part of the RESULT already landed in the tensor.
TEST(WorkerLifecycle, AResultThatStopsMidFrameEndsAtTheCollectiveTimeout) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(Join(OneBlockShape(42), &j));
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  ASSERT_NO_FATAL_FAILURE(AnswerOneBlockPartly(j.fd, 42, 8));
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "the collective timeout (1 s) did not end it";
  try {
    done.get();
    ADD_FAILURE() << "a RESULT cut short completed the collective";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "DEADLINE_EXCEEDED") << e.what();
    EXPECT_NE(std::string(e.what()).find("job 42 rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tensor, input);
}

// The same aggregator closing the connection mid-frame: a protocol error naming the aggregator, input restored.
TEST(WorkerLifecycle, AnAggregatorClosingMidFrameFailsTheCollectiveAndRestoresTheInput) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(Join(OneBlockShape(43), &j));
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  ASSERT_NO_FATAL_FAILURE(AnswerOneBlockPartly(j.fd, 43, 8));
  shutdown(j.fd, SHUT_WR);
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  try {
    done.get();
    ADD_FAILURE() << "a RESULT cut short completed the collective";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "UNAVAILABLE") << e.what();  // a killed aggregator, as a close between frames is
    EXPECT_NE(std::string(e.what()).find("aggregator 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("closed inside a frame"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tensor, input);
}

// An aggregator that stops reading: the worker's writes block with frames that point into the tensor, and the
// collective timeout must still end the collective (and put the input back); then the Worker goes at once.
TEST(WorkerLifecycle, AnAggregatorThatStopsReadingEndsAtTheCollectiveTimeout) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(JoinBlocked(SmallBuffers(44, 1s), &j));
  std::vector<float> tensor(4 << 20);
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<float>(i % 1000) + 1.0f;
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "the collective timeout (1 s) did not end it";
  try {
    done.get();
    ADD_FAILURE() << "completed without an aggregator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "DEADLINE_EXCEEDED") << e.what();
    // Names the collective with its tensor, and says what usually keeps an aggregator from completing it.
    EXPECT_NE(std::string(e.what()).find("job 44 rank 0: collective 1 (4194304 float32 elements) did not complete "
                                         "within 1000 ms (collective_timeout); aggregator 0 (127.0.0.1:"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has not completed it: usually another rank has not called allreduce"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(tensor == input);
  EXPECT_TRUE(DestroyWithin(std::move(j.worker), 5s)) << "the destructor hung";
}

// Destroying the Worker while another thread waits for a collective whose writes are blocked: the waiting thread
// gets ABORTED with its input back, and the destructor returns.
TEST(WorkerLifecycle, DestroyingTheWorkerWhileACollectiveWaitsOnBlockedWrites) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(JoinBlocked(SmallBuffers(45, 60s), &j));
  std::vector<float> tensor(4 << 20);
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<float>(i % 1000) + 1.0f;
  const std::vector<float> input = tensor;
  std::vector<float> queued(1000, 1.0f);
  auto done = j.worker->allreduce_async(std::span(tensor));
  auto waiter = std::async(std::launch::async, [&]() -> std::string {
    try {
      done.get();
      return "completed";
    } catch (const Error& e) {
      return e.code();
    }
  });
  auto second = j.worker->allreduce_async(std::span(queued));
  ASSERT_TRUE(ReadFrame(j.fd));  // the collective is under way
  ASSERT_TRUE(DestroyWithin(std::move(j.worker), 10s)) << "the destructor hung";
  ASSERT_EQ(waiter.wait_for(1s), std::future_status::ready);
  EXPECT_EQ(waiter.get(), "ABORTED");
  EXPECT_THROW(second.get(), Error);
  EXPECT_TRUE(tensor == input);
}

// A connection the Worker aborts ends for the aggregator although a child of fork() (a DataLoader worker, say)
// holds a copy of its descriptor: the abort closed only this process's descriptor, so the child's copy kept the
// connection open, the aggregator waited for the rest of the frame until its stall timeout, and a retry of the job
// met JOB_FULL. Here the writes are blocked when abort() is called, so the failure's grace ends with the abort.
TEST(WorkerLifecycle, AnAbortedConnectionEndsThoughAForkedChildHoldsItsDescriptor) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(JoinBlocked(SmallBuffers(49, 60s), &j));
  std::vector<float> tensor(4 << 20, 1.0f);
  auto done = j.worker->allreduce_async(std::span(tensor));
  ASSERT_TRUE(ReadFrame(j.fd));  // the collective is under way; its CONTRIBUTIONs fill the small buffers
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the Worker's descriptors until the parent closes the pipe (or 30 s pass)
    close(hold[1]);
    alarm(30);
    char byte;
    while (read(hold[0], &byte, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  close(hold[0]);
  j.worker->abort();
  const bool failed = done.wait_for(10s) == std::future_status::ready;
  const std::optional<std::string> closed = ReadUntilClosed(j.fd, 5s);  // drains what was written, then the end
  close(hold[1]);  // the child exits (and is reaped) whatever happened above
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(failed) << "abort() did not end the collective";
  EXPECT_THROW(done.get(), Error);
  EXPECT_TRUE(closed.has_value()) << "the aborted connection stayed open while the child held its descriptor";
}

// The same with small frames (one 4-element block each): the writer blocks between frames, not inside one, so
// dropping the queue left it idle at once, and that finished the failure in the middle of queueing the Goodbyes;
// the grace timer was then never armed, the Goodbye waited behind the full socket, and the destructor waited for
// the kernel to give the connection up (TCP_USER_TIMEOUT, about 10 s).
TEST(WorkerLifecycle, DestroyingTheWorkerWhileSmallFramesAreBlockedReturnsWithinTheGrace) {
  WorkerOptions options = SmallBuffers(47, 60s);
  options.block_size = 4;
  options.slots = 64;
  options.blocks_per_message = 1;
  options.window = 256;
  Joined j;
  ASSERT_NO_FATAL_FAILURE(JoinBlocked(options, &j));
  std::vector<float> tensor(4 * 64 * 2000, 1.0f);  // every block nonzero: 2 MB to send, far above the buffers
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  // Blocked once this side's receive queue, which nobody reads, has stopped growing (the same for 200 ms).
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  int queued = 0, last = -1;
  for (auto since = std::chrono::steady_clock::now(); queued == 0 || queued != last ||
                                                      std::chrono::steady_clock::now() - since < 200ms;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the worker's writes never filled the socket";
    if (queued != last) since = std::chrono::steady_clock::now();
    last = queued;
    std::this_thread::sleep_for(10ms);
    ioctl(j.fd, FIONREAD, &queued);
  }
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(DestroyWithin(std::move(j.worker), 10s)) << "the destructor hung";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s) << "the destructor outlasted the 0.5 s grace by far";
  try {
    done.get();
    ADD_FAILURE() << "completed without an aggregator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
  }
  EXPECT_TRUE(tensor == input);
}

struct JoinFailure {
  std::string code;
  std::string what;
};

// Rank 0 of `options` joins through one aggregator played by hand: `play` acts on the accepted connection (its port
// given too). Returns how the constructor failed; fails the test if it joined, or did not end within 10 s.
std::optional<JoinFailure> FailedJoin(WorkerOptions options, const std::function<void(int fd, uint16_t port)>& play) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  if (listener < 0) {
    ADD_FAILURE() << "no listener";
    return std::nullopt;
  }
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd = AcceptWithin(listener, 10s);
  std::optional<JoinFailure> failure;
  if (fd < 0) {
    ADD_FAILURE() << "the worker did not connect";
  } else {
    play(fd, port);
  }
  if (joined.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "the constructor did not end within 10 s";
  } else {
    try {
      joined.get();
      ADD_FAILURE() << "joined without a JobReady";
    } catch (const Error& e) {
      failure = JoinFailure{e.code(), e.what()};
    }
  }
  if (fd >= 0) close(fd);
  close(listener);
  return failure;
}

// An aggregator that accepts the connection and never answers: the constructor ends at the join deadline. A job of
// one rank forms at once, so the error asks whether the address is an aggregator's data port.
TEST(WorkerLifecycle, ASilentAggregatorEndsTheConstructorAtTheJoinDeadline) {
  WorkerOptions options;
  options.job = 46;
  options.world_size = 1;
  options.connect_timeout = 500ms;
  options.join_timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  std::string address;
  const std::optional<JoinFailure> failure =
      FailedJoin(options, [&](int, uint16_t port) { address = "127.0.0.1:" + std::to_string(port); });
  ASSERT_TRUE(failure.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(failure->code, "DEADLINE_EXCEEDED") << failure->what;
  EXPECT_NE(failure->what.find("aggregator 0 (" + address + ") accepted the connection but has not answered (a job "
                               "of one rank forms at once): is the address an aggregator's data port?"),
            std::string::npos)
      << failure->what;
}

// A rank whose job does not form because another rank never comes: the error says the aggregator waits for the
// job's other ranks (it said "still waiting on aggregator 0", which read as the aggregator's fault).
TEST(WorkerLifecycle, AJobThatDoesNotFormSaysTheAggregatorWaitsForTheOtherRanks) {
  WorkerOptions options;
  options.job = 50;
  options.world_size = 3;
  options.connect_timeout = options.join_timeout = 300ms;
  std::string address;
  const std::optional<JoinFailure> failure =
      FailedJoin(options, [&](int, uint16_t port) { address = "127.0.0.1:" + std::to_string(port); });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->code, "DEADLINE_EXCEEDED") << failure->what;
  EXPECT_NE(failure->what.find("aggregator 0 (" + address + ") accepted this rank but has not reported the job "
                               "formed: it waits for the job's other 2 rank(s), which must run with the same job id"),
            std::string::npos)
      << failure->what;
}

// An aggregator that closes the connection without an Error while the job forms: the error says what that means,
// not only "connection closed by peer".
TEST(WorkerLifecycle, AConnectionClosedWhileJoiningSaysWhatThatMeans) {
  WorkerOptions options;
  options.job = 49;
  options.world_size = 2;
  options.connect_timeout = options.join_timeout = 20s;
  std::string address;
  const std::optional<JoinFailure> failure = FailedJoin(options, [&](int fd, uint16_t port) {
    address = "127.0.0.1:" + std::to_string(port);
    EXPECT_TRUE(ReadFrame(fd));  // Hello
    shutdown(fd, SHUT_RDWR);
  });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->code, "UNAVAILABLE") << failure->what;
  EXPECT_NE(failure->what.find("aggregator 0 (" + address + "): the aggregator closed the connection without an "
                               "Error while this rank waited for the job to form"),
            std::string::npos)
      << failure->what;
}

// A worker out of file descriptors (RLIMIT_NOFILE) that cannot open its connection's socket says so: Asio reports
// a socket it could not open as a cancelled connect, and the constructor failed with "cannot connect: Operation
// canceled". Forked workers with 0 to 6 descriptors to spare; each ends within its deadlines, none blames a
// cancellation, and one at least names the shortage.
TEST(WorkerLifecycle, AWorkerOutOfDescriptorsSaysSoWhenItCannotConnect) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitized build also runs UBSan, whose vptr check probes memory through a pipe: with no descriptor left it
  // cannot make one and reports every virtual call as "object has invalid vptr".
  GTEST_SKIP() << "UBSan's vptr check needs descriptors of its own";
#endif
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  int named_the_shortage = 0;
  for (int spare = 0; spare <= 6; ++spare) {
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      alarm(30);
      close(out[0]);
      int fd = 0;  // the limit under which `spare` descriptors are free (new ones take the lowest free numbers)
      for (int free_below = 0; free_below < spare; ++fd) {
        if (fcntl(fd, F_GETFD) == -1) ++free_below;
      }
      rlimit lowered{};
      getrlimit(RLIMIT_NOFILE, &lowered);
      lowered.rlim_cur = static_cast<rlim_t>(fd);
      if (setrlimit(RLIMIT_NOFILE, &lowered) != 0) _exit(2);
      WorkerOptions options;
      options.aggregators = {"127.0.0.1:" + std::to_string(port)};
      options.job = 48;
      options.world_size = 1;
      options.transport = "tcp";
      options.connect_timeout = 300ms;
      options.join_timeout = 300ms;
      std::string what;
      try {
        Worker worker(options);
        what = "joined";
      } catch (const std::exception& e) {
        what = e.what();
      }
      (void)!write(out[1], what.data(), what.size());
      _exit(0);
    }
    close(out[1]);
    std::string what;
    char buf[1024];
    for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) what.append(buf, static_cast<size_t>(n));
    close(out[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << spare << " to spare: " << what;
    EXPECT_EQ(what.find("Operation canceled"), std::string::npos) << spare << " to spare: " << what;
    if (what.find("cannot open a socket: Too many open files") != std::string::npos) ++named_the_shortage;
  }
  EXPECT_GT(named_the_shortage, 0) << "no limit kept the worker from opening its socket";
  close(listener);
}

// A worker holding the job's secret takes no transport offer from an aggregator that has not authenticated
// (docs/PROTOCOL.md §10.1: the offer comes after authentication): it fails UNAUTHENTICATED naming the aggregator,
// without connecting to the socket the offer names. It used to take the offer, connect to that socket and wait
// there for descriptors to map, and failed only at the join deadline.
TEST(WorkerLifecycle, ATransportOfferBeforeAuthenticationIsRefused) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  const std::string name = UniqueName("offer-before-auth");
  const int shm_listener = ListenOnAbstract(name);
  ASSERT_GE(shm_listener, 0) << std::strerror(errno);

  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 47;
  options.world_size = 1;
  options.transport = "auto";
  options.secret = "the job's secret";
  options.connect_timeout = options.join_timeout = 3s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd = AcceptWithin(listener, 10s);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadFrame(fd));  // Hello, with an auth nonce
  ASSERT_TRUE(SendControl(fd, ShmOffer(name)));  // no AuthChallenge first
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  try {
    joined.get();
    ADD_FAILURE() << "joined without a JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "UNAUTHENTICATED") << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(AcceptWithin(shm_listener, 0ms), 0) << "the worker connected to the unauthenticated offer's socket";
  close(fd);
  close(shm_listener);
  close(listener);
}

// A cancelled join stops retrying a refused connection at once. The pause between attempts (growing to 1 s) was
// a timer of its own that Close() did not reach, so the constructor returned only after the pause.
TEST(WorkerLifecycle, CancelWhileRetryingAConnectionEndsTheConstructorAtOnce) {
  uint16_t port = 0;
  const int probe = ListenOnLoopback(&port);
  ASSERT_GE(probe, 0);
  close(probe);  // connections to the port are refused from now on

  std::stop_source stop;
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 48;
  options.world_size = 1;
  options.connect_timeout = options.join_timeout = 15s;
  options.cancel = stop.get_token();
  const auto start = std::chrono::steady_clock::now();
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  // The scenario, not a synchronization: by now the link has been refused for 2.5 s and waits in one of its 1 s
  // pauses between attempts (20 + 40 + ... + 640 ms, then 1 s each: this one ends about 3.26 s after the start).
  std::this_thread::sleep_until(start + 2500ms);
  ASSERT_NE(joined.wait_for(0s), std::future_status::ready) << "the constructor ended before it was cancelled";
  stop.request_stop();
  const auto cancelled = std::chrono::steady_clock::now();
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready) << "the cancelled constructor went on retrying";
  const auto took = std::chrono::steady_clock::now() - cancelled;
  try {
    joined.get();
    ADD_FAILURE() << "joined without an aggregator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
  }
  EXPECT_LT(took, AtOnce(300ms)) << "the constructor returned "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms after the cancel";
}

// A worker holding the job's secret refuses a JobReady from an aggregator that never authenticated.
TEST(WorkerLifecycle, AJobReadyBeforeAuthenticationIsRefused) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 49;
  options.world_size = 1;
  options.transport = "tcp";
  options.secret = "the job's secret";
  options.connect_timeout = options.join_timeout = 10s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd = AcceptWithin(listener, 10s);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadFrame(fd));  // Hello
  const proto::ControlMessage ready = RawJobReady("tcp");
  ASSERT_TRUE(SendControl(fd, ready));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  try {
    joined.get();
    ADD_FAILURE() << "joined an unauthenticated aggregator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "UNAUTHENTICATED") << e.what();
    EXPECT_NE(std::string(e.what()).find("job 49 rank 0: aggregator 0"), std::string::npos) << e.what();
  }
  close(fd);
  close(listener);
}

// A JobReady, or another control message, that contradicts the connection fails the join naming the job, rank and
// aggregator: a transport other than the connection's, a TCP connection where shared memory was required, a
// message an aggregator never sends (Goodbye).
TEST(WorkerLifecycle, AJoinAnswerThatContradictsTheConnectionFailsTheJoin) {
  struct Case {
    std::string transport;  // the worker's
    proto::ControlMessage answer;
    std::string code, text;
  };
  const proto::ControlMessage shm_ready = RawJobReady("shm");
  const proto::ControlMessage tcp_ready = RawJobReady("tcp");
  proto::ControlMessage goodbye;
  goodbye.mutable_goodbye()->set_reason("bye");
  const std::vector<Case> cases = {
      {"tcp", shm_ready, "PROTOCOL_VIOLATION", "reports transport 'shm' but the connection is on tcp"},
      {"shm", tcp_ready, "UNAVAILABLE", "did not offer shared memory (transport \"shm\" was required)"},
      {"tcp", goodbye, "PROTOCOL_VIOLATION", "sent an unexpected control message (field"},
  };
  for (const Case& c : cases) {
    uint16_t port = 0;
    const int listener = ListenOnLoopback(&port);
    ASSERT_GE(listener, 0);
    WorkerOptions options;
    options.aggregators = {"127.0.0.1:" + std::to_string(port)};
    options.job = 57;
    options.world_size = 1;
    options.transport = c.transport;
    options.connect_timeout = options.join_timeout = 10s;
    auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
    const int fd = AcceptWithin(listener, 10s);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ReadFrame(fd));  // Hello
    ASSERT_TRUE(SendControl(fd, c.answer));
    ASSERT_EQ(joined.wait_for(10s), std::future_status::ready) << c.text;
    try {
      joined.get();
      ADD_FAILURE() << "joined; expected: " << c.text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_NE(std::string(e.what()).find("job 57 rank 0: aggregator 0 (127.0.0.1:" + std::to_string(port) + ")"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(c.text), std::string::npos) << e.what();
    }
    close(fd);
    close(listener);
  }
}

// A second JobReady after the job formed breaks the Worker: its connection is closed and the next collective fails
// saying why, instead of the duplicate being ignored.
TEST(WorkerLifecycle, ASecondJobReadyBreaksTheWorker) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(Join(OneBlockShape(58), &j));
  const proto::ControlMessage ready = RawJobReady("tcp");
  ASSERT_TRUE(SendControl(j.fd, ready));
  EXPECT_TRUE(ReadUntilClosed(j.fd)) << "the worker kept the connection";
  std::vector<float> tensor(4, 1.0f);
  try {
    j.worker->allreduce(std::span(tensor));
    ADD_FAILURE() << "the collective ran after a second JobReady";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "PROTOCOL_VIOLATION") << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 0 (127.0.0.1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sent JobReady twice"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tensor, std::vector<float>(4, 1.0f));
}

// docs/PROTOCOL.md §10.1: a worker of transport "auto" whose shared-memory offer names a socket it cannot reach (the
// aggregator runs on another host) declines on TCP, saying why, and joins on TCP.
TEST(WorkerLifecycle, AnUnreachableSharedMemoryOfferIsDeclinedAndTheJoinGoesOnOverTcp) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 59;
  options.world_size = 1;
  options.transport = "auto";
  options.connect_timeout = options.join_timeout = 10s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  const int fd = AcceptWithin(listener, 10s);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadFrame(fd));  // Hello
  ASSERT_TRUE(SendControl(fd, ShmOffer(UniqueName("nobody-listens"))));
  const std::optional<RawFrame> answer = ReadFrame(fd);
  ASSERT_TRUE(answer) << "no answer to the offer";
  Result<proto::ControlMessage> decline = DecodeControl(answer->payload);
  ASSERT_TRUE(decline.ok()) << decline.status().ToString();
  ASSERT_TRUE(decline->has_transport_decline()) << decline->ShortDebugString();
  EXPECT_FALSE(decline->transport_decline().reason().empty());
  const proto::ControlMessage ready = RawJobReady("tcp");
  ASSERT_TRUE(SendControl(fd, ready));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  std::unique_ptr<Worker> worker;
  EXPECT_NO_THROW(worker = joined.get());
  if (worker) {
    EXPECT_EQ(worker->transports(), std::vector<std::string>{"tcp"});
  }
  worker.reset();
  close(fd);
  close(listener);
}

// What a misbehaving aggregator may send during a one-block collective, after the worker's three frames.
enum class Misstep { kAcceptedOutOfOrder, kResultForABlockNeverAnnounced, kResultAfterError, kErrorOfAViolation };

class HostileCollective : public ::testing::TestWithParam<Misstep> {};

TEST_P(HostileCollective, FailsNamingTheAggregatorAndRestoresTheInput) {
  const uint64_t job = 50 + static_cast<uint64_t>(GetParam());
  Joined j;
  WorkerOptions options = OneBlockShape(job);
  options.collective_timeout = 10s;
  ASSERT_NO_FATAL_FAILURE(Join(options, &j));
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
  const FrameHeader header{FrameType::kResult, 0, 0, job, 1, 1};
  const std::array announce_reply{Entry{0, 0, 0}};
  const std::array sum{7.0f, 7.0f, 7.0f, 7.0f};
  const std::array<std::span<const std::byte>, 1> data{std::as_bytes(std::span(sum))};
  std::string code, text;
  switch (GetParam()) {
    case Misstep::kAcceptedOutOfOrder: {
      proto::ControlMessage accepted;
      accepted.mutable_collective_accepted()->set_seq(2);
      ASSERT_TRUE(SendControl(j.fd, accepted));
      code = "PROTOCOL_VIOLATION";
      text = "accepted collective 2 unexpectedly";
      break;
    }
    case Misstep::kResultForABlockNeverAnnounced: {
      ASSERT_TRUE(WriteAll(j.fd, EncodeDataFrame(header, announce_reply, {}).span()));
      const std::array stray{Entry{5, kEndOfColumn, 16}};
      ASSERT_TRUE(WriteAll(j.fd, EncodeDataFrame(header, stray, data).span()));
      code = "PROTOCOL_VIOLATION";
      text = "block 5";
      break;
    }
    case Misstep::kResultAfterError: {
      ASSERT_TRUE(WriteAll(j.fd, EncodeDataFrame(header, announce_reply, {}).span()));
      proto::ControlMessage error;
      error.mutable_error()->set_code(proto::PEER_LEFT);
      error.mutable_error()->set_message("rank 1 left");
      ASSERT_TRUE(SendControl(j.fd, error));
      const std::array result{Entry{0, kEndOfColumn, 16}};
      ASSERT_TRUE(WriteAll(j.fd, EncodeDataFrame(header, result, data).span()));
      code = "PEER_LEFT";
      text = "rank 1 left";
      break;
    }
    case Misstep::kErrorOfAViolation: {  // the aggregator's own Error: it needs no Goodbye to know
      proto::ControlMessage error;
      error.mutable_error()->set_code(proto::PROTOCOL_VIOLATION);
      error.mutable_error()->set_message("rank 0 sent block 9 twice");
      ASSERT_TRUE(SendControl(j.fd, error));
      code = "PROTOCOL_VIOLATION";
      text = "rank 0 sent block 9 twice";
      break;
    }
  }
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "the worker did not fail";
  try {
    done.get();
    ADD_FAILURE() << "the collective completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find("job " + std::to_string(job) + " rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aggregator 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  EXPECT_EQ(tensor, input);
  std::vector<float> later(4, 1.0f);
  EXPECT_THROW(j.worker->allreduce(std::span(later)), Error);  // the Worker is unusable after a failure
  EXPECT_EQ(later, std::vector<float>(4, 1.0f));
  // The aggregator that broke the protocol hears why the rank leaves (its log and the other ranks would otherwise
  // see a bare close); one that sent an Error knows already.
  std::optional<std::string> reason;
  while (std::optional<RawFrame> frame = ReadFrame(j.fd)) {
    Result<proto::ControlMessage> message = DecodeControl(frame->payload);
    if (frame->header.type == FrameType::kControl && message.ok() && message->has_goodbye()) {
      reason = message->goodbye().reason();
      break;
    }
  }
  if (code == "PROTOCOL_VIOLATION" && GetParam() != Misstep::kErrorOfAViolation) {
    ASSERT_TRUE(reason.has_value()) << "no Goodbye to the aggregator that broke the protocol";
    EXPECT_NE(reason->find(text), std::string::npos) << *reason;
  } else {
    EXPECT_FALSE(reason.has_value()) << *reason;
  }
}

INSTANTIATE_TEST_SUITE_P(WorkerLifecycle, HostileCollective,
                         ::testing::Values(Misstep::kAcceptedOutOfOrder, Misstep::kResultForABlockNeverAnnounced,
                                           Misstep::kResultAfterError, Misstep::kErrorOfAViolation));

// Each failed collective's error says which one it is unless its cause names it: an aggregator's error about
// collective 10 named "collective 1" too (a substring), so collective 1's error did not say it was collective 1.
TEST(WorkerLifecycle, AnErrorAboutCollective10DoesNotNameCollective1) {
  Joined j;
  WorkerOptions options = OneBlockShape(48);
  options.collective_timeout = 10s;
  ASSERT_NO_FATAL_FAILURE(Join(options, &j));
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f}, queued_tensor{5.0f};
  auto done = j.worker->allreduce_async(std::span(tensor));
  auto queued = j.worker->allreduce_async(std::span(queued_tensor));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
  proto::ControlMessage accepted;
  accepted.mutable_collective_accepted()->set_seq(10);
  ASSERT_TRUE(SendControl(j.fd, accepted));
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready) << "the worker did not fail";
  try {
    done.get();
    ADD_FAILURE() << "the collective completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job 48 rank 0: collective 1 (4 float32 elements): aggregator 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("accepted collective 10 unexpectedly"), std::string::npos) << e.what();
  }
  try {
    queued.get();
    ADD_FAILURE() << "the queued collective completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job 48 rank 0: collective 2 (1 float32 element), queued, not started: aggregator 0"),
              std::string::npos)
        << e.what();
  }
}

// Worker::abort fails the collective in flight at once (not at its collective timeout), restores the tensor, tells
// the aggregator why in a Goodbye, and leaves the Worker unusable. Each failed collective's error says which one it
// is (they all said the same).
TEST(WorkerLifecycle, AbortEndsTheCollectiveInFlightAtOnce) {
  Joined j;
  WorkerOptions options = OneBlockShape(47);
  options.collective_timeout = 60s;
  ASSERT_NO_FATAL_FAILURE(Join(options, &j));
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> input = tensor;
  auto done = j.worker->allreduce_async(std::span(tensor));
  std::vector<float> queued_tensor{5.0f};
  auto queued = j.worker->allreduce_async(std::span(queued_tensor));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
  j.worker->abort();
  try {
    queued.get();
    ADD_FAILURE() << "the queued collective completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job 47 rank 0: collective 2 (1 float32 element), queued, not started: aborted by the caller"),
              std::string::npos)
        << e.what();
  }
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready) << "abort did not end the collective";
  try {
    done.get();
    ADD_FAILURE() << "the collective completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
    EXPECT_NE(std::string(e.what()).find("job 47 rank 0: collective 1 (4 float32 elements): aborted by the caller (Worker::abort)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(tensor, input);
  const std::optional<RawFrame> goodbye = ReadFrame(j.fd);
  ASSERT_TRUE(goodbye) << "no Goodbye";
  Result<proto::ControlMessage> message = DecodeControl(goodbye->payload);
  ASSERT_TRUE(message.ok() && message->has_goodbye()) << message.status().ToString();
  EXPECT_NE(message->goodbye().reason().find("Worker::abort"), std::string::npos) << message->goodbye().reason();
  EXPECT_THROW(j.worker->allreduce(std::span(tensor)), Error);
}

// A Worker inherited by a child of fork() refuses collectives there (UNSUPPORTED, naming the process that made it)
// and its destructor in the child leaves the parent's connection alone. The child's allreduce waited forever (its
// timer ran on the parent's I/O thread), and its destructor hung joining a thread the child does not have.
TEST(WorkerLifecycle, AWorkerInheritedThroughForkIsLeftToTheParent) {
  Joined j;
  ASSERT_NO_FATAL_FAILURE(Join(OneBlockShape(48), &j));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 1;
    std::vector<float> tensor(4, 1.0f);
    try {
      j.worker->allreduce(std::span(tensor));
    } catch (const Error& e) {
      if (e.code() == "UNSUPPORTED" && std::string(e.what()).find("create a new Worker here") != std::string::npos) {
        status = 0;
      }
    }
    j.worker.reset();  // must return, and leave the parent's connection as it is
    _exit(status);
  }
  int status = -1;
  for (int i = 0; i < 1000 && waitpid(child, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(10ms);
  if (status == -1) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the child hung";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // The parent's Worker still runs: its collective's frames reach the aggregator.
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  auto done = j.worker->allreduce_async(std::span(tensor));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
  j.worker->abort();
  EXPECT_THROW(done.get(), Error);
}

// The header of a RESULT with more entries than the job's K (blocks per message) is refused before its payload is
// read (docs/PROTOCOL.md §3): only the header is sent, and the worker fails at once rather than at its collective
// timeout. With one block of 256 elements, 2 entries without data stay within the payload limit of one block.
TEST(WorkerLifecycle, AResultOfMoreThanKEntriesIsRefusedBeforeItsPayload) {
  Joined j;
  WorkerOptions options = OneBlockShape(46);
  options.block_size = 256;
  options.collective_timeout = 10s;
  ASSERT_NO_FATAL_FAILURE(Join(options, &j));
  std::vector<float> tensor(256, 1.0f);
  auto done = j.worker->allreduce_async(std::span(tensor));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ReadFrame(j.fd)) << "frame " << i;  // begin, announce, contribution
  std::array<std::byte, kFrameHeaderSize> header{};
  EncodeFrameHeader({FrameType::kResult, 2 * kEntrySize, 0, 46, 1, 2}, header.data());
  ASSERT_TRUE(WriteAll(j.fd, header));
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready) << "the worker waited for the payload";
  try {
    done.get();
    ADD_FAILURE() << "the collective completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "PROTOCOL_VIOLATION") << e.what();
    EXPECT_NE(std::string(e.what()).find("sent a RESULT of 2 entries, more than the job's 1 blocks per message"),
              std::string::npos)
        << e.what();
    // Named once: "aggregator 0 (...): aggregator 0 (...) sent a RESULT" before.
    const std::string what = e.what();
    EXPECT_EQ(what.find("aggregator 0"), what.rfind("aggregator 0")) << what;
  }
}

// An aggregator whose host drops the worker's SYNs (here: a listener whose accept queue is full) fails the
// constructor at the connect timeout with an error that says so. It said "cannot connect: Operation canceled", the
// text of the attempt the deadline cut off.
TEST(WorkerLifecycle, AConnectionThatIsNeverAnsweredFailsSayingSo) {
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(listen(listener, 0), 0);  // a backlog of one: once it is full, further SYNs are dropped
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)connect(c, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    fillers.push_back(c);
  }
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.job = 55;
  options.world_size = 1;
  options.connect_timeout = 1s;
  options.join_timeout = 5s;
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  try {
    joined.get();
    ADD_FAILURE() << "joined without an aggregator";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "UNAVAILABLE") << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("aggregator 0"), std::string::npos) << what;
    EXPECT_EQ(what.find("Operation canceled"), std::string::npos) << what;
    EXPECT_NE(what.find("no answer within the connect timeout"), std::string::npos) << what;
  }
  for (const int c : fillers) close(c);
  close(listener);
}

// Timeouts meant as "wait as long as it takes" (milliseconds::max()) must not overflow into deadlines in the
// past: the Worker joins, and its collective runs, as with any long timeout.
TEST(WorkerLifecycle, TheLongestTimeoutsDoNotOverflow) {
  WorkerOptions options = OneBlockShape(56);
  options.collective_timeout = std::chrono::milliseconds::max();
  uint16_t port = 0;
  const int listener = ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  options.aggregators = {"127.0.0.1:" + std::to_string(port)};
  options.world_size = 1;
  options.transport = "tcp";
  options.connect_timeout = options.join_timeout = std::chrono::milliseconds::max();
  std::stop_source stop;
  options.cancel = stop.get_token();
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  // A failed ASSERT below leaves `joined` pending, and its destructor would wait for a constructor that has no
  // deadline: this cancel, destroyed first, ends it.
  struct CancelOnExit {
    std::stop_source& stop;
    ~CancelOnExit() { stop.request_stop(); }
  } cancel_on_exit{stop};
  const int fd = AcceptWithin(listener, 10s);
  ASSERT_GE(fd, 0) << "the worker did not connect";
  ASSERT_TRUE(ReadFrame(fd));  // Hello
  const proto::ControlMessage ready = RawJobReady("tcp");
  ASSERT_TRUE(SendControl(fd, ready));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready);
  std::unique_ptr<Worker> worker;
  try {
    worker = joined.get();
  } catch (const Error& e) {
    close(fd);
    close(listener);
    FAIL() << e.what();
  }
  std::vector<float> tensor{1.0f, 2.0f, 3.0f, 4.0f};
  auto done = worker->allreduce_async(std::span(tensor));
  ASSERT_NO_FATAL_FAILURE(AnswerOneBlockPartly(fd, 56, 16));  // the whole RESULT
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  EXPECT_NO_THROW(done.get());
  EXPECT_EQ(tensor, std::vector<float>(4, 7.0f));
  worker.reset();
  close(fd);
  close(listener);
}

}  // namespace
}  // namespace sparsereduce::testing
