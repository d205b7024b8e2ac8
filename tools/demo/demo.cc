// sparsereduce-demo: starts one sparsereduce-aggregator and W worker processes on 127.0.0.1, allreduces a sparse
// fp32 tensor at several block densities, checks every result bit-exactly against a locally computed reference,
// prints a table and shuts everything down. `make demo` runs it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "protocol/layout.h"
#include "sparsereduce/worker.h"
#include "tools/common/local_cluster.h"
#include "tools/common/stop_signals.h"
#include "tools/common/subprocess.h"
#include "tools/common/synthetic_tensor.h"

namespace {

using sparsereduce::tools::Subprocess;
using sparsereduce::tools::SyntheticSpec;
using Clock = std::chrono::steady_clock;

struct Config {
  uint32_t workers = 4;
  double size_mib = 64;
  std::vector<double> densities = {1.0, 0.1, 0.01};
  uint32_t iterations = 3;
  uint32_t block_size = 256;
  uint64_t seed = 2026;
  std::string aggregator_bin;
  // worker mode
  bool worker = false;
  uint32_t rank = 0;
  std::string aggregator;
};

// One line per density on stdout: "density union sent received nonzero seconds_median ok".
int RunWorker(const Config& c) {
  sparsereduce::WorkerOptions options;
  options.aggregators = {c.aggregator};
  options.job = 1;
  options.rank = c.rank;
  options.world_size = c.workers;
  options.block_size = c.block_size;
  try {
    sparsereduce::Worker worker(options);
    const uint64_t elements = static_cast<uint64_t>(c.size_mib * 1024 * 1024 / sizeof(float));
    std::vector<float> input(elements), work(elements);
    std::vector<float> token(1);
    for (size_t d = 0; d < c.densities.size(); ++d) {
      SyntheticSpec spec{elements, c.block_size, c.densities[d], sparsereduce::tools::Overlap::kRandom, c.workers,
                         c.seed + d};
      sparsereduce::tools::FillTensor(spec, c.rank, input);
      const std::vector<float> reference = sparsereduce::tools::ReferenceSumFloat(spec);
      std::vector<double> seconds;
      sparsereduce::CollectiveStats stats;
      bool ok = true;
      for (uint32_t it = 0; it < c.iterations + 1; ++it) {  // iteration 0 warms up
        work = input;
        worker.allreduce(std::span(token));  // barrier: everyone starts the timed call together
        const auto start = Clock::now();
        worker.allreduce(std::span(work));
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        stats = worker.last_stats();
        ok = ok && std::memcmp(work.data(), reference.data(), elements * sizeof(float)) == 0;
        if (it > 0) seconds.push_back(s);
      }
      std::sort(seconds.begin(), seconds.end());
      std::printf("%g %g %llu %llu %llu %llu %.6f %d\n", c.densities[d], sparsereduce::tools::UnionDensity(spec),
                  static_cast<unsigned long long>(stats.bytes_sent),
                  static_cast<unsigned long long>(stats.bytes_received),
                  static_cast<unsigned long long>(stats.nonzero_blocks),
                  static_cast<unsigned long long>(stats.blocks), seconds[seconds.size() / 2], ok ? 1 : 0);
      std::fflush(stdout);
    }
  } catch (const sparsereduce::Error& e) {
    std::fprintf(stderr, "demo worker %u: %s\n", c.rank, e.what());
    return 1;
  }
  return 0;
}

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

int RunDriver(const Config& c, const std::string& self) {
  // Ctrl-C (or SIGTERM, SIGHUP) stops the workers, so that the run ends as usual: the aggregator is stopped and its
  // temporary directory removed (the demo died alone, leaving the directory behind).
  sparsereduce::tools::StopSignals signals("demo");
  auto cluster = sparsereduce::tools::LocalAggregators::Start(c.aggregator_bin, 1);
  if (!cluster.ok()) {
    std::fprintf(stderr, "demo: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*cluster)->AddressList();
  std::printf("sparsereduce demo: 1 aggregator (%s), %u workers, %.0f MiB fp32 tensor, block %u, "
              "median of %u iterations\n\n", address.c_str(), c.workers, c.size_mib, c.block_size, c.iterations);
  std::fflush(stdout);  // before the run, which takes a while
  std::ostringstream densities;
  for (size_t i = 0; i < c.densities.size(); ++i) densities << (i ? "," : "") << c.densities[i];
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (uint32_t r = 0; r < c.workers; ++r) {
    auto w = Subprocess::Spawn({self, "--worker", "--rank", std::to_string(r), "--aggregator",
                                address, "--workers", std::to_string(c.workers), "--size-mib",
                                std::to_string(c.size_mib), "--densities", densities.str(), "--iterations",
                                std::to_string(c.iterations), "--block-size", std::to_string(c.block_size),
                                "--seed", std::to_string(c.seed)},
                               true);
    if (!w.ok()) {
      std::fprintf(stderr, "demo: %s\n", w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*w));
    if (!signals.Track(workers.back()->pid())) break;
  }
  bool failed = false;
  std::string rank0;
  for (uint32_t r = 0; r < workers.size(); ++r) {
    auto out = workers[r]->ReadStdout(std::chrono::minutes(10));
    signals.Untrack(workers[r]->pid());
    auto status = workers[r]->Wait(std::chrono::seconds(30));
    if (signals.caught()) continue;  // stopped on purpose: one line below, not one per worker
    if (!out.ok() || !status.ok() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      std::fprintf(stderr, "demo: worker %u failed (%s)\n", r,
                   !status.ok() ? status.status().ToString().c_str()
                                : sparsereduce::tools::DescribeExit(*status).c_str());
      failed = true;
    }
    if (out.ok()) {
      std::istringstream lines(*out);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.empty()) continue;
        if (line.back() == '0') {
          std::fprintf(stderr, "demo: worker %u got a WRONG result: %s\n", r, line.c_str());
          failed = true;
        }
      }
      if (r == 0) rank0 = *out;
    }
  }
  if (!(*cluster)->Stop()) {
    std::fprintf(stderr, "demo: aggregator did not stop cleanly\n");
    failed = true;
  }
  if (const int sig = signals.caught()) {
    std::fprintf(stderr, "demo: stopped by signal %d (%s); workers and aggregator stopped\n", sig, strsignal(sig));
    return 128 + sig;
  }

  const double tensor_bytes = c.size_mib * 1024 * 1024;
  std::printf("%-8s %-8s %-13s %-13s %-13s %-10s %-8s\n", "density", "union", "sent(w0)", "recv(w0)",
              "dense(w0)", "time(ms)", "check");
  std::istringstream lines(rank0);
  std::string line;
  while (std::getline(lines, line)) {
    double density, union_density, seconds;
    unsigned long long sent, received, nonzero, blocks;
    int ok;
    if (std::sscanf(line.c_str(), "%lf %lf %llu %llu %llu %llu %lf %d", &density, &union_density, &sent, &received,
                    &nonzero, &blocks, &seconds, &ok) != 8) {
      continue;
    }
    std::printf("%-8s %-8s %-13s %-13s %-13s %-10.1f %-8s\n",
                (std::to_string(density * 100).substr(0, 5) + "%").c_str(),
                (std::to_string(union_density * 100).substr(0, 5) + "%").c_str(), Mib(sent).c_str(),
                Mib(received).c_str(), Mib(2 * tensor_bytes).c_str(), seconds * 1000, ok ? "bit-exact" : "WRONG");
  }
  std::printf("\ndense(w0): bytes a dense allreduce through one aggregator moves per worker (tensor up + down).\n");
  std::printf("%s\n", failed ? "demo FAILED" : "all results bit-exact; aggregator stopped cleanly");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"sparsereduce-demo: one aggregator and W workers on 127.0.0.1, checked against a reference"};
  // Bounded like sparsereduce-perf's: --workers 0 printed an empty table and "all results bit-exact".
  app.add_option("--workers", c.workers, "Worker processes")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--size-mib", c.size_mib, "Tensor size in MiB (fp32)")
      ->check(CLI::Range(0.000001, 65536.0))
      ->capture_default_str();
  app.add_option("--densities", c.densities, "Block densities to run")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--iterations", c.iterations, "Timed iterations per density (after one warm-up)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--block-size", c.block_size, "Elements per block")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the synthetic tensors")->capture_default_str();
  app.add_option("--aggregator-bin", c.aggregator_bin, "Path of sparsereduce-aggregator");
  app.add_flag("--worker", c.worker, "Internal: run as one worker");
  app.add_option("--rank", c.rank, "Internal: worker rank");
  app.add_option("--aggregator", c.aggregator, "Internal: aggregator address");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; a usage error is 2, as for the other tools
  }
  if (c.worker) return RunWorker(c);
  // Checked here, not by a worker after the aggregator and the workers started: a tensor of no element ran and
  // said "all results bit-exact", and a block that no frame can carry failed every worker.
  if (c.size_mib * 1024 * 1024 < sizeof(float)) {
    std::fprintf(stderr, "sparsereduce-demo: --size-mib %g is less than one float (4 bytes)\n", c.size_mib);
    return 2;
  }
  const sparsereduce::CollectiveSpec spec{0, sparsereduce::DType::kFloat32, sparsereduce::ReduceOp::kSum,
                                          c.block_size};
  sparsereduce::Status st = sparsereduce::ValidateSpec(spec);
  sparsereduce::JobShape shape;
  shape.blocks_per_message = sparsereduce::WorkerOptions{}.blocks_per_message;  // the demo's Workers use the default
  if (st.ok()) st = sparsereduce::ValidateFrameSize(shape, spec);
  if (!st.ok()) {
    std::fprintf(stderr, "sparsereduce-demo: --block-size %u: %s\n", c.block_size, st.message().c_str());
    return 2;
  }
  const std::string self = std::filesystem::canonical("/proc/self/exe");
  if (c.aggregator_bin.empty())
    c.aggregator_bin = sparsereduce::tools::FindToolBinary("sparsereduce-aggregator", "aggregator");
  return RunDriver(c, self);
}
