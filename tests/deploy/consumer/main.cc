// One allreduce through the installed library and daemon: world size 1, so the sum is the input.
// usage: consumer HOST:PORT
#include <sparsereduce/worker.h>

#include <chrono>
#include <cstdio>
#include <vector>

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
  std::vector<float> tensor(4096, 0.0f);
  tensor[7] = 1.5f;
  tensor[3000] = -2.0f;
  const std::vector<float> expected = tensor;
  try {
    sparsereduce::Worker worker(options);
    worker.allreduce(std::span<float>(tensor));
  } catch (const sparsereduce::Error& e) {  // caught by type across the library boundary
    std::fprintf(stderr, "consumer: %s: %s\n", e.code().c_str(), e.what());
    return 1;
  }
  if (tensor != expected) {
    std::fprintf(stderr, "consumer: allreduce result differs from the input\n");
    return 1;
  }
  std::printf("consumer: allreduce of %zu floats ok\n", tensor.size());
  return 0;
}
