// Writes the seed corpus of the fuzz targets: fuzz_seed_generator <corpus dir>, which then holds one folder per
// target. The seeds are small valid inputs (real frames from a WorkerCollective/ColumnEngine run, serialized control
// messages, and op sequences for the structure-aware targets); see fuzz/README.md for the input formats.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/column_engine.h"
#include "protocol/control.h"
#include "protocol/frame.h"
#include "protocol/worker_collective.h"

using namespace sparsereduce;
namespace fs = std::filesystem;

namespace {

fs::path g_root;

void Write(const std::string& target, const std::string& name, const void* data, size_t size) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}
void Write(const std::string& target, const std::string& name, const ByteBuffer& b) {
  Write(target, name, b.data(), b.size());
}
void Write(const std::string& target, const std::string& name, const std::vector<uint8_t>& b) {
  Write(target, name, b.data(), b.size());
}

void Check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

// The worked example of docs/PROTOCOL.md §4 (W=2, A=1, S=1, K=2, D=1, N=10, B=2), run for real; saves its frames
// (step r: every frame the workers have queued goes to the aggregator, then every RESULT to both workers).
void FrameSeeds() {
  const std::string t = "frame_decoder_fuzzer";
  const JobShape shape{2, 1, 1, 2, 1};
  const CollectiveSpec spec{10, DType::kFloat32, ReduceOp::kSum, 2};
  std::vector<float> x0(10, 0.0f), x1(10, 0.0f);
  x0[4] = 1.5f;  // block 2
  x0[7] = -2.0f;  // block 3
  x1[5] = 3.0f;  // block 2
  x1[8] = 0.25f;  // block 4
  WorkerCollective w0(shape, 9, 1, spec, std::as_writable_bytes(std::span(x0)));
  WorkerCollective w1(shape, 9, 1, spec, std::as_writable_bytes(std::span(x1)));
  ColumnEngine engine(shape, 0, 9, 1, spec);
  WorkerCollective* workers[2] = {&w0, &w1};

  std::vector<OutgoingFrame> pending[2] = {w0.Start(0), w1.Start(0)};
  for (int step = 0; step < 4 && !(engine.done() && w0.done() && w1.done()); ++step) {
    std::vector<ColumnEngine::Broadcast> out;
    for (uint32_t r = 0; r < 2; ++r) {
      for (size_t i = 0; i < pending[r].size(); ++i) {
        const OutgoingFrame& f = pending[r][i];
        const ByteBuffer frame = workers[r]->EncodeFrame(f);
        Write(t, "contribution_r" + std::to_string(step) + "_rank" + std::to_string(r) + "_" + std::to_string(i),
              frame);
        Result<FrameHeader> h = DecodeFrameHeader(frame.span());
        Check(h.status(), "header");
        ByteBuffer payload(h->payload_length);
        if (payload.size()) std::memcpy(payload.data(), frame.data() + kFrameHeaderSize, payload.size());
        Check(engine.OnContribution(r, *h, std::move(payload), &out), "engine");
      }
      pending[r].clear();
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const auto& b = out[i];
      Write(t, "result_r" + std::to_string(step) + "_" + std::to_string(i), *b.frame);
      Result<FrameHeader> h = DecodeFrameHeader(b.frame->span());
      for (uint32_t r = 0; r < 2; ++r) {
        Check(workers[r]->OnResult(0, *h, b.frame->span().subspan(kFrameHeaderSize), &pending[r]), "worker");
      }
    }
  }
  if (!engine.done() || !w0.done() || !w1.done()) {
    std::fprintf(stderr, "worked example did not finish\n");
    std::exit(1);
  }

  // An int32 block of 3 elements (12 data bytes + 4 padding) and a frame without entries.
  const std::vector<std::byte> data(12, std::byte{7});
  const Entry e{5, kEndOfColumn, 12};
  const std::span<const std::byte> spans[1] = {data};
  Write(t, "result_padded", EncodeDataFrame(FrameHeader{FrameType::kResult, 0, 2, 1, 4, 0}, {&e, 1}, spans));
  Write(t, "contribution_empty", EncodeDataFrame(FrameHeader{FrameType::kContribution, 0, 0, 1, 1, 0}, {}, {}));

  proto::ControlMessage hello;
  auto* h = hello.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_job_id(9);
  h->set_rank(1);
  h->set_world_size(2);
  h->set_num_aggregators(1);
  h->set_slots(1);
  h->set_blocks_per_message(2);
  h->set_window(1);
  Write(t, "control_hello", EncodeControl(hello));
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto(spec);
  Write(t, "control_collective_begin", EncodeControl(begin));
  proto::ControlMessage error;
  error.mutable_error()->set_code(proto::SPEC_MISMATCH);
  error.mutable_error()->set_message("spec mismatch");
  error.mutable_error()->set_seq(1);
  error.mutable_error()->add_ranks(0);
  Write(t, "control_error", EncodeControl(error));
}

void ControlSeeds() {
  const std::string t = "control_message_fuzzer";
  auto save = [&](const std::string& name, std::vector<uint8_t> shape, const proto::ControlMessage& m) {
    const std::string s = m.SerializeAsString();
    shape.insert(shape.end(), s.begin(), s.end());
    Write(t, name, shape);
  };
  proto::ControlMessage m;
  auto* h = m.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_job_id(77);
  h->set_rank(3);
  h->set_world_size(4);
  h->set_aggregator_index(1);
  h->set_num_aggregators(2);
  h->set_slots(2);
  h->set_blocks_per_message(8);
  h->set_window(2);
  save("hello", {0x10, 0x20, 3, 7}, m);

  m.Clear();
  m.mutable_job_ready()->set_protocol_version(kProtocolVersion);
  save("job_ready", {0, 0, 0, 0}, m);

  const struct {
    const char* name;
    CollectiveSpec spec;
    std::vector<uint8_t> shape;
  } begins[] = {
      {"begin_float32", {1000, DType::kFloat32, ReduceOp::kSum, 256}, {1, 1, 0, 3}},
      {"begin_int32_odd", {1001, DType::kInt32, ReduceOp::kSum, 7}, {3, 1, 2, 1}},
      {"begin_large_block", {uint64_t{1} << 40, DType::kFloat32, ReduceOp::kSum, 1u << 22}, {0, 0, 0, 40}},
      {"begin_unsupported_op", {10, DType::kFloat32, ReduceOp::kMax, 4}, {0, 0, 0, 0}},
      {"begin_unsupported_dtype", {10, DType::kFloat64, ReduceOp::kSum, 4}, {0, 0, 0, 0}},
      {"begin_empty", {0, DType::kInt32, ReduceOp::kSum, 1}, {2, 1, 1, 1}},
  };
  for (const auto& b : begins) {
    m.Clear();
    m.mutable_collective_begin()->set_seq(5);
    *m.mutable_collective_begin()->mutable_spec() = SpecToProto(b.spec);
    save(b.name, b.shape, m);
  }

  m.Clear();
  m.mutable_collective_accepted()->set_seq(5);
  save("accepted", {0, 0, 0, 0}, m);
  m.Clear();
  m.mutable_error()->set_code(proto::PEER_LEFT);
  m.mutable_error()->set_message("rank 2 left");
  m.mutable_error()->add_ranks(2);
  save("error", {0, 0, 0, 0}, m);
  m.Clear();
  m.mutable_goodbye();
  save("goodbye", {0, 0, 0, 0}, m);
}

// Op sequences for the structure-aware targets: `prefix` (setup bytes) then `ops` op/argument bytes drawn from
// `op_codes`, with random argument bytes.
std::vector<uint8_t> OpSeed(std::vector<uint8_t> prefix, std::initializer_list<uint8_t> op_codes, size_t ops,
                            uint64_t seed) {
  fuzz::Rng rng(seed);
  const std::vector<uint8_t> codes(op_codes);
  for (size_t i = 0; i < ops; ++i) {
    prefix.push_back(codes[rng.Below(static_cast<uint32_t>(codes.size()))]);
    const uint32_t args = 1 + rng.Below(3);
    for (uint32_t j = 0; j < args; ++j) prefix.push_back(static_cast<uint8_t>(rng.Next()));
  }
  return prefix;
}

// Like OpSeed, for ops that take exactly one argument byte (delivery ops while in sync), so that no argument is
// read as an op; 0xFF (the engine target's next collective under a codec) takes none.
std::vector<uint8_t> DeliverySeed(std::vector<uint8_t> prefix, std::initializer_list<uint8_t> op_codes, size_t ops,
                                  uint64_t seed) {
  fuzz::Rng rng(seed);
  const std::vector<uint8_t> codes(op_codes);
  for (size_t i = 0; i < ops; ++i) {
    const uint8_t op = codes[rng.Below(static_cast<uint32_t>(codes.size()))];
    prefix.push_back(op);
    if (op != 0xFF) prefix.push_back(static_cast<uint8_t>(rng.Next()));
  }
  return prefix;
}

void EngineSeeds() {
  const std::string t = "column_engine_fuzzer";
  // Setup bytes: W-1, A-1, S-1, K-1, N, B-1 (>= 0xE0: 9..72), dtype/window (bit 0: int32; D = 1 + (byte >> 1) % 3),
  // 4 seed bytes, W densities.
  Write(t, "worked_example", std::vector<uint8_t>{1, 0, 0, 1, 10, 1, 0, 1, 2, 3, 4, 128, 128});
  Write(t, "deliver_w3a2s2k2", OpSeed({2, 1, 1, 1, 60, 2, 0, 5, 6, 7, 8, 60, 200, 30}, {0, 1, 3, 4}, 60, 1));
  Write(t, "deliver_int32_w4a1s3k4", OpSeed({3, 0, 2, 3, 200, 7, 1, 9, 9, 9, 9, 90, 10, 250, 0}, {0, 3}, 80, 2));
  Write(t, "generated_w2a2s1k3", OpSeed({1, 1, 0, 2, 100, 0, 0, 1, 1, 2, 2, 70, 70}, {0, 3, 5}, 60, 3));
  Write(t, "mutated_w2a1s1k1", OpSeed({1, 0, 0, 0, 20, 3, 1, 4, 3, 2, 1, 255, 100}, {0, 3, 6}, 40, 4));
  Write(t, "raw_w3a1s2k2", OpSeed({2, 0, 1, 1, 37, 4, 0, 7, 7, 7, 7, 128, 128, 128}, {0, 3, 7}, 40, 5));
  Write(t, "wide_blocks_w3a1s1k2", OpSeed({2, 0, 0, 1, 200, 0xF7, 0, 2, 7, 1, 8, 160, 40, 250}, {0, 3}, 60, 7));
  Write(t, "sparse_w4a2s3k4", OpSeed({3, 1, 2, 3, 180, 1, 0, 3, 1, 4, 1, 8, 0, 16, 4}, {0, 1, 2, 3, 4}, 100, 6));
  Write(t, "window2_w3a1s2k2", OpSeed({2, 0, 1, 1, 120, 1, 2, 4, 4, 2, 2, 200, 90, 160}, {0, 1, 2, 3, 4}, 100, 8));
  Write(t, "window3_int32_w2a2s1k3", OpSeed({1, 1, 0, 2, 150, 0, 5, 6, 1, 6, 1, 220, 220}, {0, 1, 3}, 100, 9));
  Write(t, "window3_generated_w4a1s1k4",
        OpSeed({3, 0, 0, 3, 200, 0, 4, 3, 3, 9, 9, 100, 150, 200, 250}, {5, 0, 3}, 80, 10));
  Write(t, "window2_mutated_raw_w2a1s2k1", OpSeed({1, 0, 1, 0, 40, 2, 2, 5, 5, 1, 1, 180, 180}, {0, 3, 6, 7}, 60, 18));

  // Codecs: byte 0 = (W-1) | selector << 2 (selector % 8: 3LC 0/3/7, fp16 1, bf16 2, DIANA 4, top-k 5, adaptive 6),
  // then the parameter and flag bytes after byte 6 (fuzz_common.h ReadCodec). Op 0xFF drains the collective and
  // starts the next one with the codec state carried over (3LC's error memory on the aggregators).
  Write(t, "fp16_w2a1s1k2", DeliverySeed({1 | 1 << 2, 0, 0, 1, 60, 3, 0, 0, 0, 1, 2, 3, 4, 160, 160}, {0, 1, 3, 4}, 60, 30));
  Write(t, "bf16_w3a2s2k2", DeliverySeed({2 | 2 << 2, 1, 1, 1, 90, 2, 2, 0, 0, 5, 6, 7, 8, 200, 90, 160}, {0, 1, 3, 4}, 80, 31));
  Write(t, "3lc_w2a1s1k2_two_collectives",
        DeliverySeed({1 | 3 << 2, 0, 0, 1, 80, 4, 0, 128, 0, 2, 4, 6, 8, 200, 200}, {0, 1, 3, 4, 0xFF}, 90, 32));
  Write(t, "3lc_w3a2s1k3_two_collectives_wide",
        DeliverySeed({2 | 3 << 2, 1, 0, 2, 200, 0xE7, 2, 40, 0, 1, 3, 5, 7, 220, 180, 250}, {0, 1, 2, 3, 4, 0xFF}, 120, 33));
  Write(t, "3lc_generated_garbage_w2a1s2k2",
        OpSeed({1 | 7 << 2, 0, 1, 1, 70, 5, 0, 0, 0x20, 9, 9, 9, 9, 180, 180}, {5, 5, 6, 0xFF}, 70, 34));
  Write(t, "3lc_fp32_results_w2a1s1k1", DeliverySeed({1 | 3 << 2, 0, 0, 0, 40, 2, 0, 255, 1, 4, 4, 4, 4, 200, 120}, {0, 3, 0xFF}, 60, 35));
  Write(t, "3lc_tensor_scale_raw_w3a1s1k2",
        OpSeed({2 | 3 << 2, 0, 0, 1, 50, 3, 2, 10, 2, 7, 7, 1, 1, 128, 128, 128}, {0, 3, 6, 7}, 60, 36));
  Write(t, "diana_l2_w3a1s2k2", DeliverySeed({2 | 4 << 2, 0, 1, 1, 100, 3, 0, 7, 1, 8, 7, 6, 5, 220, 200, 180}, {0, 1, 3, 4, 0xFF}, 90, 37));
  Write(t, "diana_generated_w2a2s1k2", OpSeed({1 | 4 << 2, 1, 0, 1, 60, 1, 0, 0, 0, 3, 1, 4, 1, 150, 150}, {0, 5, 3}, 60, 38));
  Write(t, "topk_w2a1s2k2", DeliverySeed({1 | 5 << 2, 0, 1, 1, 80, 3, 0, 63, 0, 2, 2, 2, 2, 230, 230}, {0, 1, 3, 4, 0xFF}, 80, 39));
  Write(t, "adaptive_w2a1s1k2", DeliverySeed({1 | 6 << 2, 0, 0, 1, 60, 2, 0, 127, 0, 6, 6, 6, 6, 230, 100}, {0, 3, 0xFF}, 60, 40));
}

void WorkerSeeds() {
  const std::string t = "worker_collective_fuzzer";
  // Setup bytes: W-1, A-1, S-1, K-1, N, B-1 (>= 0xE0: 9..72), dtype/window (bit 0: int32; D = 1 + (byte >> 1) % 3),
  // 4 seed bytes, density, end mode.
  Write(t, "worked_example", std::vector<uint8_t>{1, 0, 0, 1, 10, 1, 0, 1, 2, 3, 4, 128, 0});
  Write(t, "valid_a2s2k2", OpSeed({0, 1, 1, 1, 90, 2, 0, 5, 6, 7, 8, 80, 0}, {0, 1, 2}, 60, 11));
  Write(t, "valid_int32_a1s3k4", OpSeed({0, 0, 2, 3, 200, 7, 1, 9, 8, 7, 6, 200, 0}, {0, 3}, 60, 12));
  Write(t, "mutated_a2s1k3", OpSeed({0, 1, 0, 2, 120, 0, 0, 1, 2, 1, 2, 60, 0}, {0, 5}, 40, 13));
  Write(t, "raw_a1s2k2", OpSeed({0, 0, 1, 1, 33, 3, 0, 3, 3, 3, 3, 128, 0}, {0, 6, 7}, 40, 14));
  // End mode: bit 0 Restore() at the end, bits 1-2 backup storage (none, too small, exact, larger).
  Write(t, "restore_small_storage_a2s3k4", OpSeed({0, 1, 2, 3, 150, 1, 0, 2, 4, 6, 8, 100, 3}, {0, 1}, 30, 15));
  Write(t, "restore_exact_storage_a1s2k1", OpSeed({0, 0, 1, 0, 64, 0xF3, 0, 5, 4, 3, 2, 90, 5}, {0, 5}, 20, 16));
  Write(t, "large_storage_wide_blocks", OpSeed({0, 1, 0, 1, 200, 0xFF, 1, 8, 8, 8, 8, 150, 6}, {0, 2}, 30, 17));
  Write(t, "window2_a1s2k2", OpSeed({0, 0, 1, 1, 160, 0, 2, 3, 1, 3, 1, 200, 0}, {0, 1, 2}, 80, 19));
  Write(t, "window3_int32_a2s1k4", OpSeed({0, 1, 0, 3, 200, 1, 5, 2, 7, 2, 7, 230, 0}, {0, 3, 5}, 80, 20));
  Write(t, "window3_raw_a1s1k1", OpSeed({0, 0, 0, 0, 30, 0, 4, 4, 2, 4, 2, 170, 0}, {0, 6, 7}, 40, 21));

  // Codecs (byte 0 = (W-1) | selector << 2, then a parameter and a flag byte after byte 6; see fuzz_common.h
  // ReadCodec). With a codec's download format, ops 0..4 take one more byte first: bit 0 set, arbitrary bodies.
  Write(t, "fp16_a2s1k2", OpSeed({1 | 1 << 2, 1, 0, 1, 80, 3, 0, 0, 0, 1, 2, 3, 4, 180, 0}, {0, 1, 2}, 60, 41));
  Write(t, "bf16_a1s2k3_restore", OpSeed({0 | 2 << 2, 0, 1, 2, 120, 2, 2, 0, 0, 5, 6, 7, 8, 200, 5}, {0, 5, 6}, 40, 42));
  Write(t, "3lc_a1s1k2", OpSeed({1 | 3 << 2, 0, 0, 1, 100, 4, 0, 128, 0, 2, 4, 6, 8, 230, 0}, {0, 1, 2}, 60, 43));
  Write(t, "3lc_wide_a2s1k3_garbage", OpSeed({2 | 7 << 2, 1, 0, 2, 200, 0xE7, 0, 40, 0, 1, 3, 5, 7, 220, 6}, {0, 1, 5, 6}, 60, 44));
  Write(t, "3lc_fp32_results_a1s2k2", OpSeed({1 | 3 << 2, 0, 1, 1, 60, 3, 0, 255, 1, 4, 4, 4, 4, 200, 0}, {0, 1, 7}, 50, 45));
  Write(t, "diana_a1s1k2", OpSeed({3 | 4 << 2, 0, 0, 1, 70, 3, 0, 7, 1, 8, 7, 6, 5, 220, 0}, {0, 1, 2}, 60, 46));
  Write(t, "topk_a2s1k2", OpSeed({1 | 5 << 2, 1, 0, 1, 80, 3, 0, 63, 0, 2, 2, 2, 2, 230, 2}, {0, 1, 5}, 60, 47));
  Write(t, "adaptive_a1s1k1", OpSeed({1 | 6 << 2, 0, 0, 0, 50, 2, 0, 127, 0, 6, 6, 6, 6, 230, 0}, {0, 1}, 50, 48));
}


// ring_channel_fuzzer: byte 0 the setup (bit 0 shm backend, bit 1 8 KiB ring, bit 2 recall copies, bit 3 recall
// handler from the start), byte 1 the length of the hook script at the end of the input, then ops (fuzz/README.md;
// the op numbers are ring_channel_fuzzer.cc's Op enum).
class RingProgram {
 public:
  enum : uint8_t {
    kWriteHeader, kWriteBytes, kWriteFill, kPublishWake, kPublishSilent, kHostileHead, kSetClosed, kClearClosed,
    kWake, kScribble, kRewind, kEndpoint, kTxConsume, kReadHeader, kReadPayload, kReadLent, kReadInto, kDiscard,
    kSetRecall, kRelease, kSend, kSettle, kAbort, kCloseAfterFlush, kDestroy
  };
  explicit RingProgram(uint8_t setup) : ops_{setup} {}
  RingProgram& Op(uint8_t op, std::initializer_list<uint8_t> args = {}) {
    ops_.push_back(op);
    ops_.insert(ops_.end(), args);
    return *this;
  }
  RingProgram& Raw(std::initializer_list<uint8_t> bytes) {
    ops_.insert(ops_.end(), bytes);
    return *this;
  }
  // A data frame (CONTRIBUTION) of `payload` generated bytes, published with a wake-up.
  RingProgram& Frame(uint16_t payload, uint8_t seed) {
    return Op(kWriteHeader, {1, static_cast<uint8_t>(payload), static_cast<uint8_t>(payload >> 8), seed, 1})
        .Op(kWriteFill, {static_cast<uint8_t>(payload), static_cast<uint8_t>(payload >> 8), seed})
        .Op(kPublishWake, {0});
  }
  // Reads a header and its payload (size 0 selects the header's payload_length) with `read_op`.
  RingProgram& Read(uint8_t read_op) {
    Op(kReadHeader).Op(kSettle);
    // Two targets, of 60 and (a 16-bit size) 80 bytes: a 140-byte payload.
    if (read_op == kReadInto) return Op(kReadInto, {1, 10, 60, 70, 80, 0}).Op(kSettle);
    return Op(read_op, {0}).Op(kSettle);
  }
  RingProgram& Hook(std::initializer_list<uint8_t> script) {
    hook_.insert(hook_.end(), script);
    return *this;
  }
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out = ops_;
    out.insert(out.begin() + 1, static_cast<uint8_t>(hook_.size()));
    out.insert(out.end(), hook_.begin(), hook_.end());
    return out;
  }

 private:
  std::vector<uint8_t> ops_;
  std::vector<uint8_t> hook_;
};

void RingSeeds() {
  const std::string t = "ring_channel_fuzzer";
  using P = RingProgram;
  for (uint8_t shm : {0, 1}) {
    const std::string b = shm ? "shm_" : "scripted_";
    // Frames read every way, lent payloads kept and given back (the recall handler from the start).
    P frames(0x08 | shm);
    frames.Frame(1000, 1).Read(P::kReadLent).Frame(300, 2).Read(P::kReadPayload).Frame(140, 3).Read(P::kReadInto)
        .Frame(2000, 4).Read(P::kDiscard)
        // The ring is full of what the first loan holds back: the reader, waiting for the next header, recalls it,
        // which gives the peer room. Then 2500 bytes that wrap around the ring's end (so copied, not lent) come in two
        // parts.
        .Op(P::kReadHeader).Op(P::kSettle)
        .Op(P::kWriteHeader, {1, 0xc4, 0x09, 5, 1}).Op(P::kWriteFill, {0xe8, 0x03, 5}).Op(P::kPublishWake, {0})
        .Op(P::kSettle).Op(P::kReadLent, {0}).Op(P::kSettle).Op(P::kWriteFill, {0xdc, 0x05, 6})
        .Op(P::kPublishWake, {0}).Op(P::kSettle).Op(P::kRelease, {0})
        .Frame(3000, 6).Read(P::kReadLent).Frame(0, 7).Read(P::kReadPayload).Op(P::kSetClosed, {1}).Op(P::kReadHeader)
        .Op(P::kSettle);
    Write(t, b + "frames_lent", frames.Bytes());
    // Payloads larger than the ring, read while the peer refills it; wraps around the end of the ring.
    P big(0x02 | shm);
    big.Op(P::kWriteHeader, {1, 0x00, 0x50, 9, 1}).Op(P::kPublishWake, {0}).Op(P::kReadHeader).Op(P::kSettle)
        .Op(P::kReadPayload, {0});
    for (uint8_t i = 0; i < 5; ++i) big.Op(P::kWriteFill, {0x00, 0x10, i}).Op(P::kPublishWake, {0}).Op(P::kSettle);
    big.Op(P::kSetRecall).Frame(5000, 10).Read(P::kReadLent).Frame(5000, 11).Read(P::kReadLent)
        .Frame(200, 12).Read(P::kReadLent).Op(P::kAbort).Op(P::kSettle);
    Write(t, b + "big_payloads_8k", big.Bytes());
    // Hostile positions: a head that moves back, past the free space, behind the tail, huge.
    for (uint8_t how : {0, 1, 2, 3, 4}) {
      P hostile(0x08 | shm);
      hostile.Frame(100, 20).Op(P::kReadHeader).Op(P::kSettle).Op(P::kWriteFill, {0x00, 0x02, 21})
          .Op(P::kHostileHead, {static_cast<uint8_t>(how | 8), 0x10, 0x00});
      if (how == 3) hostile.Raw({1, 2, 3, 4, 5, 6, 7, 0x80});  // its 64-bit head
      hostile.Op(P::kReadLent, {0}).Op(P::kSettle).Op(P::kReadHeader).Op(P::kSettle);
      Write(t, b + "hostile_head_" + std::to_string(how), hostile.Bytes());
    }
    // The peer ends: closed mid-frame, its TCP connection closes, bytes on TCP, its wake-up socket closes.
    for (uint8_t what : {0, 1, 2, 3}) {
      P end(shm);
      // A header and 200 of its 500 payload bytes; the reader waits for the rest when the peer goes.
      end.Op(P::kWriteHeader, {1, 0xf4, 0x01, 30, 1}).Op(P::kWriteFill, {200, 0, 31}).Op(P::kPublishWake, {0})
          .Op(P::kReadHeader).Op(P::kSettle).Op(P::kReadPayload, {0}).Op(P::kSettle).Op(P::kEndpoint, {what})
          .Op(P::kSettle).Op(P::kSetClosed, {1}).Op(P::kSettle).Op(P::kReadHeader).Op(P::kSettle);
      Write(t, b + "peer_ends_" + std::to_string(what), end.Bytes());
    }
    // Sends, the peer consuming them a few bytes at a time and waiting for data; then a hostile tail.
    P send(shm);
    send.Op(P::kSend, {0x00, 0x30, 1}).Op(P::kSend, {0x10, 0x00, 2}).Op(P::kEndpoint, {6});
    for (int i = 0; i < 6; ++i) send.Op(P::kTxConsume, {0, 0x00, 0x08}).Op(P::kSettle);
    send.Op(P::kCloseAfterFlush, {0}).Op(P::kTxConsume, {0, 0xff, 0xff}).Op(P::kSettle)
        .Op(P::kTxConsume, {7, 1, 2, 3, 4, 5, 6, 7, 8}).Op(P::kSend, {5, 0, 3}).Op(P::kSettle);
    Write(t, b + "send_and_tail", send.Bytes());
    // Lending until the recall, then the channel destroyed while payloads are lent.
    P recall(0x0c | shm);
    for (uint8_t i = 0; i < 6; ++i) recall.Frame(900, 40 + i).Read(P::kReadLent);
    recall.Op(P::kEndpoint, {5}).Frame(900, 50).Read(P::kReadPayload).Op(P::kDestroy, {0}).Op(P::kRelease, {1});
    Write(t, b + "recall_then_destroy", recall.Bytes());
  }
  // A payload to be lent that trickles in a byte at a time, each with a wake-up (op 3 + 2·25: one handler runs after
  // it), into the real ShmChannel: the lending read's wait loop yields to the executor every 256 rounds.
  P trickle(0x09);
  trickle.Op(P::kWriteHeader, {1, 0x00, 0x04, 70, 1}).Op(P::kPublishWake, {0}).Op(P::kReadHeader).Op(P::kSettle)
      .Op(P::kReadLent, {0}).Op(P::kSettle);
  for (int i = 0; i < 300; ++i) trickle.Op(P::kWriteBytes, {0, static_cast<uint8_t>(i)}).Op(P::kPublishWake + 50, {0});
  trickle.Op(P::kSettle).Op(P::kRelease, {0});
  Write(t, "shm_trickled_lent_payload", trickle.Bytes());
  // Frames queued behind a full send ring, then the peer frees it all at once: the pump copies them in rounds.
  for (uint8_t shm : {0, 1}) {
    P queue(shm);
    queue.Op(P::kSend, {0xff, 0x1f, 1}).Op(P::kSend, {0xff, 0x1f, 2});
    for (uint8_t i = 0; i < 24; ++i) queue.Op(P::kSend, {static_cast<uint8_t>(10 + i), 0, i});
    queue.Op(P::kEndpoint, {6}).Op(P::kSettle);
    for (int i = 0; i < 6; ++i) queue.Op(P::kTxConsume, {0, 0xff, 0xff}).Op(P::kSettle);
    Write(t, std::string(shm ? "shm_" : "scripted_") + "send_queue", queue.Bytes());
  }
  // The scripted peer acting between the reader's loads: it writes and publishes a header in pieces while the
  // reader waits, toggles producer_closed around the reload of the end-of-stream check, moves its head back.
  P concurrent(0x08);
  concurrent.Op(P::kReadHeader).Op(P::kSettle).Op(P::kWriteFill, {0x00, 0x04, 60}).Op(P::kPublishSilent, {0x01})
      .Op(P::kWake, {1}).Op(P::kSettle).Op(P::kReadLent, {0}).Op(P::kSettle).Op(P::kWake, {1}).Op(P::kSettle)
      .Op(P::kReadHeader).Op(P::kSettle);
  // Hook byte c: c % 4 == 0 nothing, else op (c >> 2) % 13 with its arguments from the hook script.
  concurrent.Hook({P::kWriteHeader << 2 | 1, 1, 0x00, 0x04, 60, 1, 0, P::kPublishSilent << 2 | 1, 0x29, 0,
                   P::kPublishWake << 2 | 1, 0, 0, P::kSetClosed << 2 | 1, 1, P::kClearClosed << 2 | 1,
                   P::kPublishWake << 2 | 1, 0, P::kSetClosed << 2 | 2, 1, P::kWriteBytes << 2 | 3, 3, 1, 2, 3, 4,
                   P::kPublishWake << 2 | 1, 0, P::kHostileHead << 2 | 1, 0, 2, 0});
  Write(t, "scripted_concurrent_peer", concurrent.Bytes());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  FrameSeeds();
  ControlSeeds();
  EngineSeeds();
  WorkerSeeds();
  RingSeeds();
  return 0;
}
