// In-memory simulation of a whole job: W WorkerCollectives and A ColumnEngines exchanging encoded frames over
// per-connection FIFO queues, delivered in a random interleaving. Used by the property tests. CONTRIBUTIONs reach
// the engines as lent buffers, as the daemon reads them from a shared-memory ring, and the engines are asked at
// random moments to give a rank's loans back.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/block_scan.h"
#include "protocol/column_engine.h"
#include "protocol/worker_collective.h"
#include "test_lender.h"

namespace sparsereduce::testing {

// State that codecs keep across collectives: per worker (its KeyState for the spec's key) and per aggregator (3LC
// error memory). Kept by the caller to run several collectives in a row.
struct CodecStates {
  std::vector<codec::KeyState> workers;
  std::vector<std::unique_ptr<codec::ErrorMemory>> aggregators;
  uint64_t seed = 1;
};

struct SimulationOutcome {
  Status status;                               // first protocol error, if any
  std::vector<uint64_t> data_entries_sent;     // per worker: CONTRIBUTION entries that carried data
  std::vector<uint64_t> data_entries_received; // per worker: RESULT entries that carried data
  std::vector<uint64_t> bytes_sent;            // per worker
  std::vector<uint64_t> saved_blocks;          // per worker: blocks copied for Restore (at the end or the cut)
};

// Runs one collective over `tensors` (one byte buffer per rank, reduced in place). With `max_deliveries`, the run
// is cut off after that many frame deliveries (a failure): the workers then Restore() and the status is kAborted.
// `restorable` false: the workers keep no copies for Restore (WorkerOptions::restore_on_failure).
inline SimulationOutcome Simulate(const JobShape& shape, const CollectiveSpec& spec,
                                  std::vector<std::vector<std::byte>>& tensors, uint64_t seed,
                                  uint64_t max_deliveries = ~uint64_t{0}, CodecStates* states = nullptr,
                                  bool restorable = true) {
  const uint32_t W = shape.world_size, A = shape.num_aggregators;
  const uint64_t job = 42, seq = 7;
  SimulationOutcome outcome;
  outcome.data_entries_sent.assign(W, 0);
  outcome.data_entries_received.assign(W, 0);
  outcome.bytes_sent.assign(W, 0);
  outcome.saved_blocks.assign(W, 0);

  CodecStates local_states;
  if (states == nullptr) states = &local_states;
  if (states->workers.size() < W) states->workers.resize(W);
  if (states->aggregators.size() < A) states->aggregators.resize(A);
  std::vector<std::unique_ptr<ColumnEngine>> engines;
  for (uint32_t a = 0; a < A; ++a) {
    codec::ErrorMemory* memory = nullptr;
    if (spec.codec.codec == Codec::kThreeLC && !spec.codec.result_fp32) {
      const ColumnLayout layout(shape, spec.element_count, spec.block_size, 4);
      auto& m = states->aggregators[a];
      if (!m || m->blocks() != layout.BlocksOf(a))
        m = std::make_unique<codec::ErrorMemory>(layout.BlocksOf(a), spec.block_size);
      memory = m.get();
    }
    engines.push_back(std::make_unique<ColumnEngine>(shape, a, job, seq, spec, nullptr, memory));
  }
  std::vector<std::unique_ptr<WorkerCollective>> workers;
  for (uint32_t w = 0; w < W; ++w) {
    CodecContext context{&states->workers[w], w, states->seed};
    workers.push_back(std::make_unique<WorkerCollective>(shape, job, seq, spec, tensors[w], CollectiveScratch{},
                                                         context, restorable));
  }

  // Channel (w, a, to_aggregator) -> FIFO of frames, like one TCP connection per direction.
  std::map<std::tuple<uint32_t, uint32_t, bool>, std::deque<std::shared_ptr<const ByteBuffer>>> channels;
  auto send_contribution = [&](uint32_t w, uint32_t a, const OutgoingFrame& frame) {
    auto bytes = std::make_shared<const ByteBuffer>(workers[w]->EncodeFrame(frame));
    for (const Entry& e : frame.entries) outcome.data_entries_sent[w] += e.data_bytes ? 1 : 0;
    outcome.bytes_sent[w] += bytes->size();
    channels[{w, a, true}].push_back(std::move(bytes));
  };
  // Each worker starts its (aggregator, slot) pairs one at a time in the library's order (slot-major), at random
  // points among the deliveries, as the real worker does between its scans.
  const uint64_t pairs = uint64_t{A} * shape.slots;
  std::vector<uint64_t> next_pair(W, 0);
  constexpr uint32_t kStartNextPair = std::numeric_limits<uint32_t>::max();

  std::mt19937_64 rng(seed);
  std::mt19937_64 recalls(seed + 1);  // its own stream: the interleaving of a seed stays what it was
  auto lender = std::make_shared<TestLender>();
  const bool raw_upload = UploadFormat(spec.codec) == codec::WireFormat::kRaw;
  std::vector<ColumnEngine::Broadcast> broadcasts;
  std::vector<EntryView> entries;
  while (true) {
    std::vector<std::tuple<uint32_t, uint32_t, bool>> ready;
    for (auto& [key, queue] : channels) {
      if (!queue.empty()) ready.push_back(key);
    }
    for (uint32_t w = 0; w < W; ++w) {
      if (next_pair[w] < pairs) ready.emplace_back(w, kStartNextPair, false);
    }
    if (ready.empty()) break;
    if (max_deliveries-- == 0) {
      for (uint32_t r = 0; r < W; ++r) outcome.saved_blocks[r] = workers[r]->saved_blocks();
      for (auto& w : workers) w->Restore();
      outcome.status = Status(StatusCode::kAborted, "cut off");
      return outcome;
    }
    const auto key = ready[rng() % ready.size()];
    auto [w, a, to_aggregator] = key;
    if (a == kStartNextPair) {
      const uint64_t pair = next_pair[w]++;
      std::vector<OutgoingFrame> frames;
      const uint32_t a_of_pair = static_cast<uint32_t>(pair % A);
      workers[w]->StartSlot(a_of_pair, static_cast<uint32_t>(pair / A), &frames);
      for (const OutgoingFrame& frame : frames) send_contribution(w, a_of_pair, frame);
      continue;
    }
    auto frame = channels[key].front();
    channels[key].pop_front();
    Result<FrameHeader> header = DecodeFrameHeader(frame->span());
    if (!header.ok()) {
      outcome.status = header.status();
      return outcome;
    }
    std::span<const std::byte> payload = frame->span().subspan(kFrameHeaderSize);
    if (to_aggregator) {
      broadcasts.clear();
      Status st = engines[a]->OnContribution(w, *header, lender->Lend(a, w, payload), &broadcasts);
      if (!st.ok()) {
        outcome.status = st;
        return outcome;
      }
      // A codec's blocks are checked now and decoded later: the engine must not keep them in lent memory.
      if (!raw_upload && lender->Outstanding(a, w) != 0) {
        outcome.status = Status(StatusCode::kInternal, "engine kept a lent payload of a codec collective");
        return outcome;
      }
      if (recalls() % 8 == 0) {
        const auto rank = static_cast<uint32_t>(recalls() % W);
        engines[a]->ReturnLoans(rank);
        if (lender->Outstanding(a, rank) != 0) {
          outcome.status = Status(StatusCode::kInternal, "ReturnLoans kept a loan of rank " + std::to_string(rank));
          return outcome;
        }
      }
      for (const auto& b : broadcasts) {
        for (uint32_t r = 0; r < W; ++r) channels[{r, a, false}].push_back(b.frame);
      }
    } else {
      if (Status st = DecodeDataPayload(*header, payload, &entries); st.ok()) {
        for (const EntryView& e : entries) outcome.data_entries_received[w] += e.data.empty() ? 0 : 1;
      }
      std::vector<OutgoingFrame> frames;
      Status st = workers[w]->OnResult(a, *header, payload, &frames);
      if (!st.ok()) {
        outcome.status = st;
        return outcome;
      }
      for (const OutgoingFrame& frame : frames) send_contribution(w, a, frame);
    }
  }
  for (uint32_t a = 0; a < A; ++a) {
    if (!engines[a]->done()) {
      outcome.status = Status(StatusCode::kInternal, "aggregator " + std::to_string(a) + " not done");
      return outcome;
    }
  }
  if (lender->outstanding() != 0) {
    outcome.status = Status(StatusCode::kInternal, "finished engines still hold lent payloads");
    return outcome;
  }
  for (uint32_t w = 0; w < W; ++w) {
    if (!workers[w]->done()) {
      outcome.status = Status(StatusCode::kInternal, "worker " + std::to_string(w) + " not done");
      return outcome;
    }
    outcome.saved_blocks[w] = workers[w]->saved_blocks();
    workers[w]->Finish();
  }
  return outcome;
}

}  // namespace sparsereduce::testing
