#include "clone_probe.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/tensor_codec.h"
#include "codec/ternary.h"
#include "codec/three_lc.h"
#include "codec/wire.h"

namespace sparsereduce::clone_probe {
namespace {

template <typename T>
void Append(std::vector<uint8_t>& out, const T* data, size_t n) {
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + n * sizeof(T));
}

// Mixed magnitudes, exact zeros, -0.0, subnormals and, in some steps, an Inf or a NaN.
std::vector<float> Tensor(std::mt19937_64& random, size_t n, bool special) {
  std::vector<float> x(n);
  for (float& v : x) {
    const uint64_t r = random();
    v = static_cast<float>(std::normal_distribution<double>(0, 1)(random) * std::pow(10.0, double(r % 9) - 4.0));
    if (r % 11 == 0) v = 0.0f;
    if (r % 13 == 0) v = -0.0f;
    if (r % 17 == 0) v = 1e-40f;
  }
  if (special) {
    x[random() % n] = std::numeric_limits<float>::infinity();
    x[random() % n] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

}  // namespace

std::vector<uint8_t> Run(uint64_t seed) {
  std::vector<uint8_t> out;
  std::mt19937_64 random(seed);
  // The 3LC kernels and the ternary packing directly, for every length up to a few vector widths.
  for (size_t n = 0; n <= 70; ++n) {
    const std::vector<float> x = Tensor(random, n + 1, false), e = Tensor(random, n + 1, n % 9 == 0);
    const float max_abs = codec::MaxAbsWithError(x.data(), e.data(), n);
    Append(out, &max_abs, 1);
    std::vector<float> error(n);
    std::vector<int8_t> q(n);
    const bool any = codec::QuantizeWithError(x.data(), e.data(), error.data(), n, codec::ScaleOf(max_abs, 1.5f),
                                              q.data());
    out.push_back(any);
    Append(out, error.data(), n);
    std::vector<std::byte> wire(codec::MaxTernaryBytes(n));
    wire.resize(codec::EncodeTernary(q.data(), n, 1.0f, wire.data()));
    Append(out, wire.data(), wire.size());
  }
  // The encoders over several steps: 3LC per block and tensor-wide, DIANA with either norm, block sizes that are
  // and are not multiples of the vector width, tensors with a short tail block.
  for (const uint32_t block_size : {13u, 64u}) {
    for (int variant = 0; variant < 4; ++variant) {
      CodecSpec spec{variant < 2 ? Codec::kDiana : Codec::kThreeLC, seed, 1.25f};
      spec.diana_l2 = variant == 1;
      spec.tensor_scale = variant == 3;
      codec::KeyState state;
      const size_t n = 1000 + seed % 37;
      const uint64_t blocks = (n + block_size - 1) / block_size;
      for (int step = 0; step < 4; ++step) {
        const std::vector<float> x = Tensor(random, n, step == 2);
        auto encoder = codec::MakeEncoder(spec, block_size, state, 1, 2, seed);
        std::vector<uint8_t> send(blocks);
        encoder->Prepare(x, send);
        Append(out, send.data(), send.size());
        std::vector<float> sum(n, 0.0f);
        for (uint64_t b = 0; b < blocks; ++b) {
          if (!send[b]) continue;
          const auto block = encoder->Block(b);
          Append(out, block.data(), block.size());
          const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(block_size, n - b * block_size));
          (void)codec::DecodeTernary(block, len, sum.data() + b * block_size, false);
        }
        encoder->Finish(sum);
        Append(out, sum.data(), n);
        Append(out, state.error.data(), state.error.size());
        Append(out, state.h_own.data(), state.h_own.size());
        Append(out, state.h_mean.data(), state.h_mean.size());
      }
    }
  }
  return out;
}

}  // namespace sparsereduce::clone_probe
