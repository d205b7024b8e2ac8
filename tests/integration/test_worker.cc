// A worker process for the multi-process tests: joins a job, runs N allreduces of synthetic tensors and checks each
// result bit-exactly against the reference. Prints "OK <bytes_sent> <bytes_received>" per collective, or
// "ERROR <code> <message>" and exits 3 when the library throws, or "WRONG <collective>" and exits 1.
//
// For the fault tests, each only with its flag (without them the output is exactly as above):
//   --verify-restore   when an allreduce throws, compare the tensor with a copy of its input taken before the call
//                      and print "RESTORED" (bitwise equal) or "NOT_RESTORED <differing elements> <first index>"
//                      on the line after ERROR.
//   --error-timestamp  print "ERROR_AT_NS <steady_clock ns>" (CLOCK_MONOTONIC, comparable across processes) as
//                      the last line when the library throws; taken right after the throw.
//   --same-input       every collective reduces the input of collective 0 (generated and summed once, then copied
//                      in), so the collectives run back to back instead of waiting for reference computations;
//                      each result is still checked bit-exactly.
//   --stop-on-stdin    after each collective, check (without blocking) whether stdin has a line or reached EOF,
//                      then allreduce that flag (one int32) with the other ranks; when any rank asked to stop,
//                      every rank prints "STOPPED <collectives done>" and exits 0. All ranks need the flag, and
//                      stdin must be a pipe (a /dev/null or closed stdin stops after the first collective).
#include <poll.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "sparsereduce/worker.h"
#include "tools/common/synthetic_tensor.h"

namespace {

struct FaultOutput {
  bool verify_restore = false;
  bool error_timestamp = false;
};

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs one allreduce; on an Error prints ERROR (and the extra lines asked for) and returns the exit code 3.
template <typename T>
std::optional<int> Allreduce(sparsereduce::Worker& worker, std::vector<T>& t, const FaultOutput& out) {
  static std::vector<T> before;  // reused: no page faults between back-to-back collectives
  if (out.verify_restore) before.assign(t.begin(), t.end());
  try {
    worker.allreduce(std::span(t));
  } catch (const sparsereduce::Error& e) {
    const int64_t at = SteadyNowNs();
    std::printf("ERROR %s %s\n", e.code().c_str(), e.what());
    if (out.verify_restore) {
      uint64_t differing = 0, first = 0;
      for (size_t i = 0; i < t.size(); ++i) {
        if (std::memcmp(&t[i], &before[i], sizeof(T)) != 0 && differing++ == 0) first = i;
      }
      if (differing == 0) {
        std::printf("RESTORED\n");
      } else {
        std::printf("NOT_RESTORED %llu %llu\n", static_cast<unsigned long long>(differing),
                    static_cast<unsigned long long>(first));
      }
    }
    if (out.error_timestamp) std::printf("ERROR_AT_NS %lld\n", static_cast<long long>(at));
    std::fflush(stdout);
    return 3;
  }
  return std::nullopt;
}

// Whether stdin has a line (or EOF) ready, without blocking.
bool StopRequested() {
  pollfd pfd{STDIN_FILENO, POLLIN, 0};
  return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  sparsereduce::WorkerOptions options;
  uint64_t elements = 10000;
  double density = 0.1;
  uint32_t collectives = 1;
  uint64_t seed = 1;
  std::string dtype = "float";
  std::string overlap = "random";
  uint64_t timeout_ms = 20000;
  FaultOutput fault_output;
  bool stop_on_stdin = false;
  bool same_input = false;
  bool print_transports = false;
  CLI::App app{"sparsereduce test worker"};
  app.add_option("--aggregators", options.aggregators)->delimiter(',')->required();
  app.add_option("--job", options.job)->required();
  app.add_option("--rank", options.rank)->required()->take_last();
  app.add_option("--world-size", options.world_size)->required()->take_last();
  app.add_option("--block-size", options.block_size);
  app.add_option("--slots", options.slots);
  app.add_option("--blocks-per-message", options.blocks_per_message);
  app.add_option("--elements", elements)->take_last();
  app.add_option("--density", density);
  app.add_option("--overlap", overlap);
  app.add_option("--collectives", collectives);
  app.add_option("--seed", seed);
  app.add_option("--dtype", dtype);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_flag("--verify-restore", fault_output.verify_restore);
  app.add_flag("--error-timestamp", fault_output.error_timestamp);
  app.add_flag("--stop-on-stdin", stop_on_stdin);
  app.add_flag("--same-input", same_input);
  app.add_option("--transport", options.transport);
  app.add_flag("--print-transports", print_transports, "Print 'TRANSPORTS tcp,shm,...' once joined");
  CLI11_PARSE(app, argc, argv);
  options.connect_timeout = options.join_timeout = options.collective_timeout = std::chrono::milliseconds(timeout_ms);
  const auto overlap_kind = overlap == "full"       ? sparsereduce::tools::Overlap::kFull
                            : overlap == "disjoint" ? sparsereduce::tools::Overlap::kDisjoint
                                                    : sparsereduce::tools::Overlap::kRandom;
  try {
    sparsereduce::Worker worker(options);
    if (print_transports) {
      std::string list;
      for (const std::string& t : worker.transports()) list += (list.empty() ? "" : ",") + t;
      std::printf("TRANSPORTS %s\n", list.c_str());
      std::fflush(stdout);
    }
    // With --same-input: collective 0's input and reference, kept; t_i/t_f are the tensors reduced (reused).
    std::vector<int32_t> input_i, ref_i, t_i;
    std::vector<float> input_f, ref_f, t_f;
    for (uint32_t c = 0; c < collectives; ++c) {
      // Density varies per collective (c % 4 == 3: all zero) so consecutive collectives differ.
      const uint32_t k = same_input ? 0 : c;
      const double d = k % 4 == 3 ? 0.0 : density / (1 + k % 4);
      sparsereduce::tools::SyntheticSpec spec{elements,     options.block_size, d,
                                              overlap_kind, options.world_size, seed + k};
      const bool generate = !same_input || c == 0;
      bool ok;
      if (dtype == "int32") {
        if (generate) {
          input_i.assign(elements, 0);
          sparsereduce::tools::FillTensor(spec, options.rank, input_i);
          ref_i = sparsereduce::tools::ReferenceSumInt32(spec);
        }
        t_i.assign(input_i.begin(), input_i.end());
        if (auto failed = Allreduce(worker, t_i, fault_output)) return *failed;
        ok = t_i == ref_i;
      } else {
        if (generate) {
          input_f.assign(elements, 0.0f);
          sparsereduce::tools::FillTensor(spec, options.rank, input_f);
          ref_f = sparsereduce::tools::ReferenceSumFloat(spec);
        }
        t_f.assign(input_f.begin(), input_f.end());
        if (auto failed = Allreduce(worker, t_f, fault_output)) return *failed;
        ok = std::memcmp(t_f.data(), ref_f.data(), elements * sizeof(float)) == 0;
      }
      if (!ok) {
        std::printf("WRONG %u\n", c);
        return 1;
      }
      const auto stats = worker.last_stats();
      std::printf("OK %llu %llu\n", static_cast<unsigned long long>(stats.bytes_sent),
                  static_cast<unsigned long long>(stats.bytes_received));
      std::fflush(stdout);
      if (stop_on_stdin) {
        std::vector<int32_t> stop{StopRequested() ? 1 : 0};
        if (auto failed = Allreduce(worker, stop, fault_output)) return *failed;
        if (stop[0] > 0) {
          std::printf("STOPPED %u\n", c + 1);
          std::fflush(stdout);
          return 0;
        }
      }
    }
  } catch (const sparsereduce::Error& e) {  // the Worker constructor (connect, join)
    const int64_t at = SteadyNowNs();
    std::printf("ERROR %s %s\n", e.code().c_str(), e.what());
    if (fault_output.error_timestamp) std::printf("ERROR_AT_NS %lld\n", static_cast<long long>(at));
    return 3;
  }
  return 0;
}
