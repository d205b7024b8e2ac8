// Throughput of the per-collective kernels, reported as bytes/s so they can be read against memcpy:
//   ./sparsereduce-kernels-bench --benchmark_min_time=0.1
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/block_scan.h"
#include "core/dtype.h"
#include "core/reduce_kernels.h"
#include "core/streaming_copy.h"

namespace sparsereduce {
namespace {

constexpr uint32_t kBlockSize = 256;  // elements, the default CollectiveSpec block size

size_t Floats(const benchmark::State& state) { return static_cast<size_t>(state.range(0)) / sizeof(float); }

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<std::byte> src(bytes, std::byte{1});
  std::vector<std::byte> dst(bytes, std::byte{0});
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void RunScan(benchmark::State& state, const std::vector<float>& data) {
  const DTypeInfo& f32 = *FindDType(DType::kFloat32);
  std::vector<uint8_t> flags((data.size() + kBlockSize - 1) / kBlockSize);
  uint64_t nonzero = 0;
  for (auto _ : state) {
    nonzero =
        ScanBlocks(reinterpret_cast<const std::byte*>(data.data()), data.size(), kBlockSize, f32, flags);
    benchmark::DoNotOptimize(nonzero);
    benchmark::DoNotOptimize(flags.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(data.size() * sizeof(float)));
  state.counters["nonzero_blocks"] = static_cast<double>(nonzero);
}

// Worst case for the scan: every block is zero, so every byte must be read.
void BM_ScanBlocksAllZero(benchmark::State& state) {
  std::vector<float> data(Floats(state), 0.0f);
  RunScan(state, data);
}

// Best case: the first element of every block is nonzero, so the early exit triggers after one 64-byte chunk.
void BM_ScanBlocksDense(benchmark::State& state) {
  std::vector<float> data(Floats(state), 1.0f);
  RunScan(state, data);
}

// dst += src over the whole buffer (the aggregator's per-block work). Bytes processed counts the src buffer.
void BM_ReduceSumFloat32(benchmark::State& state) {
  const ReduceKernels* kernels = FindReduceKernels(DType::kFloat32, ReduceOp::kSum);
  if (kernels == nullptr) {
    state.SkipWithError("no float32 sum kernels");
    return;
  }
  const size_t n = Floats(state);
  std::vector<float> src(n, 1.0f);
  std::vector<float> dst(n, 0.0f);
  for (auto _ : state) {
    kernels->accumulate(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * sizeof(float)));
}

// The worker's backup of its input blocks before a RESULT overwrites them: one block (256 fp32) at a time,
// out of a buffer larger than the cache into one the collective never reads again unless it fails. Plain
// memcpy against StreamingCopy's non-temporal stores.
template <void (*Copy)(void*, const void*, size_t)>
void BM_BackupBlocks(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  constexpr size_t kBlockBytes = kBlockSize * sizeof(float);
  std::vector<std::byte> tensor(bytes, std::byte{1});
  std::vector<std::byte> backup(bytes, std::byte{0});
  for (auto _ : state) {
    for (size_t at = 0; at + kBlockBytes <= bytes; at += kBlockBytes)
      Copy(backup.data() + at, tensor.data() + at, kBlockBytes);
    StreamingFence();
    benchmark::DoNotOptimize(backup.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
void PlainCopy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

#define SPARSEREDUCE_SIZES ->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->Unit(benchmark::kMicrosecond)

BENCHMARK(BM_Memcpy) SPARSEREDUCE_SIZES;
BENCHMARK(BM_ScanBlocksAllZero) SPARSEREDUCE_SIZES;
BENCHMARK(BM_ScanBlocksDense) SPARSEREDUCE_SIZES;
BENCHMARK(BM_ReduceSumFloat32) SPARSEREDUCE_SIZES;
BENCHMARK(BM_BackupBlocks<PlainCopy>)->Name("BM_BackupBlocksMemcpy") SPARSEREDUCE_SIZES;
BENCHMARK(BM_BackupBlocks<StreamingCopy>)->Name("BM_BackupBlocksStreaming") SPARSEREDUCE_SIZES;

}  // namespace
}  // namespace sparsereduce

BENCHMARK_MAIN();
