// sparsereduce-gloo-bench: dense Gloo allreduce (TCP, new API, RING or BCUBE) measured and printed the way
// our own perf tool prints sparsereduce, so both can sit in one table in BENCHMARKS.md.
//
// One process per rank. Manual mode (--rank/--world-size/--store-dir) runs one rank; --spawn W starts W
// copies of this binary on one host with a fresh FileStore directory and waits for them; SIGINT, SIGTERM or SIGHUP to
// that process stops the ranks, and if it is killed outright the ranks get SIGTERM (see RunSpawn). Per size: warm-up
// iterations, then per iteration a gloo::barrier and one timed in-place allreduce; the per-iteration times
// are reduced with max over ranks (the collective ends when its slowest rank ends) and the median over
// iterations is reported.
//
// The buffer is refilled from a pristine copy before every iteration (between two barriers, outside every rank's
// timed region), so every allreduce sums the same inputs and can be checked exactly: rank r's element i is
// ((7i + 13r) mod 1024) / 8, small multiples of 1/8, whose sums are exact in float in any order.
//
// Exit status, as sparsereduce-perf's: 0 ok, 1 the run failed, 2 usage error, 3 wrong results (with -c 1).
//
// Bytes sent/received are not measured (Gloo keeps no counters): they are rank 0's payload bytes per allreduce as
// Gloo's algorithm moves them, without Gloo's message headers and TCP/IP overhead. Ring: 2(n-1)/n x size each way
// (rounded down; exact when the size splits evenly into Gloo's n chunks). BCUBE: computed from Gloo's group
// arithmetic (gloo/allreduce.cc, bcube() with n = 2: the world size factored into 2s and a remainder group); it
// is also 2(n-1)/n x size when every step's chunks are equal.

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tools/common/json_output.h"
#include "tools/common/size_parse.h"
#include "tools/common/stop_signals.h"
#include "tools/common/subprocess.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string min_bytes = "1M";
  std::string max_bytes = "64M";
  uint64_t step_factor = 2;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;
  std::string datatype = "float";
  std::string algorithm = "ring";
  std::string json_path;
  // Manual mode.
  int rank = -1;
  int world_size = 0;
  std::string store_dir;
  std::string prefix = "sparsereduce-gloo-bench";
  std::string hostname = "127.0.0.1";
  int timeout_s = 120;  // every Gloo operation (rendezvous, barrier, allreduce)
  // Spawn mode.
  int spawn = 0;
  int run_timeout_s = 3600;  // the whole spawned run
};

// "64M" -> 67108864 (the same parser as sparsereduce-perf).
uint64_t ParseBytes(const std::string& text) {
  auto bytes = sparsereduce::tools::ParseByteSize(text);
  if (!bytes.ok()) throw std::invalid_argument(bytes.status().message());
  return *bytes;
}

// Rank `rank`'s element i: a multiple of 1/8 in [0, 128) from a hash of (i, rank), with no period, so that a chunk
// summed into the wrong place fails the check (a value that repeated every 1024 elements let shifts by a multiple
// of 4 KiB pass). Sums of up to 16384 such values are exact in float, whatever the order of the additions.
float InputValue(size_t i, int rank) {
  const uint64_t h = (uint64_t{i} + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) + 1) * 0xBF58476D1CE4E5B9ull;
  return static_cast<float>((h * 0x94D049BB133111EBull) >> 54) / 8.0f;
}

std::vector<float> ExpectedSums(uint64_t count, int world_size) {
  std::vector<float> sums(count, 0.0f);
  for (int r = 0; r < world_size; ++r) {
    for (size_t i = 0; i < count; ++i) sums[i] += InputValue(i, r);
  }
  return sums;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Rank `rank`'s payload bytes per BCUBE allreduce of `count` elements, sent and received alike, following gloo's
// bcube(): group sizes per step are 2 while the remaining size is even, then the remainder; each reduce-scatter
// step sends every other member its chunk of the current buffer and receives this rank's chunk from each of them,
// and the allgather steps do the reverse.
uint64_t BcubeBytes(uint64_t count, int world_size, int rank) {
  if (world_size <= 1 || count == 0) return 0;
  std::vector<uint64_t> group_sizes;
  uint64_t size = static_cast<uint64_t>(world_size);
  while (size % 2 == 0) {
    group_sizes.push_back(2);
    size /= 2;
  }
  if (size > 1) group_sizes.push_back(size);
  uint64_t elements = 0, peer_distance = 1, buffer_length = count;
  for (const uint64_t group_size : group_sizes) {
    const uint64_t group_rank = (static_cast<uint64_t>(rank) / peer_distance) % group_size;
    const uint64_t chunk = (buffer_length + group_size - 1) / group_size;
    const uint64_t start = group_rank * chunk;
    const uint64_t mine = start >= buffer_length ? 0 : std::min(chunk, buffer_length - start);
    elements += (buffer_length - mine) + (group_size - 1) * mine;  // one way: the others' chunks, or mine to each
    peer_distance *= group_size;
    buffer_length = mine;
  }
  return elements * sizeof(float);
}

struct Row {
  uint64_t size = 0;
  uint64_t count = 0;
  double median_us = 0, min_us = 0, max_us = 0;
  double algbw = 0, busbw = 0;
  std::optional<uint64_t> wrong;  // empty with --check 0
  uint64_t sent = 0, recv = 0;
};

// Gloo's TCP device dereferences an empty address list when --hostname does not resolve (SIGSEGV in every rank):
// resolve it here first, as Gloo will.
void CheckHostname(const std::string& hostname) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(hostname.c_str(), nullptr, &hints, &found); rc != 0) {
    throw std::invalid_argument("--hostname " + hostname + ": cannot resolve: " + ::gai_strerror(rc));
  }
  ::freeaddrinfo(found);
}

class GlooRank {
 public:
  explicit GlooRank(const Options& options)
      : options_(options), timeout_(std::chrono::seconds(options.timeout_s)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(options.store_dir);
    gloo::rendezvous::PrefixStore store(options.prefix, file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(timeout_);
    context->connectFullMesh(store, device);
    context_ = context;
    algorithm_ = options.algorithm == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                              : gloo::AllreduceOptions::Algorithm::RING;
  }

  Row Measure(uint64_t count) {
    const int world = options_.world_size;
    std::vector<float> pristine(count);
    for (size_t i = 0; i < count; ++i) pristine[i] = InputValue(i, options_.rank);
    std::vector<float> buffer(count);
    const std::vector<float> expected = options_.check != 0 ? ExpectedSums(count, world) : std::vector<float>();

    std::vector<double> times_us;
    uint64_t worst_wrong = 0;
    for (int it = 0; it < options_.warmup_iters + options_.iters; ++it) {
      Barrier();  // as sparsereduce-perf: nobody copies its input while another rank still times its allreduce
      std::copy(pristine.begin(), pristine.end(), buffer.begin());
      gloo::AllreduceOptions opts(context_);
      opts.setAlgorithm(algorithm_);
      opts.setOutput(buffer.data(), count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      Barrier();
      const auto start = Clock::now();
      gloo::allreduce(opts);
      const auto end = Clock::now();
      if (it >= options_.warmup_iters) {
        times_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      }
      if (options_.check != 0) {
        Barrier();  // nor checks while another rank still times its allreduce
        uint64_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += buffer[i] != expected[i];
        worst_wrong = std::max(worst_wrong, wrong);
      }
    }

    // The collective takes as long as its slowest rank: max over ranks, per iteration.
    AllreduceDoubles(times_us, &gloo::max<double>);
    std::vector<double> wrong{static_cast<double>(worst_wrong)};
    AllreduceDoubles(wrong, &gloo::sum<double>);

    Row row;
    row.count = count;
    row.size = count * sizeof(float);
    row.median_us = Median(times_us);
    row.min_us = *std::min_element(times_us.begin(), times_us.end());
    row.max_us = *std::max_element(times_us.begin(), times_us.end());
    row.algbw = static_cast<double>(row.size) / 1e9 / (row.median_us / 1e6);
    row.busbw = row.algbw * 2.0 * (world - 1) / world;
    if (options_.check != 0) row.wrong = static_cast<uint64_t>(wrong[0]);
    // Rank 0's payload (see the top of the file). Ring: reduce-scatter and allgather each move (n-1)/n of the
    // buffer per rank, each way.
    row.sent = row.recv = options_.algorithm == "bcube"
                              ? BcubeBytes(count, world, 0)
                              : row.size * 2 * static_cast<uint64_t>(world - 1) / static_cast<uint64_t>(world);
    return row;
  }

 private:
  uint32_t NextTag() { return next_tag_++; }

  void Barrier() {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

  void AllreduceDoubles(std::vector<double>& values, void (*fn)(void*, const void*, const void*, size_t)) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values.data(), values.size());
    opts.setReduceFunction(fn);
    opts.setTag(NextTag());
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  }

  const Options& options_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  gloo::AllreduceOptions::Algorithm algorithm_;
  uint32_t next_tag_ = 0;
};

void PrintHeader(const Options& o) {
  std::printf("# sparsereduce-gloo-bench: %d ranks, algorithm %s, %s\n", o.world_size, o.algorithm.c_str(),
              o.datatype.c_str());
  std::printf(
      "# time: median over %d iterations of the slowest rank's allreduce (in place, after a barrier)\n",
      o.iters);
  if (o.algorithm == "bcube") {
    std::printf("# sent/recv: rank 0's payload bytes as Gloo's bcube moves them (computed, not measured)\n");
  } else {
    std::printf("# sent/recv: rank 0's payload bytes, 2(n-1)/n*size (computed, not measured)\n");
  }
  std::printf("#%11s %12s %6s %6s %11s %12s %12s %7s %8s %7s %12s %12s\n", "size", "count", "type", "redop",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "density", "union", "sent(B)", "recv(B)");
  std::fflush(stdout);
}

void PrintRow(const Row& r) {
  const std::string wrong = r.wrong ? std::to_string(*r.wrong) : "N/A";
  std::printf("%12" PRIu64 " %12" PRIu64 " %6s %6s %11.1f %12.2f %12.2f %7s %8.3f %7.3f %12" PRIu64
              " %12" PRIu64 "\n",
              r.size, r.count, "float", "sum", r.median_us, r.algbw, r.busbw, wrong.c_str(), 1.0, 1.0, r.sent,
              r.recv);
  std::fflush(stdout);
}

// The --json document of what was measured so far: "complete" is false until the sweep has ended. The names are
// sparsereduce-perf's where the meaning is the same ("check" a boolean, as perf's); "algorithm" is the Gloo bench's
// own. density and union_density are 1: a dense allreduce sends every element whatever its value.
std::string JsonText(const Options& o, const std::vector<Row>& rows, bool complete) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "{\"tool\":\"gloo\",\"algorithm\":\"%s\",\"world_size\":%d,\"dtype\":\"%s\",\"density\":1,"
                "\"transports\":[\"tcp\"],\"iterations\":%d,\"warmup_iterations\":%d,\"check\":%s,"
                "\"bytes\":\"%s\",\"complete\":%s,\"results\":[",
                o.algorithm.c_str(), o.world_size, o.datatype.c_str(), o.iters, o.warmup_iters,
                o.check != 0 ? "true" : "false",
                o.algorithm == "bcube" ? "computed: rank 0's payload per allreduce as Gloo's bcube moves it"
                                       : "computed: rank 0's payload per allreduce, 2(n-1)/n x size",
                complete ? "true" : "false");
  std::string text = buf;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const std::string wrong = r.wrong ? std::to_string(*r.wrong) : "null";
    std::snprintf(buf, sizeof buf,
                  "%s\n{\"size\":%" PRIu64 ",\"count\":%" PRIu64
                  ",\"time_us_median\":%.3f,\"time_us_min\":%.3f,\"time_us_max\":%.3f,"
                  "\"algbw\":%.6f,\"busbw\":%.6f,\"wrong\":%s,\"density\":1,\"union_density\":1,"
                  "\"bytes_sent\":%" PRIu64 ",\"bytes_received\":%" PRIu64 "}",
                  i == 0 ? "" : ",", r.size, r.count, r.median_us, r.min_us, r.max_us, r.algbw, r.busbw,
                  wrong.c_str(), r.sent, r.recv);
    text += buf;
  }
  text += "\n]}\n";
  return text;
}

// Exit status: 0 ok, 1 the run failed, 2 the --json file cannot be opened, 3 wrong results.
int RunRank(const Options& o) {
  const uint64_t min_bytes = ParseBytes(o.min_bytes);
  const uint64_t max_bytes = ParseBytes(o.max_bytes);
  const bool writes_json = o.rank == 0 && !o.json_path.empty();
  if (writes_json) {
    // Checked first, left as it is; the JsonRewriter below rewrites it as rows come.
    if (const sparsereduce::Status st = sparsereduce::tools::CheckJsonOutput(o.json_path); !st.ok()) {
      std::fprintf(stderr, "sparsereduce-gloo-bench: %s\n", st.message().c_str());
      return 2;
    }
  }
  std::vector<Row> rows;
  // Rewritten before the first row, after every row (before printing it: a row printed is in the file, whenever
  // the run is stopped) and at the end.
  sparsereduce::tools::JsonRewriter json("sparsereduce-gloo-bench", writes_json ? o.json_path : "");
  const auto write_json = [&](bool complete) { json.Write(JsonText(o, rows, complete)); };
  write_json(false);  // no rows yet: what a run stopped before its first row leaves
  int rc = 0;
  try {
    GlooRank rank(o);
    if (o.rank == 0) PrintHeader(o);
    for (uint64_t size = min_bytes; size <= max_bytes; size *= o.step_factor) {
      rows.push_back(rank.Measure(size / sizeof(float)));
      write_json(false);  // first: a row printed is in the --json file, whenever the run is stopped
      if (o.rank == 0) PrintRow(rows.back());
      if (rows.back().wrong.value_or(0) != 0 && o.rank == 0) {
        std::fprintf(stderr, "sparsereduce-gloo-bench: %" PRIu64 " wrong elements at %" PRIu64 " bytes\n",
                     *rows.back().wrong, rows.back().size);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsereduce-gloo-bench: rank %d of %d: %s\n", o.rank, o.world_size, e.what());
    rc = 1;
  }
  write_json(rc == 0);
  if (json.failed()) rc = rc ? rc : 1;
  if (rc != 0) return rc;
  for (const Row& r : rows) {
    if (r.wrong.value_or(0) != 0) return 3;
  }
  return 0;
}

// Starts o.spawn ranks of this binary on this host and waits for all of them (bounded by --run-timeout). The
// first failure kills the others. A rank that exits 3 finished its sweep with wrong results (every rank sees the
// same sum of wrong elements): the others are left to finish (rank 0 still writes --json). Returns the exit code
// for this process: 1 if a rank failed or the run timed out, else 3 if a rank found wrong results, else 0; 128 + the
// signal if SIGINT, SIGTERM or SIGHUP stopped the run. The ranks get SIGTERM if this thread ends first
// (PR_SET_PDEATHSIG, tools::Subprocess): this process killed outright leaves no rank running.
int RunSpawn(const Options& o) {
  using sparsereduce::tools::Subprocess;
  if (!o.json_path.empty()) {
    // Checked before anything starts, then a whole document of no rows put in its place (rank 0 rewrites it as rows
    // come): a run that fails before rank 0 writes leaves that, as sparsereduce-perf's does.
    if (const sparsereduce::Status st = sparsereduce::tools::CheckJsonOutput(o.json_path); !st.ok()) {
      std::fprintf(stderr, "sparsereduce-gloo-bench: %s\n", st.message().c_str());
      return 2;
    }
    Options shown = o;  // the run's world, as rank 0 writes it
    shown.world_size = o.spawn;
    sparsereduce::tools::JsonRewriter json("sparsereduce-gloo-bench", o.json_path);
    json.Write(JsonText(shown, {}, false));
    if (json.failed()) return 2;
  }
  // The ranks run this binary: its path, or the link itself if the file was replaced since it started (a rebuild).
  std::error_code self_error;
  std::string self = std::filesystem::canonical("/proc/self/exe", self_error).string();
  if (self_error) self = "/proc/self/exe";
  // From here on a stop signal is handled: the ranks are stopped and the directory removed.
  sparsereduce::tools::StopSignals signals("sparsereduce-gloo-bench");
  char dir_template[] = "/tmp/sparsereduce-gloo-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::fprintf(stderr, "sparsereduce-gloo-bench: mkdtemp: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string store_dir = dir_template;

  std::vector<std::unique_ptr<Subprocess>> ranks(o.spawn);  // null once reaped (or never started)
  int result = 0;
  for (int r = 0; r < o.spawn && result == 0; ++r) {
    std::vector<std::string> args = {self,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(o.spawn),
                                     "--store-dir",
                                     store_dir,
                                     "--hostname",
                                     o.hostname,
                                     "--timeout",
                                     std::to_string(o.timeout_s),
                                     "-b",
                                     o.min_bytes,
                                     "-e",
                                     o.max_bytes,
                                     "-f",
                                     std::to_string(o.step_factor),
                                     "-n",
                                     std::to_string(o.iters),
                                     "-w",
                                     std::to_string(o.warmup_iters),
                                     "-c",
                                     std::to_string(o.check),
                                     "-d",
                                     o.datatype,
                                     "--algorithm",
                                     o.algorithm};
    if (r == 0 && !o.json_path.empty()) {
      args.push_back("--json");
      args.push_back(o.json_path);
    }
    auto rank = Subprocess::Spawn(args, /*capture_stdout=*/false);  // rank 0's table goes straight to our stdout
    if (!rank.ok()) {
      std::fprintf(stderr, "sparsereduce-gloo-bench: spawning rank %d: %s\n", r, rank.status().ToString().c_str());
      result = 1;
      break;
    }
    ranks[r] = std::move(*rank);
    if (!signals.Track(ranks[r]->pid())) break;  // stopped while starting: no more ranks
  }

  const auto deadline = Clock::now() + std::chrono::seconds(o.run_timeout_s);
  bool wrong = false;
  const auto running = [&] {
    return std::any_of(ranks.begin(), ranks.end(), [](const auto& rank) { return rank != nullptr; });
  };
  while (running() && !signals.caught()) {
    bool reaped = false;
    for (int r = 0; r < o.spawn; ++r) {
      if (!ranks[r]) continue;
      signals.Untrack(ranks[r]->pid());
      auto status = ranks[r]->Wait(std::chrono::milliseconds(0));
      if (!status.ok()) {  // still running
        signals.Track(ranks[r]->pid());
        continue;
      }
      reaped = true;
      ranks[r].reset();
      if (signals.caught()) continue;  // stopped on purpose: one line below, not one per rank
      if (WIFEXITED(*status) && WEXITSTATUS(*status) == 3) {
        wrong = true;
      } else if (!(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)) {
        std::fprintf(stderr, "sparsereduce-gloo-bench: rank %d failed (%s)\n", r,
                     sparsereduce::tools::DescribeExit(*status).c_str());
        result = 1;
      }
    }
    if (signals.caught()) break;
    if (result != 0 || Clock::now() > deadline) {
      if (result == 0) {
        std::fprintf(stderr, "sparsereduce-gloo-bench: run exceeded --run-timeout %d s\n", o.run_timeout_s);
        result = 1;
      }
      for (auto& rank : ranks) rank.reset();  // SIGKILL and reap
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  const int stop_signal = signals.caught();
  if (stop_signal) {
    // The signal's thread sent every tracked rank SIGTERM. A rank that ignores it is killed after the grace time.
    const auto grace = Clock::now() + std::chrono::seconds(10);
    for (auto& rank : ranks) {
      if (!rank) continue;
      rank->Signal(SIGTERM);  // also a rank untracked for its Wait(0) when the signal came
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(grace - Clock::now());
      (void)rank->Wait(std::max(left, std::chrono::milliseconds(0)));
      rank.reset();  // SIGKILL and reap if it is still running
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  if (stop_signal) {
    std::fprintf(stderr, "sparsereduce-gloo-bench: stopped by signal %d (%s): ranks stopped\n", stop_signal,
                 strsignal(stop_signal));
    return 128 + stop_signal;
  }
  return result != 0 ? result : wrong ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Dense Gloo allreduce baseline, printed like sparsereduce's perf tool"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size in bytes (K/M/G = 2^10/2^20/2^30)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplier between rows")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup_iters, "untimed iterations per size")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("-c,--check", o.check, "check every result against the expected sum")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  app.add_option("-d,--datatype", o.datatype, "element type")
      ->check(CLI::IsMember({"float"}))
      ->capture_default_str();
  app.add_option("--algorithm", o.algorithm, "Gloo allreduce algorithm")
      ->check(CLI::IsMember({"ring", "bcube"}))
      ->capture_default_str();
  app.add_option("--json", o.json_path,
                 "also write the results as JSON (rank 0 rewrites it after every size: a run that fails or is stopped "
                 "part-way leaves the sizes measured so far, with \"complete\": false)");
  app.add_option("--rank", o.rank, "this process's rank (manual mode)");
  app.add_option("--world-size", o.world_size, "number of ranks (manual mode)");
  app.add_option(
      "--store-dir", o.store_dir,
      "FileStore directory shared by all ranks (manual mode); fresh per run, or use a new --prefix");
  app.add_option("--prefix", o.prefix, "key prefix in the store")->capture_default_str();
  app.add_option("--hostname", o.hostname, "address the TCP device binds and announces")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "seconds allowed for each Gloo operation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--spawn", o.spawn,
                 "start this many ranks on this host and wait for them; SIGINT, SIGTERM or SIGHUP to this process "
                 "stops them (SIGTERM), waits for them, removes their store directory and exits 128 + the signal, "
                 "and if it is killed outright (SIGKILL) the ranks get SIGTERM")
      ->check(CLI::Range(1, 1024));
  app.add_option("--run-timeout", o.run_timeout_s, "seconds allowed for the whole --spawn run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.footer(
      "Exit status: 0 ok; 1 the run failed (a rank failed, a Gloo operation timed out, --run-timeout passed); 2 usage "
      "error (also a --json file that cannot be opened); 3 wrong results (-c 1 found elements that differ from the "
      "expected sum); 128 + N a --spawn run stopped by signal N (SIGINT, SIGTERM, SIGHUP). As sparsereduce-perf's. "
      "A stopped run's --json holds the sizes measured so far, with \"complete\": false.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every usage error exits 2, as the checks below do (CLI11's own codes are 100 and up).
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    const uint64_t min_bytes = ParseBytes(o.min_bytes);
    const uint64_t max_bytes = ParseBytes(o.max_bytes);
    if (min_bytes < sizeof(float) || max_bytes < min_bytes) {
      throw std::invalid_argument("need 4 <= --minbytes <= --maxbytes");
    }
    CheckHostname(o.hostname);
    if (o.spawn > 0) {
      if (o.rank >= 0 || o.world_size > 0 || !o.store_dir.empty()) {
        throw std::invalid_argument("--spawn excludes --rank, --world-size and --store-dir");
      }
      return RunSpawn(o);
    }
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size || o.store_dir.empty()) {
      throw std::invalid_argument(
          "need --spawn W, or --rank R --world-size W --store-dir DIR with 0 <= R < W");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsereduce-gloo-bench: %s\n", e.what());
    return 2;
  }

  try {
    return RunRank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparsereduce-gloo-bench: rank %d of %d: %s\n", o.rank, o.world_size, e.what());
    return 1;
  }
}
