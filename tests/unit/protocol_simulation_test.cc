// Property tests of the whole data plane (ColumnEngine + WorkerCollective) against a reference sum, bit-exact.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "simulation.h"
#include "tests/sanitized_build.h"

namespace sparsereduce::testing {
namespace {

enum class Overlap { kRandom, kIdentical, kDisjoint };

const char* OverlapName(Overlap o) {
  switch (o) {
    case Overlap::kRandom: return "random";
    case Overlap::kIdentical: return "identical";
    case Overlap::kDisjoint: return "disjoint";
  }
  return "?";
}

// Which blocks are nonzero on which rank. density < 0 means "exactly one block".
std::vector<std::vector<bool>> MakePattern(uint32_t W, uint64_t blocks, double density, Overlap overlap,
                                           uint32_t zero_workers, std::mt19937_64& rng) {
  std::vector<std::vector<bool>> nz(W, std::vector<bool>(blocks, false));
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<bool> common(blocks, false);
  if (density < 0) {
    if (blocks) common[rng() % blocks] = true;
  } else {
    for (uint64_t b = 0; b < blocks; ++b) common[b] = u(rng) < density;
  }
  for (uint32_t w = 0; w < W; ++w) {
    for (uint64_t b = 0; b < blocks; ++b) {
      switch (overlap) {
        case Overlap::kIdentical: nz[w][b] = common[b]; break;
        case Overlap::kDisjoint: nz[w][b] = common[b] && b % W == w; break;
        case Overlap::kRandom: nz[w][b] = density < 0 ? common[b] && w == 0 : u(rng) < density; break;
      }
    }
  }
  for (uint32_t w = 0; w < zero_workers && w < W; ++w) nz[W - 1 - w].assign(blocks, false);
  return nz;
}

template <typename T>
T RandomValue(std::mt19937_64& rng) {
  if constexpr (std::is_same_v<T, float>) {
    switch (rng() % 16) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return std::ldexp(static_cast<float>(rng() % 1000) - 500.0f, -140);  // denormal range
      default: return std::uniform_real_distribution<float>(-1000, 1000)(rng);
    }
  } else {
    return static_cast<T>(static_cast<uint32_t>(rng()));  // wraps on purpose
  }
}

template <typename T>
std::vector<std::vector<std::byte>> MakeTensors(const std::vector<std::vector<bool>>& nz, uint64_t n, uint32_t B,
                                                std::mt19937_64& rng) {
  std::vector<std::vector<std::byte>> tensors(nz.size(), std::vector<std::byte>(n * sizeof(T)));
  for (size_t w = 0; w < nz.size(); ++w) {
    T* data = reinterpret_cast<T*>(tensors[w].data());
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t b = i / B;
      if (nz[w][b]) {
        data[i] = RandomValue<T>(rng);
      } else if constexpr (std::is_same_v<T, float>) {
        data[i] = rng() % 7 == 0 ? -0.0f : 0.0f;  // zero blocks may hold -0.0
      }
    }
    // A block chosen nonzero must really be nonzero.
    for (uint64_t b = 0; b < nz[w].size(); ++b) {
      if (nz[w][b]) data[b * B] = static_cast<T>(1 + rng() % 100);
    }
  }
  return tensors;
}

// Dense reference: ((0 + x0) + x1) + ... in rank order.
template <typename T>
std::vector<std::byte> ReferenceSum(const std::vector<std::vector<std::byte>>& tensors, uint64_t n) {
  std::vector<std::byte> out(n * sizeof(T));
  T* acc = reinterpret_cast<T*>(out.data());
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      float s = 0.0f;
      for (const auto& t : tensors) s += reinterpret_cast<const float*>(t.data())[i];
      acc[i] = s;
    } else {
      uint32_t s = 0;
      for (const auto& t : tensors) s += static_cast<uint32_t>(reinterpret_cast<const T*>(t.data())[i]);
      acc[i] = static_cast<T>(s);
    }
  }
  return out;
}

struct Case {
  JobShape shape;
  uint64_t n;
  uint32_t block_size;
  DType dtype;
  double density;
  Overlap overlap;
  uint32_t zero_workers;
  uint64_t seed;
};

std::string Describe(const Case& c) {
  return c.shape.ToString() + " n=" + std::to_string(c.n) + " B=" + std::to_string(c.block_size) +
         " dtype=" + FindDType(c.dtype)->name + " density=" + std::to_string(c.density) +
         " overlap=" + OverlapName(c.overlap) + " zero_workers=" + std::to_string(c.zero_workers) +
         " seed=" + std::to_string(c.seed);
}

template <typename T>
void RunCase(const Case& c) {
  SCOPED_TRACE(Describe(c));
  std::mt19937_64 rng(c.seed);
  const uint64_t blocks = (c.n + c.block_size - 1) / c.block_size;
  auto nz = MakePattern(c.shape.world_size, blocks, c.density, c.overlap, c.zero_workers, rng);
  auto tensors = MakeTensors<T>(nz, c.n, c.block_size, rng);
  const auto reference = ReferenceSum<T>(tensors, c.n);

  CollectiveSpec spec{c.n, c.dtype, ReduceOp::kSum, c.block_size};
  ASSERT_TRUE(ValidateSpec(spec).ok());
  SimulationOutcome out = Simulate(c.shape, spec, tensors, c.seed * 31 + 1);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();

  uint64_t union_blocks = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    bool any = false;
    for (const auto& row : nz) any = any || row[b];
    union_blocks += any;
  }
  for (uint32_t w = 0; w < c.shape.world_size; ++w) {
    ASSERT_EQ(tensors[w], reference) << "rank " << w;
    // Zero blocks never travel: each rank uploads exactly its nonzero blocks and downloads the union.
    uint64_t own = 0;
    for (bool b : nz[w]) own += b;
    EXPECT_EQ(out.data_entries_sent[w], own) << "rank " << w;
    EXPECT_EQ(out.data_entries_received[w], union_blocks) << "rank " << w;
  }
}

void RunCase(const Case& c) {
  if (c.dtype == DType::kFloat32) {
    RunCase<float>(c);
  } else {
    RunCase<int32_t>(c);
  }
}

// Every nonzero pattern of 3 blocks over up to 3 ranks (4 blocks over up to 2: with K = 2 and a window of one
// frame, a rank whose frame waits in one column must still be able to send the block another column needs), for
// several shapes.
TEST(ProtocolSimulation, ExhaustiveSmallPatterns) {
  const uint32_t B = 2;
  const std::vector<JobShape> shapes = {
      {1, 1, 1, 1}, {2, 1, 1, 1}, {3, 1, 1, 1}, {2, 1, 1, 2}, {3, 2, 1, 1}, {2, 1, 2, 1}, {3, 1, 2, 2}, {2, 3, 1, 1},
  };
  for (const JobShape& shape : shapes) {
    for (uint64_t n : {uint64_t{5}, uint64_t{6}, uint64_t{8}}) {  // last block partial / full
      const uint64_t blocks = (n + B - 1) / B;
      const uint32_t bits = shape.world_size * static_cast<uint32_t>(blocks);
      if (bits > 9 && shape.world_size > 2) continue;
      for (uint32_t pattern = 0; pattern < (1u << bits); ++pattern) {
        std::vector<std::vector<bool>> nz(shape.world_size, std::vector<bool>(blocks));
        for (uint32_t w = 0; w < shape.world_size; ++w) {
          for (uint64_t b = 0; b < blocks; ++b) nz[w][b] = (pattern >> (w * blocks + b)) & 1;
        }
        SCOPED_TRACE(shape.ToString() + " n=" + std::to_string(n) + " pattern=" + std::to_string(pattern));
        std::mt19937_64 rng(pattern);
        auto tensors = MakeTensors<float>(nz, n, B, rng);
        const auto reference = ReferenceSum<float>(tensors, n);
        SimulationOutcome out = Simulate(shape, {n, DType::kFloat32, ReduceOp::kSum, B}, tensors, pattern);
        ASSERT_TRUE(out.status.ok()) << out.status.ToString();
        for (uint32_t w = 0; w < shape.world_size; ++w) {
          ASSERT_EQ(0, std::memcmp(tensors[w].data(), reference.data(), reference.size())) << "rank " << w;
        }
      }
    }
  }
}

class RandomizedSimulation : public ::testing::TestWithParam<uint64_t> {};

// Randomized grid: sizes 0, 1, B-1, B, B+1, large; densities 0, one block, 50 %, 100 %; all overlaps; some all-zero
// workers; W = 1..8; A = 1..4; several S and K; both dtypes.
TEST_P(RandomizedSimulation, MatchesReferenceSum) {
  std::mt19937_64 rng(GetParam());
  const uint32_t B = std::vector<uint32_t>{1, 3, 4, 16, 256}[rng() % 5];
  const std::vector<uint64_t> sizes = {0, 1, B - 1, B, B + 1, 37ull * B + 5, 300ull * B};
  const std::vector<double> densities = {0.0, -1.0, 0.5, 1.0, 0.05};
  for (int i = 0; i < 12; ++i) {
    Case c;
    c.shape.world_size = 1 + static_cast<uint32_t>(rng() % 8);
    c.shape.num_aggregators = 1 + static_cast<uint32_t>(rng() % 4);
    c.shape.slots = 1 + static_cast<uint32_t>(rng() % 4);
    c.shape.blocks_per_message = 1 + static_cast<uint32_t>(rng() % 8);
    c.shape.window = 1 + static_cast<uint32_t>(rng() % 3);
    c.n = sizes[rng() % sizes.size()];
    c.block_size = B;
    c.dtype = rng() % 2 ? DType::kFloat32 : DType::kInt32;
    c.density = densities[rng() % densities.size()];
    c.overlap = static_cast<Overlap>(rng() % 3);
    c.zero_workers = static_cast<uint32_t>(rng() % 3);
    c.seed = rng();
    RunCase(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomizedSimulation, ::testing::Range<uint64_t>(1, 41));

// A larger tensor with realistic parameters (the defaults of the library).
TEST(ProtocolSimulation, LargeTensorDefaults) {
  for (double density : {1.0, 0.1, 0.01}) {
    for (Overlap overlap : {Overlap::kRandom, Overlap::kIdentical}) {
      RunCase(Case{{4, 2, 4, 16}, 1'000'003, 256, DType::kFloat32, density, overlap, 0, 99});
    }
  }
}

// Contributions summed in rank order: the result does not depend on the delivery interleaving.
TEST(ProtocolSimulation, DeterministicAcrossInterleavings) {
  const JobShape shape{5, 2, 2, 3};
  const uint64_t n = 3000;
  std::mt19937_64 rng(5);
  auto nz = MakePattern(5, (n + 15) / 16, 0.6, Overlap::kRandom, 0, rng);
  auto inputs = MakeTensors<float>(nz, n, 16, rng);
  std::vector<std::byte> first;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto tensors = inputs;
    SimulationOutcome out = Simulate(shape, {n, DType::kFloat32, ReduceOp::kSum, 16}, tensors, seed);
    ASSERT_TRUE(out.status.ok()) << out.status.ToString();
    if (seed == 0) first = tensors[0];
    for (const auto& t : tensors) ASSERT_EQ(t, first);
  }
}

// A collective cut off at any point leaves every rank's tensor bit-identical to its input after Restore().
TEST(ProtocolSimulation, RestoreAfterFailureAtAnyPoint) {
  const JobShape shape{3, 2, 2, 3};
  const uint64_t n = 2000;
  std::mt19937_64 rng(11);
  auto nz = MakePattern(3, (n + 15) / 16, 0.5, Overlap::kRandom, 0, rng);
  auto inputs = MakeTensors<float>(nz, n, 16, rng);
  // -0.0 inside a nonzero block and a zero block holding only -0.0 must come back too.
  reinterpret_cast<float*>(inputs[1].data())[3] = -0.0f;
  bool results_landed = false;
  for (uint64_t cut = 0; cut < 400; cut += 7) {
    auto tensors = inputs;
    SimulationOutcome out = Simulate(shape, {n, DType::kFloat32, ReduceOp::kSum, 16}, tensors, cut, cut);
    if (out.status.ok()) break;  // ran to completion before the cut
    ASSERT_EQ(out.status.code(), StatusCode::kAborted);
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_EQ(tensors[w], inputs[w]) << "rank " << w << " cut " << cut;
      results_landed |= out.data_entries_received[w] > 0;
    }
  }
  // Else every cut came before any sum was written into a tensor, and "restored" would hold trivially.
  EXPECT_TRUE(results_landed);
}

// WorkerOptions::restore_on_failure = false: no block is copied, the sums are the same bit for bit (with a codec
// too), and a failed collective leaves each element holding either its input or its final sum.
TEST(ProtocolSimulation, UnrestorableCollectivesCopyNothingAndSumExactly) {
  const JobShape shape{3, 2, 2, 3};
  const uint64_t n = 3000;
  for (Overlap overlap : {Overlap::kRandom, Overlap::kIdentical, Overlap::kDisjoint}) {
    SCOPED_TRACE(OverlapName(overlap));
    std::mt19937_64 rng(21);
    auto nz = MakePattern(3, (n + 15) / 16, 0.4, overlap, 0, rng);
    auto inputs = MakeTensors<float>(nz, n, 16, rng);
    const auto reference = ReferenceSum<float>(inputs, n);
    for (bool restorable : {true, false}) {
      auto tensors = inputs;
      SimulationOutcome out =
          Simulate(shape, {n, DType::kFloat32, ReduceOp::kSum, 16}, tensors, 5, ~uint64_t{0}, nullptr, restorable);
      ASSERT_TRUE(out.status.ok()) << out.status.ToString();
      for (uint32_t w = 0; w < 3; ++w) {
        EXPECT_EQ(tensors[w], reference) << "rank " << w;
        if (restorable) {
          // each block it sent, and blocks of -0.0 that a RESULT overwrote
          EXPECT_GE(out.saved_blocks[w], out.data_entries_sent[w]) << "rank " << w;
          EXPECT_GT(out.data_entries_sent[w], 0u);
        } else {
          EXPECT_EQ(out.saved_blocks[w], 0u) << "rank " << w;
        }
      }
    }
    // fp16 on the wire: the codec path saves blocks when RESULTs land, unless unrestorable.
    CollectiveSpec fp16{n, DType::kFloat32, ReduceOp::kSum, 16};
    fp16.codec.codec = Codec::kFloat16;
    std::vector<std::vector<std::byte>> results;
    for (bool restorable : {true, false}) {
      auto tensors = inputs;
      SimulationOutcome out = Simulate(shape, fp16, tensors, 5, ~uint64_t{0}, nullptr, restorable);
      ASSERT_TRUE(out.status.ok()) << out.status.ToString();
      for (uint32_t w = 0; w < 3; ++w) EXPECT_EQ(out.saved_blocks[w] == 0, !restorable) << "rank " << w;
      results.push_back(tensors[0]);
    }
    EXPECT_EQ(results[0], results[1]);
  }
  std::mt19937_64 rng(23);
  auto nz = MakePattern(3, (n + 15) / 16, 0.5, Overlap::kRandom, 0, rng);
  auto inputs = MakeTensors<float>(nz, n, 16, rng);
  const auto reference = ReferenceSum<float>(inputs, n);
  bool some_overwritten = false;
  for (uint64_t cut = 0; cut < 400; cut += 13) {
    auto tensors = inputs;
    SimulationOutcome out =
        Simulate(shape, {n, DType::kFloat32, ReduceOp::kSum, 16}, tensors, cut, cut, nullptr, /*restorable=*/false);
    if (out.status.ok()) break;
    ASSERT_EQ(out.status.code(), StatusCode::kAborted);
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_EQ(out.saved_blocks[w], 0u);
      for (uint64_t i = 0; i < n; ++i) {
        const auto at = [&](const std::vector<std::byte>& t) { return std::span(t).subspan(4 * i, 4); };
        const bool is_input = std::ranges::equal(at(tensors[w]), at(inputs[w]));
        ASSERT_TRUE(is_input || std::ranges::equal(at(tensors[w]), at(reference)))
            << "rank " << w << " element " << i << " cut " << cut;
        some_overwritten |= !is_input;
      }
    }
  }
  EXPECT_TRUE(some_overwritten);  // the cuts did fall after RESULTs landed
}

// zero_bytes_scanned (what WorkerOptions::yield_while_scanning counts) grows as the slots start and ends at the
// bytes of the tensor's all-zero blocks, whether the partial last block is zero or not; also for a tensor shorter
// than a row of columns and for 2- and 8-byte elements.
TEST(WorkerCollectiveScan, ZeroBytesScannedCountTheZeroBlocks) {
  const JobShape shape{2, 3, 4, 8};
  struct Case {
    DType dtype;
    uint32_t element_size;
    uint64_t elements;
  };
  for (const Case c : {Case{DType::kFloat32, 4, 100'003}, Case{DType::kFloat16, 2, 1'000},
                       Case{DType::kFloat64, 8, 20'001}}) {
    const CollectiveSpec spec{c.elements, c.dtype, ReduceOp::kSum, 256};
    const uint64_t blocks = (spec.element_count + 255) / 256;
    for (const bool last_block_nonzero : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(c.dtype) << ", " << c.elements
                                      << " elements, last block nonzero: " << last_block_nonzero);
      std::vector<std::byte> tensor(spec.element_count * c.element_size, std::byte{0});
      uint64_t zero_bytes = 0, nonzero_blocks = 0;
      for (uint64_t b = 0; b < blocks; ++b) {
        const uint64_t begin = b * 256, end = std::min<uint64_t>(begin + 256, spec.element_count);
        const bool nonzero = b + 1 == blocks ? last_block_nonzero : b % 3 == 0;
        if (nonzero) {
          ++nonzero_blocks;
          tensor[(end - 1) * c.element_size] = std::byte{1};  // the lowest mantissa bit of the block's last element
        } else {
          zero_bytes += (end - begin) * c.element_size;
          tensor[begin * c.element_size + c.element_size - 1] = std::byte{0x80};  // -0.0: still a zero block
        }
      }
      WorkerCollective collective(shape, 1, 1, spec, tensor);
      EXPECT_EQ(collective.zero_bytes_scanned(), 0u);
      std::vector<OutgoingFrame> frames;
      uint64_t before = 0;
      for (uint32_t slot = 0; slot < shape.slots; ++slot) {
        for (uint32_t aggregator = 0; aggregator < shape.num_aggregators; ++aggregator) {
          collective.StartSlot(aggregator, slot, &frames);
          EXPECT_GE(collective.zero_bytes_scanned(), before);
          before = collective.zero_bytes_scanned();
        }
      }
      EXPECT_EQ(collective.zero_bytes_scanned(), zero_bytes);
      EXPECT_EQ(collective.nonzero_blocks(), nonzero_blocks);
    }
  }
}

// A steady loop hands each collective's memory to the next: nothing per-tensor is allocated again.
TEST(WorkerCollectiveScratch, NextCollectiveReusesTheMemory) {
  const JobShape shape{2, 1, 2, 4};
  const CollectiveSpec spec{100'000, DType::kFloat32, ReduceOp::kSum, 256};
  std::vector<std::byte> tensor(spec.element_count * 4, std::byte{1});  // every block nonzero
  CollectiveScratch scratch;
  const std::byte* backup = nullptr;
  const uint64_t* blocks = nullptr;
  const uint8_t* flags = nullptr;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    WorkerCollective collective(shape, 1, seq, spec, tensor, std::move(scratch));
    // The first frames of every slot (the announces and the first blocks).
    std::vector<OutgoingFrame> frames = collective.Start(0);
    ASSERT_FALSE(frames.empty());
    scratch = collective.ReleaseScratch();
    if (seq > 1) {
      EXPECT_EQ(scratch.flags.data(), flags);
      EXPECT_EQ(scratch.backup_blocks.data(), blocks);
      EXPECT_EQ(scratch.backup_data.data(), backup);
    }
    flags = scratch.flags.data();
    blocks = scratch.backup_blocks.data();
    if (scratch.backup_data.size() == 0) scratch.backup_data = ByteBuffer(1 << 20);
    backup = scratch.backup_data.data();
  }
}

// A worker's schedules, one per aggregator, share one table from column to (aggregator, slot, lane): a table per
// schedule held A times every column, 34 MB for this collective of 256 KiB with A = 64 (S = 8, K = 128, B = 1).
TEST(WorkerCollectiveMemory, ManyAggregatorsShareOneColumnTable) {
  if (kSanitizedBuild) GTEST_SKIP() << "the sanitizers' allocator does not report through mallinfo2";
  const JobShape shape{2, 64, 8, 128, 1};
  const CollectiveSpec spec{uint64_t{64} * 8 * 128, DType::kFloat32, ReduceOp::kSum, 1};
  std::vector<std::byte> tensor(spec.element_count * 4);
  const auto heap = [] {
    const struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
  };
  const size_t before = heap();
  WorkerCollective collective(shape, 1, 1, spec, tensor);
  const size_t grown = heap() - before;
  // The table (65536 columns x 12 bytes), the per-block flags and the 64 schedules' own state.
  EXPECT_LT(grown, size_t{4} << 20) << "the collective holds " << grown << " bytes";
}

}  // namespace
}  // namespace sparsereduce::testing
