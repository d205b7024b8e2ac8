// Several Worker objects in one process (two jobs, two ranks each) against a real daemon process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "sparsereduce/worker.h"
#include "tools/common/subprocess.h"
#include "tools/common/synthetic_tensor.h"

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;

TEST(InProcess, TwoJobsInOneProcess) {
  const std::string dir = std::filesystem::temp_directory_path() / ("sr-inproc-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto daemon = tools::Subprocess::Spawn(
      {SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--port-file", dir + "/port", "--log-level", "warn"},
      false);
  ASSERT_TRUE(daemon.ok());
  auto port = tools::WaitForFileLine(dir + "/port", 10s, daemon->get());
  ASSERT_TRUE(port.ok()) << port.status().ToString();

  constexpr uint32_t kRanks = 2;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (uint64_t job : {1, 2}) {
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, job, rank] {
        const size_t slot = (job - 1) * kRanks + rank;
        try {
          WorkerOptions options;
          options.aggregators = {"127.0.0.1:" + *port};
          options.job = job;
          options.rank = rank;
          options.world_size = kRanks;
          options.connect_timeout = options.join_timeout = options.collective_timeout = 10s;
          Worker worker(options);
          for (uint64_t c = 0; c < 3; ++c) {
            tools::SyntheticSpec spec{5000 + job * 100, 256, 0.3, tools::Overlap::kRandom, kRanks, job * 10 + c};
            std::vector<float> t(spec.elements);
            tools::FillTensor(spec, rank, t);
            // Alternate the blocking and the async form.
            if (c % 2) {
              worker.allreduce_async(std::span(t)).get();
            } else {
              worker.allreduce(std::span(t));
            }
            const auto ref = tools::ReferenceSumFloat(spec);
            if (std::memcmp(t.data(), ref.data(), t.size() * sizeof(float)) != 0) {
              failures[slot] = "wrong result in collective " + std::to_string(c);
            }
          }
        } catch (const std::exception& e) {
          failures[slot] = e.what();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  daemon->get()->Signal(SIGTERM);
  EXPECT_TRUE(daemon->get()->Wait(10s).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparsereduce::testing
