// sparsereduce worker API: a training process creates one Worker per job and calls allreduce() on its tensors.
//
//   sparsereduce::WorkerOptions options;
//   options.aggregators = {"10.0.0.5:19875"};
//   options.job = 7; options.rank = rank; options.world_size = 4;
//   sparsereduce::Worker worker(options);      // connects and waits until all ranks joined
//   worker.allreduce(std::span<float>(grad));   // in place, blocking; throws sparsereduce::Error
//
// Threading: a Worker owns one I/O thread. allreduce()/allreduce_async() may be called from any thread; collectives
// run one at a time in call order (every rank must call them in the same order with the same specs: threads that
// share a Worker must order their calls themselves; AllreduceOptions::key lets the aggregators catch a mix-up).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

namespace sparsereduce {

// A lossy compression stage for float32 allreduces (docs/PROTOCOL.md §11). "none" is exact; the others trade
// accuracy for bytes and keep state per tensor (see AllreduceOptions::key). Every rank must use the same codec
// and parameters for a collective.
struct CodecOptions {
  // none | fp16 | bf16 (wire types; the aggregator sums in fp32) | 3lc (ternary with error feedback, both ways) |
  // diana (unbiased ternary of the difference to a learned shift h) | topk (the largest blocks, error feedback) |
  // adaptive (top-k whose k is picked per step from the collectives' measured cost)
  std::string name = "none";
  float sparsity = 1.0f;       // 3lc: s in [1, 2); larger s, more zeros
  bool fp32_results = false;   // 3lc: the aggregators send sums in fp32 instead of ternary
  float fraction = 0.01f;      // topk: fraction of blocks sent
  float alpha = 0.0f;          // diana: step of h; 0 means 1/sqrt(block_size)
  bool l2_norm = false;        // diana: scale blocks by their 2-norm (default: the largest magnitude)
  // 3lc: one scale M for the whole tensor instead of one per block. Per block is the default: a DDP bucket mixes
  // layers of very different gradient magnitudes, and 3LC's M is per layer.
  bool tensor_scale = false;
};

// Per call.
struct AllreduceOptions {
  // Names the tensor across calls (e.g. the DDP bucket index): error feedback, top-k residuals and DIANA's h are
  // kept per key, so a tensor must keep its key from step to step, and two tensors must not share one. The
  // aggregators compare it between ranks with every codec: distinct keys per tensor turn collectives issued in
  // different orders on different ranks (threads sharing a Worker) into SPEC_MISMATCH instead of mixed sums.
  uint64_t key = 0;
  std::optional<CodecOptions> codec;  // default: WorkerOptions::codec
};

struct WorkerOptions {
  // Aggregators of the job, as HOST:PORT, DNS-NAME:PORT (e.g. StatefulSet pods,
  // "sparsereduce-aggregator-0.sparsereduce-aggregator.ns.svc.cluster.local:19875") or [IPV6]:PORT; every rank
  // must list them in the same order, each once. Empty: taken from SPARSEREDUCE_AGGREGATORS (comma-separated).
  std::vector<std::string> aggregators;
  uint64_t job = 0;          // job id shared by all ranks
  uint32_t rank = 0;         // 0 .. world_size-1
  uint32_t world_size = 1;
  // The job's shared secret, when the aggregators require authentication (docs/SECURITY.md). It never crosses the
  // wire: worker and aggregator prove knowledge of it by HMAC challenge-response. Empty: taken from
  // SPARSEREDUCE_SECRET, else from the file named by SPARSEREDUCE_SECRET_FILE, else none. From every source one
  // trailing newline is dropped, as the aggregator does with its secret files. A worker with a secret refuses
  // aggregators that cannot prove they hold the same one.
  std::string secret;
  uint32_t block_size = 256;         // elements per block
  uint32_t slots = 8;                // independent streams of blocks per aggregator connection
  // Blocks fused into one message. 128 (128 KiB frames of fp32 at B = 256) halves the CPU per byte of 32 on
  // loopback and is no slower on sparse tensors (BENCHMARKS.md); each slot's announce costs 24 bytes per column.
  uint32_t blocks_per_message = 128;
  // CONTRIBUTION messages per slot whose blocks may wait at an aggregator at once: a worker streams its blocks up
  // to this far ahead of the RESULTs (docs/PROTOCOL.md §4). The aggregator holds up to world_size x slots x window
  // messages per job. 1 was fastest on the benchmark testbed (2 and 4 slowed dense tensors, BENCHMARKS.md).
  uint32_t window = 1;
  // How each aggregator connection carries its frames: "auto" (shared memory when the aggregator offers it and
  // runs on this host, i.e. in this network namespace, else TCP), "tcp", "shm" (fail unless every aggregator is
  // reachable through shared memory) or "rdma" (every aggregator over RDMA; the device is checked when the Worker
  // is created). Empty: SPARSEREDUCE_TRANSPORT, else "auto".
  std::string transport;
  // RDMA NIC, port and RoCE GID index (-1: InfiniBand LID addressing; RoCEv2 usually 3), for transport "rdma".
  // Empty device: SPARSEREDUCE_RDMA_DEVICE, else the first device.
  std::string rdma_device;
  uint32_t rdma_port = 1;
  int32_t rdma_gid_index = -1;
  // Kernel send buffer (SO_SNDBUF) of each TCP aggregator connection, in bytes; 0: SPARSEREDUCE_TCP_SEND_BUFFER,
  // else the kernel's autotuning. The connections to the A aggregators share this host's link; with deep queues
  // on the way (the benchmarks' tbf shaping) some of them get most of the bandwidth for a while, their aggregators
  // race ahead and the others finish late. A small buffer (32 KiB: Linux doubles it and caps it at
  // net.core.wmem_max) bounds each connection's data in flight so they advance together (BENCHMARKS.md: 10 %
  // full overlap 19 % faster at 100 Mbit/s). It also caps a connection at about 2 x value per round trip:
  // keep 0 where the link's bandwidth-delay product exceeds A x 2 x value (25 Gbit/s x 100 us = 312 KB).
  uint32_t tcp_send_buffer = 0;  // at most 1 GiB (INVALID_ARGUMENT above)
  // When an allreduce fails, put the caller's input back (bit for bit) so the step can be retried with a new
  // Worker. Costs a copy of the tensor's nonzero blocks per collective. false: no copy, and after a failure the
  // tensor's blocks hold their input or their sum (part of it where a read was cut short); collectives queued
  // behind the failed one are untouched. For jobs that restart from a checkpoint anyway.
  bool restore_on_failure = true;
  // Give the core up (sched_yield) between the slots an allreduce starts (the tensor is scanned slot by slot),
  // whenever a MiB or more of all-zero blocks was scanned since the last yield. An aggregator sums a slot only
  // once every worker has announced it, so where the workers of a job share cores, a worker that scans its whole
  // tensor before the others are scheduled holds every aggregator back; yielding lets the others announce their
  // first slots early (BENCHMARKS.md: 1 % random overlap 11 % faster on the 2-core testbed). Off by default: a
  // yield hands the core to any busy thread, and next to two busy loops on 2 cores a 1 % sparse allreduce of 2
  // workers took 1.4 x as long. Dense tensors, whose scan stops at each block's first element, never yield.
  bool yield_while_scanning = false;
  // Connecting keeps retrying (the aggregator may not be up yet) until this passes; it also bounds each
  // connection's move to shared memory or RDMA. Like the other timeouts below, it must be positive, and
  // std::chrono::milliseconds::max() means no limit.
  std::chrono::milliseconds connect_timeout{30'000};
  // How long, beyond connect_timeout, to wait for the other ranks to join: the job must have formed within
  // connect_timeout + join_timeout of the constructor's start, since other ranks may still be retrying to connect.
  std::chrono::milliseconds join_timeout{60'000};
  // Ends the constructor's connect and join early: once a stop is requested (from another thread), the constructor
  // leaves the job and throws Error "ABORTED" instead of waiting out the timeouts. Only the constructor watches it;
  // a stop requested later changes nothing. (The Python binding uses it for Ctrl-C.)
  std::stop_token cancel;
  // One allreduce, from its start on the I/O thread to its last result, including the wait for ranks that call it
  // later (30 min, as torch.distributed's default: rank 0 may be writing a checkpoint). The aggregators end sooner
  // a collective whose data stops moving once every rank has started it (their --stall-timeout-ms, 30 s), and
  // TCP keepalive finds a vanished aggregator within seconds.
  std::chrono::milliseconds collective_timeout{1'800'000};
  // The codec of float32 allreduces that do not name one (int32 allreduces are always exact).
  CodecOptions codec;
  // Seeds DIANA's random rounding (with the key, the step and the rank): runs repeat exactly.
  uint64_t codec_seed = 0;
};

// Every failure of the library. what() names the job, the rank and, where one is involved, the aggregator.
class Error : public std::runtime_error {
 public:
  Error(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  // A stable name: "PEER_LEFT", "SPEC_MISMATCH", "DEADLINE_EXCEEDED", "UNAVAILABLE", "PROTOCOL_VIOLATION", ...
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// What one allreduce did, seen from this worker.
struct CollectiveStats {
  uint64_t seq = 0;
  uint64_t element_count = 0;
  uint64_t blocks = 0;
  uint64_t nonzero_blocks = 0;  // blocks this rank sent (without a codec: its nonzero blocks)
  uint64_t selected_blocks = 0;  // topk / adaptive: the k chosen for this collective
  std::string codec = "none";
  uint64_t bytes_sent = 0;      // on the wire, headers included
  uint64_t bytes_received = 0;
  double seconds = 0;           // from the start on the I/O thread to completion
};

// Checks the SPARSEREDUCE_* variables a Worker reads for the options left empty (SPARSEREDUCE_AGGREGATORS,
// SPARSEREDUCE_TRANSPORT, SPARSEREDUCE_TCP_SEND_BUFFER, SPARSEREDUCE_SECRET / SPARSEREDUCE_SECRET_FILE) as its
// constructor does, without connecting; throws the Error (INVALID_ARGUMENT, naming the variable) it would. For
// callers that must fail before a rendezvous that other ranks would wait in (the Python process group).
void CheckEnvironment();

class Worker {
 public:
  // Connects to every aggregator and joins the job; returns when all ranks have joined. Throws Error.
  explicit Worker(WorkerOptions options);
  // Says goodbye to the aggregators; fails what is still queued or in flight with ABORTED (restoring the tensors
  // with restore_on_failure) and returns once nothing reads or writes them any more. A Worker inherited by a child
  // of fork() is unusable there (allreduce throws UNSUPPORTED) and its destructor in the child does nothing: the
  // connections stay the parent's. The child still holds copies of their descriptors (Linux has no close-on-fork):
  // the parent's failures and its destructor end the connections for the aggregators anyway (shutdown, not just
  // close), but if the parent dies while such children live, the aggregators see its connections end only when the
  // children exit, or at their stall timeout.
  ~Worker();

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Sums `tensor` element-wise over all ranks, in place. Throws Error. A call refused for its own arguments
  // (INVALID_ARGUMENT: an unknown codec, a parameter out of range, more than (2^64 - 1) / 8 elements) leaves the
  // Worker usable; after any other error (RESOURCE_EXHAUSTED when the collective's state, or any other memory the
  // Worker's I/O thread needs, cannot be allocated) it is unusable (every later call throws) and a new Worker must
  // be created. Every rank must issue its calls in
  // the same order. These overloads use key 0: with a codec that keeps state per key (3lc, diana, topk,
  // adaptive), give every tensor its own key (the overloads below), or their error feedback mixes silently.
  void allreduce(std::span<float> tensor);
  void allreduce(std::span<int32_t> tensor);

  // Starts an allreduce and returns at once. The tensor must stay alive and untouched until the future is ready.
  std::future<void> allreduce_async(std::span<float> tensor);
  std::future<void> allreduce_async(std::span<int32_t> tensor);

  // With a key (and a codec other than the Worker's default). int32 sums stay exact whatever the codec, but a codec
  // that is not valid (an unknown name, a parameter out of range) is refused as for float32.
  void allreduce(std::span<float> tensor, const AllreduceOptions& options);
  std::future<void> allreduce_async(std::span<float> tensor, const AllreduceOptions& options);
  void allreduce(std::span<int32_t> tensor, const AllreduceOptions& options);
  std::future<void> allreduce_async(std::span<int32_t> tensor, const AllreduceOptions& options);

  // Statistics of the most recent completed allreduce (all zero in a child of fork(), where the Worker is unusable).
  CollectiveStats last_stats() const;

  // Fails every allreduce queued or in flight with ABORTED and says goodbye to the aggregators (the other ranks get
  // PEER_LEFT naming this one); the Worker is unusable afterwards. Returns at once; the futures become ready, the
  // tensors restored with restore_on_failure, once no write reads them any more (at most about 0.5 s). For a
  // caller that gives up, e.g. on Ctrl-C, without waiting for the collective timeout. Thread-safe, but not
  // async-signal-safe (it allocates and locks): call it from a thread that noticed the signal, not from a signal
  // handler. Does nothing in a child of fork() (see ~Worker).
  void abort();

  // The transport of each aggregator connection ("tcp", "shm" or "rdma"), in the order of options().aggregators.
  std::vector<std::string> transports() const;

  const WorkerOptions& options() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparsereduce
