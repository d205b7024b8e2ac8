// Throughput of each codec's encode (the worker's Prepare: choose and encode the blocks) and decode (what the
// aggregator and the worker do with each received block), in bytes of fp32 input per second on one core:
//   ./sparsereduce-codec-bench --benchmark_min_time=0.2
// Target (issue 8): encode + decode >= 1 GB/s per core, so codecs never limit a 10 Gbit/s link with a few cores.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "codec/tensor_codec.h"
#include "codec/wire.h"

namespace sparsereduce {
namespace {

constexpr uint32_t kBlockSize = 256;
constexpr size_t kElements = size_t{4} << 20;  // 16 MiB of fp32: larger than the caches, like a gradient bucket

std::vector<float> Gradient() {
  std::vector<float> x(kElements);
  std::mt19937 random(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(random);
  return x;
}

CodecSpec SpecFor(Codec codec) {
  CodecSpec spec{codec};
  spec.fraction = 0.1f;
  return spec;
}

void BM_Encode(benchmark::State& state, Codec codec) {
  const std::vector<float> x = Gradient();
  codec::KeyState key;
  std::vector<uint8_t> send((kElements + kBlockSize - 1) / kBlockSize);
  uint64_t sent = 0;
  for (auto _ : state) {
    auto encoder = codec::MakeEncoder(SpecFor(codec), kBlockSize, key, 0, 4, 1);
    sent = encoder->Prepare(x, send);
    benchmark::DoNotOptimize(sent);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * sizeof(float)));
  state.counters["blocks_sent"] = static_cast<double>(sent);
}

// Decodes (accumulating, as the aggregator sums) every block the encoder produced.
void BM_Decode(benchmark::State& state, Codec codec) {
  const std::vector<float> x = Gradient();
  codec::KeyState key;
  const size_t blocks = (kElements + kBlockSize - 1) / kBlockSize;
  std::vector<uint8_t> send(blocks);
  auto encoder = codec::MakeEncoder(SpecFor(codec), kBlockSize, key, 0, 4, 1);
  encoder->Prepare(x, send);
  const codec::WireFormat format = UploadFormat(SpecFor(codec));
  std::vector<float> out(kElements, 0.0f);
  uint64_t decoded = 0;
  for (auto _ : state) {
    decoded = 0;
    for (size_t b = 0; b < blocks; ++b) {
      if (!send[b]) continue;
      (void)codec::DecodeFloats(format, encoder->Block(b), kBlockSize, out.data() + b * kBlockSize, true);
      ++decoded;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * decoded * kBlockSize * sizeof(float)));
}

#define SPARSEREDUCE_CODEC_BENCH(codec)                                                  \
  BENCHMARK_CAPTURE(BM_Encode, codec, Codec::codec)->Unit(benchmark::kMillisecond);     \
  BENCHMARK_CAPTURE(BM_Decode, codec, Codec::codec)->Unit(benchmark::kMillisecond)

SPARSEREDUCE_CODEC_BENCH(kFloat16);
SPARSEREDUCE_CODEC_BENCH(kBFloat16);
SPARSEREDUCE_CODEC_BENCH(kThreeLC);
SPARSEREDUCE_CODEC_BENCH(kDiana);
SPARSEREDUCE_CODEC_BENCH(kTopK);
SPARSEREDUCE_CODEC_BENCH(kAdaptive);

}  // namespace
}  // namespace sparsereduce

BENCHMARK_MAIN();
