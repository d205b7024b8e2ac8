// A user's program against the installed library and daemon. It calls every public member function of
// sparsereduce::Worker (and Error::code()), so a function libsparsereduce.so does not export
// (cmake/libsparsereduce.map) fails the link of this program. A function added to <sparsereduce/worker.h> belongs
// here too. World size 1, so every sum is the input.
// usage: consumer HOST:PORT
#include <sparsereduce/worker.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

bool failed = false;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: %s\n", what);
    failed = true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HOST:PORT\n");
    return 2;
  }
  sparsereduce::WorkerOptions options;
  options.aggregators = {argv[1]};
  options.job = 42;
  options.connect_timeout = std::chrono::seconds(10);
  options.join_timeout = std::chrono::seconds(10);
  options.collective_timeout = std::chrono::seconds(10);
  std::vector<float> floats(4096, 0.0f);
  floats[7] = 1.5f;
  floats[3000] = -2.0f;
  std::vector<int32_t> ints(1000, 0);
  ints[5] = 3;
  ints[999] = -4;
  const std::vector<float> expected_floats = floats;
  const std::vector<int32_t> expected_ints = ints;
  // Distinct keys per tensor, as the header asks of keyed calls.
  sparsereduce::AllreduceOptions float_key, int_key;
  float_key.key = 1;
  int_key.key = 2;
  try {
    sparsereduce::Worker worker(options);  // Worker(WorkerOptions), and ~Worker() at the end of the block

    worker.allreduce(std::span<float>(floats));
    worker.allreduce(std::span<int32_t>(ints));
    worker.allreduce(std::span<float>(floats), float_key);
    worker.allreduce(std::span<int32_t>(ints), int_key);
    worker.allreduce_async(std::span<float>(floats)).get();
    worker.allreduce_async(std::span<int32_t>(ints)).get();
    worker.allreduce_async(std::span<float>(floats), float_key).get();
    worker.allreduce_async(std::span<int32_t>(ints), int_key).get();
    Check(floats == expected_floats, "float allreduce result differs from the input");
    Check(ints == expected_ints, "int32 allreduce result differs from the input");

    const sparsereduce::CollectiveStats stats = worker.last_stats();
    Check(stats.element_count == ints.size(), "last_stats() is not of the last allreduce");
    Check(worker.options().job == 42, "options() does not hold the job");
    const std::vector<std::string> transports = worker.transports();
    Check(transports.size() == 1 && (transports[0] == "tcp" || transports[0] == "shm"),
          "transports() is not one of tcp or shm for the one aggregator");
    std::printf("consumer: 8 allreduces ok, transport %s\n", transports.empty() ? "?" : transports[0].c_str());

    worker.abort();
    try {
      worker.allreduce(std::span<float>(floats));
      Check(false, "allreduce after abort() did not throw");
    } catch (const sparsereduce::Error& e) {
      std::printf("consumer: allreduce after abort() threw %s\n", e.code().c_str());
    }
  } catch (const sparsereduce::Error& e) {  // caught by type across the library boundary
    std::fprintf(stderr, "consumer: %s: %s\n", e.code().c_str(), e.what());
    return 1;
  }
  if (failed) return 1;
  std::printf("consumer: every public function of Worker ok\n");
  return 0;
}
