// Workers in this process against a real daemon process: several Worker objects (two jobs, two ranks each), a
// tiny TCP send buffer, and the send-buffer variable checked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "sparsereduce/worker.h"
#include "tools/common/local_cluster.h"
#include "tools/common/synthetic_tensor.h"

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;

// Reduces a synthetic tensor (blocking or async) and compares it bit for bit; "" when right.
std::string ReduceAndCheck(Worker& worker, const tools::SyntheticSpec& spec, uint32_t rank, bool async) {
  std::vector<float> t(spec.elements);
  tools::FillTensor(spec, rank, t);
  if (async) {
    worker.allreduce_async(std::span(t)).get();
  } else {
    worker.allreduce(std::span(t));
  }
  const auto ref = tools::ReferenceSumFloat(spec);
  return std::memcmp(t.data(), ref.data(), t.size() * sizeof(float)) == 0 ? "" : "wrong result";
}

TEST(InProcess, TwoJobsInOneProcess) {
  auto daemon = tools::LocalAggregators::Start(SPARSEREDUCE_AGGREGATOR_BIN, 1);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  constexpr uint32_t kRanks = 2;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (uint64_t job : {1, 2}) {
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, job, rank] {
        const size_t slot = (job - 1) * kRanks + rank;
        try {
          WorkerOptions options;
          options.aggregators = {(*daemon)->AddressList()};
          options.job = job;
          options.rank = rank;
          options.world_size = kRanks;
          options.connect_timeout = options.join_timeout = options.collective_timeout = 10s;
          Worker worker(options);
          for (uint64_t c = 0; c < 3 && failures[slot].empty(); ++c) {
            tools::SyntheticSpec spec{5000 + job * 100, 256, 0.3, tools::Overlap::kRandom, kRanks, job * 10 + c};
            // Alternate the blocking and the async form.
            if (std::string f = ReduceAndCheck(worker, spec, rank, c % 2); !f.empty()) {
              failures[slot] = f + " in collective " + std::to_string(c);
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
  EXPECT_TRUE((*daemon)->Stop());
}

// A send buffer far below one frame (128 KiB) makes every frame go out in many partial writes; the sums stay exact.
TEST(InProcess, SmallTcpSendBufferStillSumsExactly) {
  auto daemon = tools::LocalAggregators::Start(SPARSEREDUCE_AGGREGATOR_BIN, 1);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  constexpr uint32_t kRanks = 2;
  std::vector<std::string> failures(kRanks);
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        WorkerOptions options;
        options.aggregators = {(*daemon)->AddressList()};
        options.job = 3;
        options.rank = rank;
        options.world_size = kRanks;
        options.transport = "tcp";
        options.tcp_send_buffer = 4096;
        options.connect_timeout = options.join_timeout = options.collective_timeout = 20s;
        Worker worker(options);
        for (uint64_t c = 0; c < 2 && failures[rank].empty(); ++c) {
          tools::SyntheticSpec spec{1 << 20, 256, c ? 1.0 : 0.2, tools::Overlap::kRandom, kRanks, 40 + c};
          if (std::string f = ReduceAndCheck(worker, spec, rank, false); !f.empty()) {
            failures[rank] = f + " in collective " + std::to_string(c);
          }
        }
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  EXPECT_TRUE((*daemon)->Stop());
}

TEST(InProcess, BadTcpSendBufferVariableIsRefused) {
  WorkerOptions options;
  options.aggregators = {"127.0.0.1:1"};  // never contacted: the options are checked first
  for (const char* value : {"64k", "-1", "99999999999"}) {
    ::setenv("SPARSEREDUCE_TCP_SEND_BUFFER", value, 1);
    try {
      Worker worker(options);
      ADD_FAILURE() << "SPARSEREDUCE_TCP_SEND_BUFFER=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), "INVALID_ARGUMENT") << e.what();
      EXPECT_NE(std::string(e.what()).find("SPARSEREDUCE_TCP_SEND_BUFFER '" + std::string(value) + "'"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("SPARSEREDUCE_TCP_SEND_BUFFER");
}

}  // namespace
}  // namespace sparsereduce::testing
