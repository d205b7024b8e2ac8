// The worker's side of a codec for one collective (docs/PROTOCOL.md §11.3): which blocks of an fp32 tensor to send
// and their wire bytes, and how the decoded sums become the result. State that lives across collectives (3LC's
// error, top-k's residual, DIANA's h, the adaptive cost model) is kept per collective key in a KeyState owned by
// the Worker; an encoder changes it only in Finish, so a failed collective leaves it as it was (except for a change
// of the key's codec or element count, which drops the old state in Prepare).
//
// Pure computation: no I/O, no threads.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "codec/codec_spec.h"
#include "core/byte_buffer.h"

namespace sparsereduce::codec {

// Time of a collective as a function of the bytes it moves, fitted online (least squares over recent
// collectives): seconds ≈ a + b · bytes. The adaptive codec's cost C(k).
class CostModel {
 public:
  static constexpr size_t kSamples = 32;
  void Add(double bytes, double seconds);
  // a (seconds) and b (seconds per byte); defaults (1 ms, 1 ns/byte) until at least four samples whose byte
  // counts differ enough (n·Σx² − (Σx)² ≥ 0.04·(Σx)²) give a positive slope.
  double a() const { return a_; }
  double b() const { return b_; }
  size_t samples() const { return samples_.size(); }

 private:
  std::deque<std::pair<double, double>> samples_;
  double a_ = 1e-3, b_ = 1e-9;
};

// What a collective key remembers between collectives, per worker.
// The wire bytes of the blocks a collective sends, back to back, and where each block's are: reused from step to
// step (a fresh tensor-sized allocation per collective costs its page faults every time; the bytes are never
// zero-filled).
struct WireBlocks {
  ByteBuffer bytes;
  std::vector<uint64_t> offset;
  std::vector<uint32_t> length;  // 0: not sent
};

struct KeyState {
  Codec codec = Codec::kNone;
  uint64_t elements = 0;
  std::vector<float> error;   // 3LC: E; top-k / adaptive: the residual
  std::vector<float> h_own;   // DIANA: h_i
  std::vector<float> h_mean;  // DIANA: the replica of h = mean_i h_i, bitwise equal on every worker
  // The next value of `error` or `h_own` while a collective runs, swapped in when it succeeds; kept here so that a
  // steady training loop does not allocate (and fault in) a tensor-sized buffer every step.
  std::vector<float> staged;
  WireBlocks wire;
  uint64_t steps = 0;         // collectives completed with this key
  CostModel cost;             // adaptive
};

class TensorEncoder {
 public:
  virtual ~TensorEncoder() = default;

  // Marks in `send` (one byte per block, nonzero = send) the blocks this worker sends and prepares their wire
  // bytes; returns how many. `tensor` stays untouched.
  virtual uint64_t Prepare(std::span<const float> tensor, std::span<uint8_t> send) = 0;
  // The wire bytes of a block marked by Prepare.
  virtual std::span<const std::byte> Block(uint64_t block) const = 0;
  // `tensor` holds in every block the decoded sum the aggregators sent (zero where none came); makes it the
  // collective's result and advances the key's state. Allocates nothing and does not fail: the collective has
  // succeeded, and a failure half way would leave neither the input nor the result (Prepare allocates instead).
  virtual void Finish(std::span<float> tensor) = 0;

  // Blocks the codec chose to consider (top-k / adaptive: k), for statistics; 0 otherwise.
  virtual uint64_t selected_blocks() const { return 0; }
};

// `state` must outlive the encoder and be used by one collective at a time. `rank`, `world_size` and `seed` make
// DIANA's random choices reproducible.
std::unique_ptr<TensorEncoder> MakeEncoder(const CodecSpec& spec, uint32_t block_size, KeyState& state, uint32_t rank,
                                           uint32_t world_size, uint64_t seed);

// DIANA's step for blocks of `block_size` values when the spec leaves it 0: 1 / (ω + 1) with ω = √B − 1, the
// variance factor of block-wise ternary quantization (E‖Q(x) − x‖² ≤ ω‖x‖² for both the ∞- and the 2-norm).
float DianaDefaultAlpha(uint32_t block_size);

// Top-k's k of `blocks`: ceil(fraction · blocks), at least 1 and at most `blocks`, computed in double. The fraction
// is an fp32 (0.3 is 0.30000001): a product within its rounding (a relative 2^-24, and less than 2^-10) of an integer
// counts as that integer, so that 0.3 of 10 blocks is 3, not 4, and 1.0 of any count is all of them (in fp32, 1.0
// of 2^24 + 1 blocks left one out).
uint64_t TopKCount(float fraction, uint64_t blocks);

}  // namespace sparsereduce::codec
