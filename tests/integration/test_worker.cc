// A worker process for the multi-process tests: joins a job, runs N allreduces of synthetic tensors and checks each
// result bit-exactly against the reference. Prints "OK <bytes_sent> <bytes_received>" per collective, or
// "ERROR <code> <message>" and exits 3 when the library throws, or "WRONG <collective>" and exits 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>

#include "sparsereduce/worker.h"
#include "tools/common/synthetic_tensor.h"

int main(int argc, char** argv) {
  sparsereduce::WorkerOptions options;
  uint64_t elements = 10000;
  double density = 0.1;
  uint32_t collectives = 1;
  uint64_t seed = 1;
  std::string dtype = "float";
  std::string overlap = "random";
  uint64_t timeout_ms = 20000;
  CLI::App app{"sparsereduce test worker"};
  app.add_option("--aggregators", options.aggregators)->delimiter(',')->required();
  app.add_option("--job", options.job)->required();
  app.add_option("--rank", options.rank)->required();
  app.add_option("--world-size", options.world_size)->required();
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
  CLI11_PARSE(app, argc, argv);
  options.connect_timeout = options.join_timeout = options.collective_timeout = std::chrono::milliseconds(timeout_ms);
  const auto overlap_kind = overlap == "full"       ? sparsereduce::tools::Overlap::kFull
                            : overlap == "disjoint" ? sparsereduce::tools::Overlap::kDisjoint
                                                    : sparsereduce::tools::Overlap::kRandom;
  try {
    sparsereduce::Worker worker(options);
    for (uint32_t c = 0; c < collectives; ++c) {
      // Density varies per collective (c % 4 == 3: all zero) so consecutive collectives differ.
      const double d = c % 4 == 3 ? 0.0 : density / (1 + c % 4);
      sparsereduce::tools::SyntheticSpec spec{elements, options.block_size, d, overlap_kind, options.world_size,
                                              seed + c};
      bool ok;
      if (dtype == "int32") {
        std::vector<int32_t> t(elements);
        sparsereduce::tools::FillTensor(spec, options.rank, t);
        worker.allreduce(std::span(t));
        ok = t == sparsereduce::tools::ReferenceSumInt32(spec);
      } else {
        std::vector<float> t(elements);
        sparsereduce::tools::FillTensor(spec, options.rank, t);
        worker.allreduce(std::span(t));
        const auto ref = sparsereduce::tools::ReferenceSumFloat(spec);
        ok = std::memcmp(t.data(), ref.data(), elements * sizeof(float)) == 0;
      }
      if (!ok) {
        std::printf("WRONG %u\n", c);
        return 1;
      }
      const auto stats = worker.last_stats();
      std::printf("OK %llu %llu\n", static_cast<unsigned long long>(stats.bytes_sent),
                  static_cast<unsigned long long>(stats.bytes_received));
      std::fflush(stdout);
    }
  } catch (const sparsereduce::Error& e) {
    std::printf("ERROR %s %s\n", e.code().c_str(), e.what());
    return 3;
  }
  return 0;
}
