// sparsereduce-perf: allreduce performance in the style of nccl-tests' all_reduce_perf, plus sparsity columns.
//
//   sparsereduce-perf --spawn 4,1 -b 4K -e 64M -f 4 --density 0.1      # one command, everything on 127.0.0.1
//   sparsereduce-perf --aggregators h1:19875,h2:19875 --job 7 --rank R --world-size 4 -b 64M -e 64M
//
// Every rank runs the same sweep; rank 0 prints the table. Per size: warm-up iterations, then timed iterations,
// each started together (a one-element allreduce serves as barrier; another one before the input is copied back, and
// one before the result is checked, so that no rank copies or checks while another still times its allreduce); an
// iteration's time is the slowest rank's, and the table shows the median over iterations.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "codec/codec_spec.h"
#include "protocol/layout.h"
#include "sparsereduce/worker.h"
#include "tools/common/cli_checks.h"
#include "tools/common/json_output.h"
#include "tools/common/local_cluster.h"
#include "tools/common/size_parse.h"
#include "tools/common/stop_signals.h"
#include "tools/common/subprocess.h"
#include "tools/common/synthetic_tensor.h"
#include "worker/src/worker_environment.h"

namespace {

namespace tools = sparsereduce::tools;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string min_bytes = "32M", max_bytes = "32M";
  double step_factor = 2;
  uint32_t iters = 20, warmup = 5;
  int check = 1;
  std::string dtype = "float";
  double density = 1.0;
  std::string overlap = "random";
  uint32_t block_size = 256, slots = 8, blocks_per_message = 128, window = 1;
  std::vector<std::string> aggregators;
  uint64_t job = 1;
  uint32_t rank = 0, world_size = 1;
  std::string spawn;
  std::string json;
  std::string aggregator_bin;
  uint64_t seed = 1;
  uint64_t timeout_ms = 120000;
  uint64_t run_timeout_ms = 0;  // --spawn: bound on the whole run; 0: none
  std::string transport;  // empty: SPARSEREDUCE_TRANSPORT, else auto
  std::string rdma_device;  // empty: SPARSEREDUCE_RDMA_DEVICE, else the first
  uint32_t rdma_port = 1;
  int32_t rdma_gid_index = -1;  // -1: InfiniBand LID addressing
  std::string tcp_send_buffer = "0";  // 0: SPARSEREDUCE_TCP_SEND_BUFFER, else the kernel's autotuning
  bool restore_on_failure = true;
  bool yield_while_scanning = false;
  sparsereduce::CodecOptions codec;
};

struct Row {
  uint64_t size, count;
  double time_us_median, time_us_min, time_us_max;
  double algbw, busbw;
  uint64_t wrong;      // summed over the ranks (through the system under test)
  uint64_t own_wrong;  // this rank's own count, worst iteration
  double density, union_density;  // measured: rank 0's fraction of nonzero blocks; all ranks' union
  uint64_t sent, received;  // bytes framed: the largest over ranks of a rank's median over the iterations
};

tools::Overlap ParseOverlap(const std::string& s) {
  if (s == "full") return tools::Overlap::kFull;
  if (s == "disjoint") return tools::Overlap::kDisjoint;
  return tools::Overlap::kRandom;
}

// The tool's own bookkeeping (the barrier before each iteration, gathering the ranks' times) must stay exact
// whatever codec is measured: times in microseconds overflow fp16, and 3LC would round them away.
const sparsereduce::AllreduceOptions kExact{~uint64_t{0}, sparsereduce::CodecOptions{}};

// Lossy codecs are not checked bit for bit: their results differ from the exact sum by design.
bool ChecksBitExactly(const Config& c) { return c.check && c.codec.name == "none"; }

uint64_t ElementBytes(const Config& c) { return c.dtype == "int32" ? sizeof(int32_t) : sizeof(float); }

tools::SyntheticSpec Spec(const Config& c, uint64_t count, uint64_t seed) {
  return tools::SyntheticSpec{count, c.block_size, c.density, ParseOverlap(c.overlap), c.world_size, seed};
}

// The fraction of nonzero blocks per rank the tensors have: --density, except that disjoint overlap caps it at 1/W.
double UsedDensity(const Config& c) { return tools::RankDensity(Spec(c, 0, 0)); }

// The codec of the run, as the Worker builds it from CodecOptions (only the named codec's fields count).
sparsereduce::Result<sparsereduce::CodecSpec> RunCodec(const Config& c) {
  sparsereduce::Result<sparsereduce::Codec> codec = sparsereduce::ParseCodec(c.codec.name);
  if (!codec.ok()) return codec.status();
  return sparsereduce::WithoutUnusedFields(sparsereduce::CodecSpec{
      *codec, 0, c.codec.sparsity, c.codec.fp32_results, c.codec.fraction, c.codec.alpha, c.codec.l2_norm,
      c.codec.tensor_scale});
}

// The option that sets the named codec's parameter, for messages: "--codec topk --fraction 0".
std::string CodecOptionText(const Config& c) {
  std::ostringstream text;
  text << "--codec " << c.codec.name;
  if (c.codec.name == "3lc") text << " --sparsity " << c.codec.sparsity;
  if (c.codec.name == "topk") text << " --fraction " << c.codec.fraction;
  if (c.codec.name == "diana") text << " --alpha " << c.codec.alpha;
  return text.str();
}

// Ranks and aggregators of --spawn W[,A]: W up to the aggregators' default --max-world-size, A up to 256.
constexpr uint32_t kMaxSpawnRanks = 4096, kMaxSpawnAggregators = 256;

std::optional<std::pair<uint32_t, uint32_t>> ParseSpawn(const std::string& text) {
  static const std::regex kForm("([0-9]{1,9})(?:,([0-9]{1,9}))?");
  std::smatch m;
  if (!std::regex_match(text, m, kForm)) return std::nullopt;
  const auto workers = static_cast<uint32_t>(std::stoul(m[1]));
  const auto aggregators = m[2].matched ? static_cast<uint32_t>(std::stoul(m[2])) : 1u;
  if (workers < 1 || workers > kMaxSpawnRanks || aggregators < 1 || aggregators > kMaxSpawnAggregators) {
    return std::nullopt;
  }
  return std::pair{workers, aggregators};
}

// The largest -n and -w: a million iterations per size is more than any measurement needs (nccl-tests runs 20).
// (-n 4294967295 failed every rank with a bad_alloc, and -w 4294967290 wrapped warm-ups plus -n to 14 iterations.)
constexpr uint32_t kMaxIterations = 1'000'000;
// The ranks' times each rank gathers: at most 1 GiB (W x -n floats; a bad_alloc said "out of memory at 4096 bytes").
constexpr uint64_t kMaxTimesBytes = uint64_t{1} << 30;
// --timeout-ms and --run-timeout-ms: at most tools::kMaxTimeoutMs (beyond it every rank's Worker refused the
// negative milliseconds after the aggregators and ranks had started).
using tools::kMaxTimeoutMs;

// The sparsereduce-aggregator that --spawn runs: --aggregator-bin, else the one next to this binary or in the build
// tree.
std::string AggregatorBinary(const Config& c) {
  return c.aggregator_bin.empty() ? tools::FindToolBinary("sparsereduce-aggregator", "aggregator") : c.aggregator_bin;
}

// Why `path` cannot be run as a program; empty when it can.
std::string WhyNotExecutable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (::access(path.c_str(), X_OK) != 0) return std::strerror(errno);
  return {};
}

// Usage errors a run would only meet later (or never: -b 0 loops forever, -n 0 reads past the times, a block
// size of 0 divides by zero), among them the worker settings the library refuses when a rank creates its Worker
// (checked here by the library's own checks, so that they fail once, before aggregators and ranks start);
// prints each and returns false if there is one. `spawning`: --spawn sets the aggregators, rank and world size.
bool ValidateOptions(const Config& c, bool spawning) {
  bool ok = true;
  auto fail = [&ok](const std::string& message) {
    std::fprintf(stderr, "sparsereduce-perf: %s\n", message.c_str());
    ok = false;
  };
  const uint64_t elem = ElementBytes(c);
  auto min_bytes = tools::ParseByteSize(c.min_bytes);
  auto max_bytes = tools::ParseByteSize(c.max_bytes);
  if (!min_bytes.ok()) fail("-b: " + min_bytes.status().message());
  if (!max_bytes.ok()) fail("-e: " + max_bytes.status().message());
  if (min_bytes.ok() && *min_bytes < elem) {
    fail("-b " + c.min_bytes + ": the smallest size must hold at least one element (" + std::to_string(elem) +
         " bytes of " + c.dtype + ")");
  }
  if (min_bytes.ok() && max_bytes.ok() && *min_bytes > *max_bytes) fail("need -b <= -e");
  if (!(c.step_factor > 1) || !std::isfinite(c.step_factor)) fail("-f must be a finite factor above 1");
  if (c.iters == 0) fail("-n must be at least 1 (the table shows the median of the timed iterations)");
  if (c.iters > kMaxIterations) {
    fail("-n " + std::to_string(c.iters) + ": at most " + std::to_string(kMaxIterations) +
         " timed iterations per size");
  }
  if (c.warmup > kMaxIterations) {
    fail("-w " + std::to_string(c.warmup) + ": at most " + std::to_string(kMaxIterations) +
         " warm-up iterations per size");
  }
  if (c.timeout_ms == 0) fail("--timeout-ms must be at least 1");
  if (c.timeout_ms > kMaxTimeoutMs) {
    fail("--timeout-ms " + std::to_string(c.timeout_ms) + ": takes 1 to " + std::to_string(kMaxTimeoutMs) +
         " ms (30 days)");
  }
  if (c.run_timeout_ms > kMaxTimeoutMs) {
    fail("--run-timeout-ms " + std::to_string(c.run_timeout_ms) + ": takes 0 (no limit) to " +
         std::to_string(kMaxTimeoutMs) + " ms (30 days)");
  }
  const std::optional<std::pair<uint32_t, uint32_t>> spawn_counts =
      spawning ? ParseSpawn(c.spawn) : std::optional<std::pair<uint32_t, uint32_t>>();
  if (spawning && !spawn_counts) {
    fail("--spawn " + c.spawn + ": takes W or W,A, with 1 <= W <= " + std::to_string(kMaxSpawnRanks) +
         " ranks and 1 <= A <= " + std::to_string(kMaxSpawnAggregators) + " aggregators");
  }
  if (const uint64_t ranks = spawning ? (spawn_counts ? spawn_counts->first : 0) : c.world_size;
      c.iters <= kMaxIterations && ranks * c.iters * sizeof(float) > kMaxTimesBytes) {
    fail("-n " + std::to_string(c.iters) + " with " + std::to_string(ranks) + " ranks: every rank gathers the " +
         std::to_string(ranks) + " x " + std::to_string(c.iters) + " iteration times, more than 1 GiB; give fewer "
         "iterations");
  }
  if (spawning) {
    // Found here, before anything starts (a path that could not be run failed the run with exit code 1 once the
    // --json file had been truncated).
    if (const std::string why = WhyNotExecutable(AggregatorBinary(c)); !why.empty()) {
      fail((c.aggregator_bin.empty() ? "sparsereduce-aggregator " : "--aggregator-bin ") + AggregatorBinary(c) +
           ": cannot be run (" + why + "); give the path of sparsereduce-aggregator with --aggregator-bin");
    }
  }
  if (c.dtype == "int32" && c.codec.name != "none") {
    fail("--codec " + c.codec.name + " compresses float tensors only; -d int32 tensors are always sent exactly");
  }
  // Block size, world size and density, as the synthetic tensors need them.
  if (const sparsereduce::Status st = tools::ValidateSpec(Spec(c, 0, 0)); !st.ok()) fail(st.message());
  // The worker's settings, as the Worker checks them (worker.cc: ValidateShape, ValidateSpec, ValidateFrameSize,
  // ValidateCodec, CheckAggregatorAddresses, the TCP send buffer's limit), one option at a time so that each
  // message names its option.
  struct ShapeOption {
    const char* name;
    uint32_t Config::*value;
    uint32_t sparsereduce::JobShape::*field;
  };
  for (const ShapeOption& o : {ShapeOption{"--slots", &Config::slots, &sparsereduce::JobShape::slots},
                               ShapeOption{"--blocks-per-message", &Config::blocks_per_message,
                                           &sparsereduce::JobShape::blocks_per_message},
                               ShapeOption{"--window", &Config::window, &sparsereduce::JobShape::window}}) {
    sparsereduce::JobShape shape;  // every field 1 but this option's
    shape.*o.field = c.*o.value;
    if (const sparsereduce::Status st = sparsereduce::ValidateShape(shape); !st.ok()) {
      fail(std::string(o.name) + " " + std::to_string(c.*o.value) + ": " + st.message());
    }
  }
  if (c.block_size != 0) {  // 0: said above
    sparsereduce::JobShape shape;
    shape.blocks_per_message = c.blocks_per_message;
    for (sparsereduce::DType dtype : {sparsereduce::DType::kFloat32, sparsereduce::DType::kInt32}) {
      const sparsereduce::CollectiveSpec spec{0, dtype, sparsereduce::ReduceOp::kSum, c.block_size};
      if (const sparsereduce::Status st = sparsereduce::ValidateSpec(spec); !st.ok()) {
        fail("--block-size " + std::to_string(c.block_size) + ": " + st.message());
        break;
      }
      if (c.blocks_per_message == 0) break;  // said above
      if (const sparsereduce::Status st = sparsereduce::ValidateFrameSize(shape, spec); !st.ok()) {
        fail("--blocks-per-message " + std::to_string(c.blocks_per_message) + " with --block-size " +
             std::to_string(c.block_size) + ": " + st.message());
        break;
      }
    }
  }
  if (auto codec = RunCodec(c); !codec.ok()) {
    fail("--codec " + c.codec.name + ": " + codec.status().message());
  } else if (const sparsereduce::Status st = sparsereduce::ValidateCodec(*codec); !st.ok()) {
    fail(CodecOptionText(c) + ": " + st.message());
  }
  auto tcp_send_buffer = tools::ParseByteSize(c.tcp_send_buffer);
  if (!tcp_send_buffer.ok() || *tcp_send_buffer > sparsereduce::worker::kMaxTcpSendBuffer) {
    fail("--tcp-send-buffer " + c.tcp_send_buffer + ": takes a byte count (K/M/G suffixes) from 0 to " +
         std::to_string(sparsereduce::worker::kMaxTcpSendBuffer));
  }
  if (!spawning) {
    if (const sparsereduce::Status st = sparsereduce::worker::CheckAggregatorAddresses(c.aggregators); !st.ok()) {
      fail("--aggregators: " + st.message());
    }
    if (c.world_size != 0 && c.rank >= c.world_size) {
      fail("--rank " + std::to_string(c.rank) + " is out of range for --world-size " + std::to_string(c.world_size) +
           " (ranks are 0 to " + std::to_string(c.world_size - 1) + ")");
    }
  }
  return ok;
}

// uint64 values through exact int32 allreduces: as 12-bit pieces, whose int32 sums cannot overflow for up to 2^19
// ranks.
constexpr int kPieceBits = 12, kPieces = (64 + kPieceBits - 1) / kPieceBits;

void SplitIntoPieces(uint64_t value, std::span<int32_t> pieces) {
  for (int k = 0; k < kPieces; ++k) {
    pieces[k] = static_cast<int32_t>((value >> (k * kPieceBits)) & ((1u << kPieceBits) - 1));
  }
}

uint64_t JoinPieces(std::span<const int32_t> pieces) {
  uint64_t value = 0;
  for (int k = 0; k < kPieces; ++k) value += static_cast<uint64_t>(pieces[k]) << (k * kPieceBits);
  return value;
}

// The sum of every rank's `value`, exact.
uint64_t SumOverRanks(sparsereduce::Worker& worker, uint64_t value) {
  std::vector<int32_t> pieces(kPieces);
  SplitIntoPieces(value, pieces);
  worker.allreduce(std::span(pieces), kExact);
  return JoinPieces(pieces);
}

// The largest of the ranks' values (each rank fills its own place, zeros elsewhere; exact).
uint64_t MaxOverRanks(sparsereduce::Worker& worker, uint32_t rank, uint32_t world_size, uint64_t value) {
  std::vector<int32_t> pieces(size_t{world_size} * kPieces, 0);
  SplitIntoPieces(value, std::span(pieces).subspan(size_t{rank} * kPieces, kPieces));
  worker.allreduce(std::span(pieces), kExact);
  uint64_t largest = 0;
  for (uint32_t r = 0; r < world_size; ++r) {
    largest = std::max(largest, JoinPieces(std::span(pieces).subspan(size_t{r} * kPieces, kPieces)));
  }
  return largest;
}

// The median (the lower of the two middle values for an even count); 0 for none.
uint64_t Median(std::vector<uint64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

template <typename T>
Row RunSize(sparsereduce::Worker& worker, const Config& c, uint64_t bytes) {
  const uint64_t count = bytes / sizeof(T);
  const tools::SyntheticSpec spec = Spec(c, count, c.seed + bytes);
  std::vector<T> input(count), work(count), reference;
  tools::FillTensor(spec, c.rank, std::span<T>(input));
  const bool exact_check = ChecksBitExactly(c);
  if (exact_check) {
    if constexpr (std::is_same_v<T, float>) {
      reference = tools::ReferenceSumFloat(spec);
    } else {
      reference = tools::ReferenceSumInt32(spec);
    }
  }
  std::vector<float> token(1);
  std::vector<float> times(size_t{c.world_size} * c.iters, 0.0f);
  uint64_t wrong = 0;
  std::vector<uint64_t> sent, received;  // per timed iteration: with a codec they change from one to the next
  // 64-bit: -w 4294967290 -n 20 wrapped to 14 iterations, none of them timed (a row of time 0 and exit code 0).
  for (uint64_t it = 0; it < uint64_t{c.warmup} + c.iters; ++it) {
    // Barriers on both sides of the input copy, and before the check: no rank copies or checks while another is
    // still timing its allreduce, so a timed window holds the collective alone and not other ranks' 64 MiB copies.
    worker.allreduce(std::span(token), kExact);
    std::memcpy(work.data(), input.data(), count * sizeof(T));
    worker.allreduce(std::span(token), kExact);
    const auto start = Clock::now();
    worker.allreduce(std::span<T>(work));
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (it >= c.warmup) {
      const auto stats = worker.last_stats();
      sent.push_back(stats.bytes_sent);
      received.push_back(stats.bytes_received);
      times[size_t{c.rank} * c.iters + (it - c.warmup)] = static_cast<float>(us);
    }
    if (exact_check) {  // the warm-ups too: a wrong sum is wrong whenever it comes
      worker.allreduce(std::span(token), kExact);  // no rank checks while another still times its allreduce
      uint64_t w = 0;
      for (uint64_t i = 0; i < count; ++i) w += std::memcmp(&work[i], &reference[i], sizeof(T)) != 0;
      wrong = std::max(wrong, w);
    }
  }
  // Everyone learns every rank's times (each rank fills its own row) and the total #wrong. The total comes through
  // the system under test, so each rank also keeps its own count (RunRank fails the rank on either).
  worker.allreduce(std::span(times), kExact);
  const uint64_t wrong_total = SumOverRanks(worker, wrong);
  std::vector<double> per_iter(c.iters, 0);
  for (uint32_t it = 0; it < c.iters; ++it) {
    for (uint32_t r = 0; r < c.world_size; ++r) {
      per_iter[it] = std::max<double>(per_iter[it], times[size_t{r} * c.iters + it]);
    }
  }
  std::sort(per_iter.begin(), per_iter.end());
  Row row{};
  row.size = bytes;
  row.count = count;
  // The mean of the two middle values for an even count, as the Gloo and torch baselines take it.
  const size_t middle = per_iter.size() / 2;
  row.time_us_median = per_iter.size() % 2 ? per_iter[middle] : (per_iter[middle - 1] + per_iter[middle]) / 2;
  row.time_us_min = per_iter.front();
  row.time_us_max = per_iter.back();
  row.algbw = row.time_us_median > 0 ? static_cast<double>(bytes) / 1e9 / (row.time_us_median / 1e6) : 0;
  row.busbw = row.algbw * 2.0 * (c.world_size - 1) / c.world_size;
  row.wrong = wrong_total;
  row.own_wrong = wrong;
  row.density = tools::BlockDensity(spec, c.rank);
  row.union_density = tools::UnionDensity(spec);
  // The busiest worker's link bounds the collective: each rank's median over the iterations, the largest over ranks.
  row.sent = MaxOverRanks(worker, c.rank, c.world_size, Median(sent));
  row.received = MaxOverRanks(worker, c.rank, c.world_size, Median(received));
  return row;
}

void PrintHeader(const Config& c, const std::vector<std::string>& transports, uint32_t tcp_send_buffer) {
  std::string used;
  for (const std::string& t : transports) used += (used.empty() ? "" : ",") + t;
  std::printf(
      "# sparsereduce-perf: %u ranks, %zu aggregators, %s, density %g, overlap %s, block %u, slots %u, "
      "blocks/message %u, window %u, rank 0 transports %s, codec %s\n",
      c.world_size, c.aggregators.size(), c.dtype.c_str(), UsedDensity(c), c.overlap.c_str(), c.block_size, c.slots,
      c.blocks_per_message, c.window, used.c_str(), c.codec.name.c_str());
  if (UsedDensity(c) != c.density) {
    std::printf("# density %g requested; disjoint overlap gives each rank at most 1/%u of the blocks, so %g is used\n",
                c.density, c.world_size, UsedDensity(c));
  }
  if (ChecksBitExactly(c) && c.world_size == 1) {
    std::printf("# check: with 1 rank the sum is the rank's own input, so #wrong 0 does not show that anything was "
                "summed\n");
    std::fprintf(stderr, "sparsereduce-perf: warning: the check is trivial with world size 1 (the result is the "
                 "input)\n");
  }
  if (tcp_send_buffer != 0) std::printf("# tcp send buffer %u bytes per aggregator connection\n", tcp_send_buffer);
  if (!c.restore_on_failure) std::printf("# restore on failure off: no copy of the input's nonzero blocks\n");
  if (c.yield_while_scanning) {
    std::printf("# yield while scanning: a sched_yield between slots, per MiB of zero blocks scanned\n");
  }
  std::printf("# time: median over %u iterations of the slowest rank; GB = 1e9 B; busbw = algbw*2(n-1)/n; "
              "sent/recv: bytes framed, the largest over ranks of a rank's median over the iterations\n", c.iters);
  std::printf("#%11s %12s %6s %6s %11s %12s %12s %7s %8s %7s %12s %12s\n", "size", "count", "type", "redop",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "density", "union", "sent(B)", "recv(B)");
  std::fflush(stdout);
}

void PrintRow(const Config& c, const Row& r) {
  if (ChecksBitExactly(c) && r.union_density == 0) {
    // Before the row, so that the row stays the last line (scripts take it with tail -1).
    std::printf("# check: at %llu bytes every block is zero on every rank, so #wrong 0 does not show that anything "
                "was summed\n", static_cast<unsigned long long>(r.size));
    std::fprintf(stderr, "sparsereduce-perf: warning: the check is trivial at %llu bytes (the reference is all "
                 "zeros)\n", static_cast<unsigned long long>(r.size));
  }
  const std::string wrong = ChecksBitExactly(c) ? std::to_string(r.wrong) : "N/A";
  std::printf(" %11llu %12llu %6s %6s %11.1f %12.2f %12.2f %7s %8.4f %7.4f %12llu %12llu\n",
              static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.count), c.dtype.c_str(),
              "sum", r.time_us_median, r.algbw, r.busbw, wrong.c_str(), r.density, r.union_density,
              static_cast<unsigned long long>(r.sent), static_cast<unsigned long long>(r.received));
  std::fflush(stdout);
}

// A JSON number with every digit the double has (the shortest text that reads back as the same double): ostream's
// default 6 significant digits turned a time of 3472312.5 us into 3.47231e+06. null where JSON has no number.
std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return ec == std::errc() ? std::string(text, end) : "null";
}

// The --json document of what was measured so far ("complete": false until the sweep has ended well).
// `tcp_send_buffer` is the value in effect (the flag, else the environment).
std::string JsonText(const Config& c, uint32_t tcp_send_buffer, const std::vector<std::string>& transports,
                     const std::vector<Row>& rows, bool complete) {
  std::ostringstream out;
  std::string used;
  for (const std::string& t : transports) used += std::string(used.empty() ? "" : ",") + "\"" + t + "\"";
  out << "{\"tool\":\"sparsereduce\",\"world_size\":" << c.world_size << ",\"aggregators\":" << c.aggregators.size()
      << ",\"dtype\":\"" << c.dtype << "\",\"density\":" << JsonNumber(UsedDensity(c))
      << ",\"requested_density\":" << JsonNumber(c.density)
      << ",\"overlap\":\"" << c.overlap << "\",\"block_size\":" << c.block_size << ",\"codec\":\"" << c.codec.name
      << "\",\"slots\":" << c.slots << ",\"blocks_per_message\":" << c.blocks_per_message << ",\"window\":" << c.window
      << ",\"tcp_send_buffer\":" << tcp_send_buffer
      << ",\"restore_on_failure\":" << (c.restore_on_failure ? "true" : "false")
      << ",\"yield_while_scanning\":" << (c.yield_while_scanning ? "true" : "false") << ",\"iterations\":" << c.iters
      << ",\"warmup_iterations\":" << c.warmup << ",\"check\":" << (ChecksBitExactly(c) ? "true" : "false")
      << ",\"seed\":" << c.seed << ",\"job\":" << c.job << ",\"transports\":[" << used << "]"
      << ",\"complete\":" << (complete ? "true" : "false") << ",\"results\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? "," : "") << "{\"size\":" << r.size << ",\"count\":" << r.count
        << ",\"time_us_median\":" << JsonNumber(r.time_us_median) << ",\"time_us_min\":" << JsonNumber(r.time_us_min)
        << ",\"time_us_max\":" << JsonNumber(r.time_us_max) << ",\"algbw\":" << JsonNumber(r.algbw)
        << ",\"busbw\":" << JsonNumber(r.busbw)
        << ",\"wrong\":" << (ChecksBitExactly(c) ? std::to_string(r.wrong) : "null")
        << ",\"density\":" << JsonNumber(r.density) << ",\"union_density\":" << JsonNumber(r.union_density)
        << ",\"bytes_sent\":" << r.sent
        << ",\"bytes_received\":" << r.received << "}";
  }
  out << "]}\n";
  return out.str();
}

// The sizes of the sweep: -b·f^k (k = 0, 1, ...) rounded down to whole elements, up to -e; a step that rounds down
// to the size before it is skipped (-b 4 -f 1.5: 4, 6 -> 4, 9 -> 8, 13.5 -> 12). Such steps are skipped in one jump,
// not one at a time: with -f 1.000000000001 there were 7·10^11 of them between 4 and 8 bytes, and the tool spun.
class SizeSweep {
 public:
  SizeSweep(uint64_t min_bytes, uint64_t max_bytes, double factor, uint64_t element_bytes)
      : size_(static_cast<double>(min_bytes)),
        limit_(static_cast<double>(max_bytes) * 1.0000001),  // -b·f^k may miss -e by a rounding error
        max_bytes_(max_bytes),
        factor_(factor),
        element_bytes_(element_bytes) {}

  // The next size, or nullopt once the sweep has passed -e.
  std::optional<uint64_t> Next() {
    if (!(size_ <= limit_)) return std::nullopt;
    const uint64_t whole = size_ >= static_cast<double>(max_bytes_) ? max_bytes_ : static_cast<uint64_t>(size_);
    const uint64_t bytes = whole / element_bytes_ * element_bytes_;
    if (bytes <= previous_) return std::nullopt;  // only where -e capped the size: the last one was -e's
    previous_ = bytes;
    // The first step that rounds down to more than `bytes`: at least bytes + one element.
    const double above = static_cast<double>(bytes) + static_cast<double>(element_bytes_);
    size_ *= factor_;
    if (size_ < above) {
      const double steps = std::ceil(std::log(above / size_) / std::log1p(factor_ - 1));
      size_ = std::max(size_ * std::pow(factor_, steps), above);  // max: pow's rounding must not fall short
    }
    return bytes;
  }

 private:
  double size_;
  const double limit_;
  const uint64_t max_bytes_;
  const double factor_;
  const uint64_t element_bytes_;
  uint64_t previous_ = 0;
};

int RunRank(const Config& c) {  // c has passed ValidateOptions
  auto min_bytes = tools::ParseByteSize(c.min_bytes);
  auto max_bytes = tools::ParseByteSize(c.max_bytes);
  auto tcp_send_buffer = tools::ParseByteSize(c.tcp_send_buffer);  // at most worker::kMaxTcpSendBuffer
  sparsereduce::WorkerOptions options;
  options.aggregators = c.aggregators;
  options.job = c.job;
  options.rank = c.rank;
  options.world_size = c.world_size;
  options.block_size = c.block_size;
  options.slots = c.slots;
  options.blocks_per_message = c.blocks_per_message;
  options.window = c.window;
  options.transport = c.transport;
  options.rdma_device = c.rdma_device;
  options.rdma_port = c.rdma_port;
  options.rdma_gid_index = c.rdma_gid_index;
  options.tcp_send_buffer = static_cast<uint32_t>(*tcp_send_buffer);
  options.restore_on_failure = c.restore_on_failure;
  options.yield_while_scanning = c.yield_while_scanning;
  options.codec = c.codec;
  options.connect_timeout = options.join_timeout = options.collective_timeout =
      std::chrono::milliseconds(c.timeout_ms);
  const bool writes_json = c.rank == 0 && !c.json.empty();
  if (writes_json) {
    // Checked first, left as it is (a reader never sees it empty); the JsonRewriter below rewrites it as rows come.
    if (const sparsereduce::Status st = tools::CheckJsonOutput(c.json); !st.ok()) {
      std::fprintf(stderr, "sparsereduce-perf: %s\n", st.message().c_str());
      return 2;
    }
  }
  std::vector<Row> rows;
  std::vector<std::string> transports;
  uint32_t tcp_send_buffer_in_effect = options.tcp_send_buffer;
  bool any_wrong = false;
  tools::JsonRewriter json("sparsereduce-perf", writes_json ? c.json : "");
  const auto write_json = [&](bool complete) {
    json.Write(JsonText(c, tcp_send_buffer_in_effect, transports, rows, complete));
  };
  int rc = 0;
  uint64_t bytes = 0;  // the size being run
  try {
    sparsereduce::Worker worker(options);
    transports = worker.transports();
    tcp_send_buffer_in_effect = worker.options().tcp_send_buffer;
    if (c.rank == 0) PrintHeader(c, transports, tcp_send_buffer_in_effect);
    write_json(false);
    SizeSweep sweep(*min_bytes, *max_bytes, c.step_factor, ElementBytes(c));
    for (std::optional<uint64_t> size = sweep.Next(); size; size = sweep.Next()) {
      bytes = *size;
      Row row = c.dtype == "int32" ? RunSize<int32_t>(worker, c, bytes) : RunSize<float>(worker, c, bytes);
      if (row.own_wrong != 0) {
        std::fprintf(stderr, "sparsereduce-perf: rank %u: %llu elements differ from the reference at %llu bytes\n",
                     c.rank, static_cast<unsigned long long>(row.own_wrong), static_cast<unsigned long long>(bytes));
      }
      // A rank's own count decides for it too: the sum of the counts travels through the system under test.
      any_wrong = any_wrong || (ChecksBitExactly(c) && (row.own_wrong != 0 || row.wrong != 0));
      if (c.rank == 0) PrintRow(c, row);
      rows.push_back(row);
      write_json(false);
    }
  } catch (const sparsereduce::Error& e) {
    std::fprintf(stderr, "sparsereduce-perf: %s\n", e.what());
    rc = 1;
  } catch (const std::bad_alloc& e) {
    // A size too large for this host's memory (each rank holds the input, a working copy and, with -c 1, the
    // reference of that size): a failed run, not a crash of every rank.
    std::fprintf(stderr, "sparsereduce-perf: rank %u: out of memory at %llu bytes (each rank holds %s of that size): "
                 "%s\n", c.rank, static_cast<unsigned long long>(bytes),
                 ChecksBitExactly(c) ? "the input, a working copy and the reference" : "the input and a working copy",
                 e.what());
    rc = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsereduce-perf: rank %u at %llu bytes: %s\n", c.rank,
                 static_cast<unsigned long long>(bytes), e.what());
    rc = 1;
  }
  write_json(rc == 0);
  if (json.failed()) rc = rc ? rc : 1;
  return rc ? rc : any_wrong ? 3 : 0;
}

// A wait of `ms` milliseconds for the spawner, at most a year (a deadline of now + ~0 ms overflowed: no limit).
constexpr std::chrono::milliseconds kAYear = std::chrono::hours(24 * 365);
std::chrono::milliseconds AtMostAYear(uint64_t ms) {
  return ms >= static_cast<uint64_t>(kAYear.count()) ? kAYear : std::chrono::milliseconds(ms);
}

// Options of the spawner alone, which a rank refuses (they need --spawn).
constexpr const char* kSpawnerOptions[] = {"--spawn", "--run-timeout-ms", "--aggregator-bin"};

int Spawn(Config c, char** argv, int argc) {  // c has passed ValidateOptions
  const auto [workers, aggregators] = *ParseSpawn(c.spawn);
  if (!c.json.empty()) {
    // Checked without truncating it, then a whole document of no rows, "complete": false, put in its place (rank 0
    // rewrites it as rows come): a run that fails before rank 0 writes (an aggregator or a rank that cannot start,
    // Ctrl-C while they start) leaves that, as a run without --spawn does. The check truncated the file, which such
    // a run left empty.
    if (const sparsereduce::Status st = tools::CheckJsonOutput(c.json); !st.ok()) {
      std::fprintf(stderr, "sparsereduce-perf: %s\n", st.message().c_str());
      return 2;
    }
    Config shown = c;  // the run's world, as rank 0 writes it
    shown.world_size = workers;
    shown.aggregators.assign(aggregators, std::string());
    auto tcp_send_buffer = tools::ParseByteSize(c.tcp_send_buffer);  // at most worker::kMaxTcpSendBuffer
    tools::JsonRewriter json("sparsereduce-perf", c.json);
    json.Write(JsonText(shown, static_cast<uint32_t>(*tcp_send_buffer), {}, {}, false));
    if (json.failed()) return 2;
  }
  tools::StopSignals signals("sparsereduce-perf");  // stops the ranks on SIGINT, SIGTERM or SIGHUP
  const auto stopped = [](int sig) {
    std::fprintf(stderr, "sparsereduce-perf: stopped by signal %d (%s): ranks and aggregators stopped\n", sig,
                 strsignal(sig));
    return 128 + sig;
  };
  auto cluster = tools::LocalAggregators::Start(AggregatorBinary(c), aggregators);
  if (!cluster.ok()) {
    // A Ctrl-C reaches the aggregators too (the terminal signals the whole process group): one that it killed
    // while starting is a stopped run, not a failed one ("aggregator 0 did not start: ... killed by signal 2").
    if (const int sig = signals.caught()) return stopped(sig);
    std::fprintf(stderr, "sparsereduce-perf: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  // The same command line minus the spawner's own options, plus the rank's identity.
  std::vector<std::string> base = {std::filesystem::canonical("/proc/self/exe").string()};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool spawners = false;
    for (const std::string option : kSpawnerOptions) {
      if (a == option) ++i;  // and its value
      spawners = spawners || a == option || a.rfind(option + "=", 0) == 0;
    }
    if (!spawners) base.push_back(a);
  }
  std::vector<std::unique_ptr<tools::Subprocess>> ranks;
  for (uint32_t r = 0; r < workers; ++r) {
    auto args = base;
    for (const std::string& extra : {std::string("--aggregators"), (*cluster)->AddressList(), std::string("--rank"),
                                     std::to_string(r), std::string("--world-size"), std::to_string(workers)}) {
      args.push_back(extra);
    }
    auto p = tools::Subprocess::Spawn(args, r == 0);
    if (!p.ok()) {
      if (const int sig = signals.caught()) return stopped(sig);
      std::fprintf(stderr, "sparsereduce-perf: %s\n", p.status().ToString().c_str());
      return 1;
    }
    ranks.push_back(std::move(*p));
    if (!signals.Track(ranks.back()->pid())) break;
  }
  // A closed stdout (`| head`) must not kill the tool with SIGPIPE, which left the aggregators' temporary directory
  // behind: the write fails with EPIPE instead, and the run is stopped as by a stop signal. Ignored only now that
  // every child has started (an ignored signal stays ignored across exec).
  std::signal(SIGPIPE, SIG_IGN);
  // Rank 0's table streams through as it is printed (a long sweep shows its rows as they come, and a run cut off
  // by the deadline keeps the rows it had).
  int rc = 0;
  int output_errno = 0;  // writing stdout failed: the run was stopped
  const std::chrono::milliseconds run_timeout = c.run_timeout_ms ? AtMostAYear(c.run_timeout_ms) : kAYear;
  auto out = ranks[0]->ReadStdout(run_timeout, [&](std::string_view chunk) {
    if (output_errno) return;  // the rest until rank 0 ends
    errno = 0;
    if (std::fwrite(chunk.data(), 1, chunk.size(), stdout) != chunk.size() || std::fflush(stdout) != 0) {
      output_errno = errno ? errno : EIO;
      for (auto& rank : ranks) rank->Signal(SIGTERM);
    }
  });
  if (!out.ok()) {
    std::fprintf(stderr, "sparsereduce-perf: rank 0's output: %s (--run-timeout-ms %llu); stopping the ranks\n",
                 out.status().ToString().c_str(), static_cast<unsigned long long>(c.run_timeout_ms));
    for (auto& rank : ranks) rank->Signal(SIGTERM);
    rc = 1;
  }
  bool stopped_after_rank0 = false;
  for (uint32_t r = 0; r < ranks.size(); ++r) {
    auto status = ranks[r]->Wait(AtMostAYear(c.timeout_ms));
    const bool finished = status.ok() && WIFEXITED(*status) && (WEXITSTATUS(*status) == 0 || WEXITSTATUS(*status) == 3);
    if (r == 0 && !finished) {
      // Rank 0 failed (3, wrong results, ends a finished sweep): the others would wait for it until their timeout
      // (those not yet joined: the join timeout).
      for (auto& rank : ranks) rank->Signal(SIGTERM);
      stopped_after_rank0 = true;
    }
    if (signals.caught() || output_errno) continue;  // stopped on purpose: one line below, not one per rank
    const bool stopped_here = status.ok() && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM;
    if (r > 0 && stopped_after_rank0 && stopped_here) continue;
    if (!status.ok() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      std::fprintf(stderr, "sparsereduce-perf: rank %u failed: %s\n", r,
                   status.ok() ? tools::DescribeExit(*status).c_str() : status.status().ToString().c_str());
      if (rc == 0) rc = status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : 1;
    }
  }
  if (!(*cluster)->Stop()) {
    std::fprintf(stderr, "sparsereduce-perf: an aggregator did not stop cleanly\n");
    rc = rc ? rc : 1;
  }
  if (const int sig = signals.caught()) return stopped(sig);
  if (output_errno == EPIPE) return 128 + SIGPIPE;  // the reader left: quietly, as a tool killed by SIGPIPE ends
  if (output_errno) {
    std::fprintf(stderr, "sparsereduce-perf: writing the output failed: %s; ranks and aggregators stopped\n",
                 std::strerror(output_errno));
    return 1;
  }
  return rc;
}

using tools::kNotNegative;
using tools::kNotNegativeOrZero;

int Main(int argc, char** argv) {
  Config c;
  CLI::App app{"sparsereduce-perf: allreduce bandwidth and latency, nccl-tests style"};
  app.add_option("-b,--minbytes", c.min_bytes, "Smallest size (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", c.max_bytes, "Largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", c.step_factor, "Size multiplier between rows")->capture_default_str();
  app.add_option("-n,--iters", c.iters, "Timed iterations per size (at most 1000000)")->capture_default_str();
  app.add_option("-w,--warmup_iters", c.warmup, "Warm-up iterations per size (at most 1000000)")
      ->capture_default_str();
  app.add_option("-c,--check", c.check, "Check results bit-exactly against a local reference (0/1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-d,--datatype", c.dtype, "float or int32")
      ->check(CLI::IsMember({"float", "int32"}))->capture_default_str();
  app.add_option("--density", c.density,
                 "Fraction of nonzero blocks per rank, in [0, 1]; disjoint overlap caps it at 1/W (the table shows "
                 "the density used)")
      ->capture_default_str();
  app.add_option("--overlap", c.overlap, "Placement of nonzero blocks across ranks")
      ->check(CLI::IsMember({"random", "full", "disjoint"}))->capture_default_str();
  app.add_option("--block-size", c.block_size, "Elements per block")->capture_default_str();
  app.add_option("--slots", c.slots, "Independent block streams per aggregator (WorkerOptions::slots)")
      ->capture_default_str();
  app.add_option("--blocks-per-message", c.blocks_per_message, "Blocks fused per message")->capture_default_str();
  app.add_option("--window", c.window, "Messages per slot a worker streams ahead of the results")
      ->capture_default_str();
  auto* aggregators = app.add_option("--aggregators", c.aggregators, "HOST:PORT,... of the job's aggregators")
                          ->delimiter(',');
  app.add_option("--job", c.job, "Job id")->check(kNotNegative)->capture_default_str();
  auto* rank = app.add_option("--rank", c.rank, "This process's rank")->capture_default_str();
  auto* world_size = app.add_option("--world-size", c.world_size, "Number of ranks")->capture_default_str();
  // --spawn sets each rank's --aggregators, --rank and --world-size itself.
  auto* spawn = app.add_option("--spawn", c.spawn, "W[,A]: launch W ranks and A aggregators on 127.0.0.1")
      ->excludes(aggregators)
      ->excludes(rank)
      ->excludes(world_size);
  // Without --spawn they did nothing, without a word.
  app.add_option("--run-timeout-ms", c.run_timeout_ms,
                 "With --spawn: bound on the whole run, after which the ranks are stopped; 0: none (at most 30 days)")
      ->check(kNotNegative)
      ->needs(spawn)
      ->capture_default_str();
  app.add_option("--aggregator-bin", c.aggregator_bin, "sparsereduce-aggregator to use with --spawn")->needs(spawn);
  app.add_option("--json", c.json, "Also write the results as JSON to this file");
  app.add_option("--seed", c.seed, "Seed of the synthetic tensors")->check(kNotNegative)->capture_default_str();
  app.add_option("--timeout-ms", c.timeout_ms, "Connect, join and each collective's timeout (1 ms to 30 days)")
      ->check(kNotNegativeOrZero)
      ->capture_default_str();
  app.add_option("--transport", c.transport,
                 "auto (shared memory with aggregators on this host, else TCP), tcp, shm or rdma; default "
                 "SPARSEREDUCE_TRANSPORT, else auto")
      ->check(CLI::IsMember({"auto", "tcp", "shm", "rdma"}));
  app.add_option("--rdma-device", c.rdma_device,
                 "RDMA NIC for --transport rdma; default SPARSEREDUCE_RDMA_DEVICE, else the first one");
  app.add_option("--rdma-port", c.rdma_port, "Port of the RDMA NIC")->check(CLI::Range(1, 255))->capture_default_str();
  app.add_option("--rdma-gid-index", c.rdma_gid_index,
                 "GID index for RoCE (RoCEv2: usually 3); -1: InfiniBand LID addressing")
      ->check(CLI::Range(-1, 255))
      ->capture_default_str();
  app.add_option("--tcp-send-buffer", c.tcp_send_buffer,
                 "SO_SNDBUF of each TCP aggregator connection (K/M suffixes); 0: SPARSEREDUCE_TCP_SEND_BUFFER, else "
                 "the kernel's autotuning")
      ->capture_default_str();
  app.add_option("--restore-on-failure", c.restore_on_failure,
                 "1: a failed allreduce gives the input back (a copy of the nonzero blocks per collective); 0: no copy")
      ->capture_default_str();
  app.add_option("--yield-while-scanning", c.yield_while_scanning,
                 "1: each worker gives its core up between the slots it scans (per MiB of zero blocks), so that "
                 "workers sharing cores all announce their first slots early; 0: no yield")
      ->capture_default_str();
  app.add_option("--codec", c.codec.name, "none, fp16, bf16, 3lc, diana, topk or adaptive (float only)")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "3lc", "diana", "topk", "adaptive"}))
      ->capture_default_str();
  app.add_option("--sparsity", c.codec.sparsity, "3lc: sparsity multiplier s in [1, 2)")->capture_default_str();
  app.add_flag("--fp32-results", c.codec.fp32_results, "3lc: sums come back in fp32");
  app.add_flag("--tensor-scale", c.codec.tensor_scale, "3lc: one scale for the whole tensor instead of per block");
  app.add_option("--fraction", c.codec.fraction, "topk: fraction of blocks sent")
      ->capture_default_str();
  app.add_option("--alpha", c.codec.alpha, "diana: step of h (0: 1/sqrt(block size))")->capture_default_str();
  app.add_flag("--l2-norm", c.codec.l2_norm, "diana: 2-norm block scales");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every usage error exits 2, as the checks below do (CLI11's own codes are 100 and up).
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!ValidateOptions(c, spawn->count() > 0)) return 2;
  if (spawn->count() > 0) return Spawn(c, argv, argc);
  if (c.aggregators.empty()) {
    std::fprintf(stderr, "sparsereduce-perf: give --aggregators (or --spawn W[,A])\n");
    return 2;
  }
  return RunRank(c);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {  // what a run's own catches do not expect: a failed run, not an abort
    std::fprintf(stderr, "sparsereduce-perf: %s\n", e.what());
    return 1;
  }
}
