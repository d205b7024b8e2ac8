// Fuzzes the aggregator's ColumnEngine (protocol/column_engine.h; docs/PROTOCOL.md §4, §6, §7), structure-aware.
//
// The input first picks a small job and collective (fuzz::ReadSmallSetup: W 1..4, A 1..2, S 1..3, K 1..4,
// N 0..200, B 1..8, float32/int32, window D 1..3), a tensor seed and a per-rank density. The harness then builds, for
// every aggregator a < A, the engine under test and an independent reference model of the aggregator written from
// PROTOCOL.md (RefAggregator below), and one real WorkerCollective per rank over a generated tensor. Bits 2-7 of the
// first byte may name a codec (fuzz::ReadCodec: fp16, bf16, 3LC with its parameters, DIANA, top-k, adaptive); the
// model then checks and builds blocks in each direction's wire format (fuzz_common.h, from PROTOCOL.md §11), and op
// 0xFF drains the collective and starts the next one with the codec state (3LC error memory) carried over. The rest
// of the input is a sequence of operations, each one byte followed by its arguments:
//
//   op % 8 = 0,1,2  deliver the next CONTRIBUTION a real worker queued (argument: which (rank, aggregator, slot)
//                   queue); the fuzzer thus chooses the interleaving of all connections and slots
//            3,4    deliver the next RESULT queued for a worker (argument: which queue)
//            5      a CONTRIBUTION generated from the reference model for a (rank, aggregator, slot) that may send
//                   one (announce, or 1..K of its next blocks within the window): valid by construction, with
//                   input-chosen entry count and `next` indices and random block data
//            6      a mutated CONTRIBUTION: a queued worker frame (or a generated one) with 1..4 bytes changed, maybe
//                   sent as another rank
//            7      a raw CONTRIBUTION: input-chosen rank (possibly out of range), slot, entries and data lengths, or
//                   an arbitrary payload under a valid header
//
// Every frame goes through what the aggregator does before the engine (aggregator/job.cc CheckContribution: header
// decode, type, job, seq, payload limit), then to both the engine and the reference model. About half the payloads
// reach the engine lent (as from a shared-memory ring: tests/unit/test_lender.h scribbles over a payload when it
// comes back), and after an accepted frame the engine is sometimes told to give one rank's loans back
// (ReturnLoans); which ones follows from the input. Checked:
//  - the engine never crashes and never reads or writes out of bounds (ASan/UBSan);
//  - the engine accepts exactly the frames the reference model accepts, and frames from in-sync real workers are
//    always accepted; the run stops at the first rejection (the engine's state is unspecified after a violation);
//  - every RESULT frame decodes cleanly (DecodeFrameHeader + DecodeDataPayload), fits the worker's payload limit, and
//    the RESULTs of each CONTRIBUTION equal the reference model's, in order, bit for bit (float NaN payloads
//    excepted; see RefAggregator for the order);
//  - done() and AwaitedRanks() (when the engine has it) agree with the reference model;
//  - ReturnLoans(rank) leaves the engine no payload of that rank's on loan, and a done engine holds no loans;
//  - real workers accept every RESULT while only their own frames have been delivered; at the end of the input the
//    harness drains all queues, and then every engine and worker must be done and every tensor must equal the dense
//    reference sum ((0 + x_0) + x_1) + ... bit for bit (§6).
// Once a generated, mutated or raw frame has been accepted, the real workers no longer match the engines; from then
// on only the reference model drives the engines (the drain generates valid frames until the engines are done).
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/column_engine.h"
#include "protocol/frame.h"
#include "protocol/worker_collective.h"
#include "tests/unit/test_lender.h"

using namespace sparsereduce;
using fuzz::ByteReader;
using fuzz::PlainEntry;
using fuzz::Rng;

namespace {

constexpr uint64_t kJob = 0x5EED0000F00Dull;
constexpr uint64_t kSeq = 3;

// One aggregator of docs/PROTOCOL.md (version 3: announce, then streamed blocks), written from the document,
// deliberately without sharing code with protocol/column_engine.cc or protocol/layout.cc.
//
// RESULT order (mirrors what the engine emits per accepted CONTRIBUTION, so RESULTs are compared bit for bit):
// if the frame completed the announces, the announce reply first (one frame); then, for each column the frame
// made aggregatable — in the order its entries completed them, or in lane order after the announce reply — the
// column is aggregated repeatedly while its new `cur` has already arrived from every rank whose head it is; the
// entries are packed, in that order, into RESULTs of at most K entries (a new RESULT when one is full).
class RefAggregator {
 public:
  // `errors`: the 3LC error memory of this aggregator (per block, for the spec's key), kept across collectives.
  RefAggregator(const JobShape& shape, uint32_t aggregator, const CollectiveSpec& spec, uint64_t seq,
                std::map<uint64_t, std::vector<float>>* errors)
      : W_(shape.world_size),
        A_(shape.num_aggregators),
        S_(shape.slots),
        K_(shape.blocks_per_message),
        D_(shape.window),
        a_(aggregator),
        spec_(spec),
        seq_(seq),
        up_(fuzz::UploadWire(spec.codec)),
        down_(fuzz::DownloadWire(spec.codec)),
        errors_(errors),
        nb_(fuzz::NumBlocks(spec)),
        columns_(uint64_t{A_} * S_ * K_),
        shape_(shape),
        run_length_(fuzz::RunLength(shape, nb_)),
        slots_(S_) {
    for (uint32_t s = 0; s < S_; ++s) {
      Slot& sl = slots_[s];
      while (sl.lanes < K_ && Column(s, sl.lanes) < nb_) ++sl.lanes;
      sl.cur.assign(sl.lanes, 0);
      sl.expect.assign(sl.lanes, std::vector<uint64_t>(W_, kEndOfColumn));
      sl.queue.assign(sl.lanes, std::vector<std::deque<Held>>(W_));
      sl.announced.assign(W_, false);
      sl.streams.assign(W_, Stream{});
    }
  }

  uint64_t Column(uint32_t s, uint32_t k) const { return fuzz::ColumnOf(shape_, run_length_, a_, s, k); }

  bool Finished(uint32_t s) const {
    const Slot& sl = slots_[s];
    return sl.replied && std::all_of(sl.cur.begin(), sl.cur.end(), [](uint64_t c) { return c == kEndOfColumn; });
  }
  bool Active(uint32_t s) const { return slots_[s].lanes > 0 && !Finished(s); }

  bool Done() const {
    for (uint32_t s = 0; s < S_; ++s) {
      if (Active(s)) return false;
    }
    return true;
  }

  // Can `rank` send a valid CONTRIBUTION on slot `s` now (its announce, or blocks within the window)?
  bool CanSend(uint32_t rank, uint32_t s) const {
    const Slot& sl = slots_[s];
    if (!Active(s)) return false;
    if (!sl.announced[rank]) return true;
    if (sl.streams[rank].held >= D_) return false;
    return SmallestExpected(rank, s) != kEndOfColumn;
  }

  // Does some slot wait for `rank` (ColumnEngine::AwaitedRanks): its announce, or after the reply a block `cur`
  // of a column that is the rank's head there and that it has not sent.
  bool Awaits(uint32_t rank) const {
    for (uint32_t s = 0; s < S_; ++s) {
      const Slot& sl = slots_[s];
      if (!Active(s)) continue;
      if (!sl.replied) {
        if (!sl.announced[rank]) return true;
        continue;
      }
      for (uint32_t k = 0; k < sl.lanes; ++k) {
        if (sl.cur[k] != kEndOfColumn && sl.queue[k][rank].empty() && sl.expect[k][rank] == sl.cur[k]) return true;
      }
    }
    return false;
  }

  // The verdict on a decoded CONTRIBUTION (§7). An accepted one is recorded; `*results` receives the RESULT frames
  // the aggregator must broadcast, in order.
  bool Offer(uint32_t rank, uint32_t s, std::span<const EntryView> entries,
             std::vector<std::vector<std::byte>>* results) {
    results->clear();
    if (rank >= W_ || s >= S_ || !Active(s)) return false;
    Slot& sl = slots_[s];
    std::vector<uint32_t> ready;
    if (!sl.announced[rank]) {
      if (entries.size() != sl.lanes) return false;
      for (uint32_t k = 0; k < sl.lanes; ++k) {
        const EntryView& e = entries[k];
        const uint64_t c = Column(s, k);
        if (e.block != c || !e.data.empty() || !NextOk(e.next, c, c, /*inclusive=*/true)) return false;
      }
      for (uint32_t k = 0; k < sl.lanes; ++k) sl.expect[k][rank] = entries[k].next;
      sl.announced[rank] = true;
      if (std::find(sl.announced.begin(), sl.announced.end(), false) != sl.announced.end()) return true;
      // The announce reply.
      std::vector<PlainEntry> reply;
      for (uint32_t k = 0; k < sl.lanes; ++k) {
        sl.cur[k] = NewCur(sl, k);
        reply.push_back(PlainEntry{Column(s, k), sl.cur[k], {}});
      }
      sl.replied = true;
      results->push_back(fuzz::WriteDataFrame(FrameType::kResult, s, kJob, seq_, reply));
      for (uint32_t k = 0; k < sl.lanes; ++k) {
        if (sl.cur[k] != kEndOfColumn && Ready(sl, k)) ready.push_back(k);
      }
    } else {
      Stream& st = sl.streams[rank];
      if (st.held >= D_) return false;
      if (entries.empty() || entries.size() > K_) return false;
      std::vector<uint64_t> expect_after(sl.lanes);
      for (uint32_t k = 0; k < sl.lanes; ++k) expect_after[k] = sl.expect[k][rank];
      std::vector<uint32_t> lanes;
      for (const EntryView& e : entries) {
        // Increasing order with nothing skipped: the block is the smallest next the rank gave in any column.
        if (e.block != *std::min_element(expect_after.begin(), expect_after.end())) return false;
        if (e.block >= nb_) return false;
        const int k = LaneOf(s, e.block);
        if (k < 0) return false;
        if (expect_after[k] != e.block) return false;
        // The block's length in the upload format, and a well-formed body (§11).
        if (!fuzz::DecodeWireRef(up_, e.data, fuzz::ElementsOf(spec_, e.block), nullptr)) return false;
        if (!NextOk(e.next, e.block % columns_, e.block, /*inclusive=*/false)) return false;
        expect_after[k] = e.next;
        lanes.push_back(static_cast<uint32_t>(k));
      }
      // Accepted: queue the blocks.
      const uint32_t f = static_cast<uint32_t>(st.waiting.size());
      st.waiting.push_back(static_cast<uint32_t>(entries.size()));
      ++st.held;
      for (size_t i = 0; i < entries.size(); ++i) {
        const EntryView& e = entries[i];
        const uint32_t k = lanes[i];
        sl.queue[k][rank].push_back(
            Held{PlainEntry{e.block, e.next, std::vector<std::byte>(e.data.begin(), e.data.end())}, f});
        sl.expect[k][rank] = e.next;
        if (sl.replied && sl.cur[k] == e.block && Ready(sl, k) &&
            std::find(ready.begin(), ready.end(), k) == ready.end()) {
          ready.push_back(k);
        }
      }
    }
    std::vector<PlainEntry> pending;
    for (uint32_t k : ready) {
      while (sl.cur[k] != kEndOfColumn && Ready(sl, k)) {
        if (pending.size() == K_) {
          results->push_back(fuzz::WriteDataFrame(FrameType::kResult, s, kJob, seq_, pending));
          pending.clear();
        }
        pending.push_back(Aggregate(sl, k));
      }
    }
    if (!pending.empty()) results->push_back(fuzz::WriteDataFrame(FrameType::kResult, s, kJob, seq_, pending));
    return true;
  }

  // A valid CONTRIBUTION of `rank` on slot `s` (CanSend); `choose()` picks the entry count and each entry's next.
  // With a codec's upload format and bit 0 of `bodies` set, about half the blocks get arbitrary bytes of a length
  // the format allows instead of a well-formed body (the frame may then be invalid).
  template <typename Choose>
  std::vector<std::byte> Generate(uint32_t rank, uint32_t s, Choose choose, Rng& rng, uint8_t bodies = 0) const {
    const Slot& sl = slots_[s];
    std::vector<PlainEntry> entries;
    if (!sl.announced[rank]) {
      for (uint32_t k = 0; k < sl.lanes; ++k) {
        const uint64_t c = Column(s, k);
        entries.push_back(PlainEntry{c, PickNext(c, choose()), {}});
      }
    } else {
      // Always the smallest block the rank may send next, so that it never gets stuck (blocks increase).
      std::vector<uint64_t> expect(sl.lanes);
      for (uint32_t k = 0; k < sl.lanes; ++k) expect[k] = sl.expect[k][rank];
      const uint32_t count = 1 + choose() % K_;
      while (entries.size() < count) {
        const auto it = std::min_element(expect.begin(), expect.end());
        if (it == expect.end() || *it == kEndOfColumn) break;
        const uint64_t b = *it;
        PlainEntry e{b, PickNext(b + columns_, choose()), std::vector<std::byte>(fuzz::BlockBytesOf(spec_, b))};
        if (up_ != fuzz::Wire::kRaw) {
          e.data = fuzz::RandomWireBlock(up_, fuzz::ElementsOf(spec_, b), rng, (bodies & 1) && rng.Below(2));
        } else {
          for (size_t i = 0; i < e.data.size(); i += 4) {
            const uint32_t v = fuzz::RandomElement(rng, spec_.dtype, /*allow_any_bits=*/true);
            std::memcpy(e.data.data() + i, &v, 4);
          }
        }
        *it = e.next;
        entries.push_back(std::move(e));
      }
    }
    return fuzz::WriteDataFrame(FrameType::kContribution, s, kJob, seq_, entries);
  }

 private:
  struct Held {
    PlainEntry entry;
    uint32_t frame;  // index into Stream::waiting
  };
  struct Stream {
    uint32_t held = 0;    // frames with blocks not yet aggregated
    std::vector<uint32_t> waiting;  // [frame]: its blocks not yet aggregated
  };
  struct Slot {
    uint32_t lanes = 0;
    bool replied = false;
    std::vector<uint64_t> cur;                           // [lane]
    std::vector<std::vector<uint64_t>> expect;           // [lane][rank]: the `next` the rank gave last
    std::vector<std::vector<std::deque<Held>>> queue;    // [lane][rank]: received, not aggregated
    std::vector<bool> announced;                         // [rank]
    std::vector<Stream> streams;                         // [rank]
  };

  int LaneOf(uint32_t s, uint64_t block) const {
    const uint64_t c = block % columns_;
    for (uint32_t k = 0; k < slots_[s].lanes; ++k) {
      if (Column(s, k) == c) return static_cast<int>(k);
    }
    return -1;
  }

  static uint64_t Head(const Slot& sl, uint32_t k, uint32_t r) {
    return sl.queue[k][r].empty() ? sl.expect[k][r] : sl.queue[k][r].front().entry.block;
  }
  uint64_t NewCur(const Slot& sl, uint32_t k) const {
    uint64_t cur = kEndOfColumn;
    for (uint32_t r = 0; r < W_; ++r) cur = std::min(cur, Head(sl, k, r));
    return cur;
  }
  // Every rank whose head is `cur` has sent it.
  bool Ready(const Slot& sl, uint32_t k) const {
    for (uint32_t r = 0; r < W_; ++r) {
      if (sl.queue[k][r].empty() && sl.expect[k][r] == sl.cur[k]) return false;
    }
    return true;
  }

  // With a codec's format in some direction (§11.3): every contribution decoded to fp32 and summed in ascending
  // rank order, the first one being the sum's start, then encoded in the download format; 3LC results go through
  // the error memory of their block.
  std::vector<std::byte> AggregateCodec(const Slot& sl, uint32_t k, uint64_t cur) {
    const uint32_t n = fuzz::ElementsOf(spec_, cur);
    std::vector<float> sum(n), v(n);
    bool first = true;
    for (uint32_t r = 0; r < W_; ++r) {
      const std::deque<Held>& q = sl.queue[k][r];
      if (q.empty() || q.front().entry.block != cur) continue;
      FUZZ_CHECK(fuzz::DecodeWireRef(up_, q.front().entry.data, n, v.data()), "reference model: queued a bad block");
      for (uint32_t j = 0; j < n; ++j) sum[j] = first ? v[j] : sum[j] + v[j];
      first = false;
    }
    if (down_ != fuzz::Wire::kTernary) return fuzz::EncodeFixedRef(down_, sum.data(), n);
    // 3LC: T = sum + E_b, M = max|T| · s; q = ±1 from |T| >= M/2 on (compared in double, where M/2 is exact);
    // E_b <- T - M·q. M not finite: the block goes out with every q = +1 and a NaN scale, E_b unchanged.
    std::vector<float>& error = (*errors_)[cur];
    error.resize(n, 0.0f);
    std::vector<float> t(n);
    bool finite = true;
    float max_abs = 0.0f;
    for (uint32_t j = 0; j < n; ++j) {
      t[j] = sum[j] + error[j];
      if (!std::isfinite(t[j])) finite = false;
      max_abs = std::max(max_abs, std::fabs(t[j]));
    }
    const float m = max_abs * spec_.codec.sparsity;
    std::vector<int8_t> q(n, 1);
    if (!finite || !std::isfinite(m)) return fuzz::EncodeTernaryRef(q.data(), n, NAN, nullptr);
    for (uint32_t j = 0; j < n; ++j) {
      const double half = static_cast<double>(m) / 2;
      q[j] = m == 0.0f ? 0 : (t[j] >= half ? 1 : (t[j] <= -half ? -1 : 0));
      error[j] = t[j] - m * static_cast<float>(q[j]);
    }
    return fuzz::EncodeTernaryRef(q.data(), n, m, nullptr);
  }

  // Aggregates lane k's cur (§6: ascending rank order from all-zero bits) and moves it on.
  PlainEntry Aggregate(Slot& sl, uint32_t k) {
    const uint64_t cur = sl.cur[k];
    if (up_ != fuzz::Wire::kRaw || down_ != fuzz::Wire::kRaw) {
      std::vector<std::byte> data = AggregateCodec(sl, k, cur);
      for (uint32_t r = 0; r < W_; ++r) {
        std::deque<Held>& q = sl.queue[k][r];
        if (q.empty() || q.front().entry.block != cur) continue;
        Stream& st = sl.streams[r];
        if (--st.waiting[q.front().frame] == 0) --st.held;
        q.pop_front();
      }
      sl.cur[k] = NewCur(sl, k);
      return PlainEntry{cur, sl.cur[k], std::move(data)};
    }
    const uint32_t bytes = fuzz::BlockBytesOf(spec_, cur);
    std::vector<std::byte> sum(bytes);
    for (uint32_t r = 0; r < W_; ++r) {
      std::deque<Held>& q = sl.queue[k][r];
      if (q.empty() || q.front().entry.block != cur) continue;
      const PlainEntry& e = q.front().entry;
      for (uint32_t i = 0; i < bytes; i += 4) {
        if (spec_.dtype == DType::kFloat32) {
          float x, y;
          std::memcpy(&x, sum.data() + i, 4);
          std::memcpy(&y, e.data.data() + i, 4);
          x = x + y;
          std::memcpy(sum.data() + i, &x, 4);
        } else {
          uint32_t x, y;
          std::memcpy(&x, sum.data() + i, 4);
          std::memcpy(&y, e.data.data() + i, 4);
          x += y;
          std::memcpy(sum.data() + i, &x, 4);
        }
      }
      Stream& st = sl.streams[r];
      if (--st.waiting[q.front().frame] == 0) --st.held;
      q.pop_front();
    }
    sl.cur[k] = NewCur(sl, k);
    return PlainEntry{cur, sl.cur[k], std::move(sum)};
  }

  uint64_t SmallestExpected(uint32_t rank, uint32_t s) const {
    uint64_t b = kEndOfColumn;
    for (uint32_t k = 0; k < slots_[s].lanes; ++k) b = std::min(b, slots_[s].expect[k][rank]);
    return b;
  }

  bool NextOk(uint64_t next, uint64_t column, uint64_t after, bool inclusive) const {
    if (next == kEndOfColumn) return true;
    if (next >= nb_ || next % columns_ != column) return false;
    return inclusive ? next >= after : next > after;
  }

  // Block `first`, `first + C`, ... (those < NB), or END; `choice` indexes that list, the last index being END.
  uint64_t PickNext(uint64_t first, uint8_t choice) const {
    const uint64_t count = first < nb_ ? (nb_ - first + columns_ - 1) / columns_ : 0;
    const uint64_t i = choice % (count + 1);
    return i == count ? kEndOfColumn : first + i * columns_;
  }

  uint32_t W_, A_, S_, K_, D_, a_;
  CollectiveSpec spec_;
  uint64_t seq_;
  fuzz::Wire up_, down_;
  std::map<uint64_t, std::vector<float>>* errors_;
  uint64_t nb_, columns_;
  JobShape shape_;
  uint32_t run_length_;
  std::vector<Slot> slots_;
};

class Harness {
 public:
  Harness(const fuzz::SmallSetup& setup, ByteReader& in)
      : setup_(setup),
        W_(setup.shape.world_size),
        A_(setup.shape.num_aggregators),
        S_(setup.shape.slots),
        up_(fuzz::UploadWire(setup.spec.codec)),
        down_(fuzz::DownloadWire(setup.spec.codec)),
        rng_(in.U32()),
        loans_(Rng(rng_).Next() ^ 0x6C656E64),  // a stream of its own: rng_ draws what it drew before
        key_states_(W_),
        model_errors_(A_) {
    for (uint32_t r = 0; r < W_; ++r) densities_.push_back(in.U8());
    if (down_ == fuzz::Wire::kTernary) {
      // The aggregators' 3LC error memory for the spec's key, kept across the collectives of the input.
      const ColumnLayout layout(setup.shape, setup.spec.element_count, setup.spec.block_size, 4);
      for (uint32_t a = 0; a < A_; ++a) {
        error_memory_.push_back(std::make_unique<codec::ErrorMemory>(layout.BlocksOf(a), setup.spec.block_size));
      }
    }
    StartCollective();
  }

  // Op 0xFF with a codec: the current collective is drained (as at the end of the input) and the next one starts,
  // with fresh tensors and the codec state (the workers' KeyStates, the aggregators' 3LC error memory) carried over.
  // At most kMaxCollectives per input.
  static constexpr uint64_t kMaxCollectives = 4;
  bool NextCollective() {
    if (setup_.spec.codec.codec == Codec::kNone || seq_ + 1 >= kSeq + kMaxCollectives) return false;
    Drain();
    ++seq_;
    StartCollective();
    return true;
  }

  // A new collective (seq_): engines, models and real workers over tensors generated from the input's seed.
  void StartCollective() {
    const CollectiveSpec& spec = setup_.spec;
    engines_.clear();
    refs_.clear();
    workers_.clear();
    tensors_.clear();
    to_agg_.assign(size_t{W_} * A_ * S_, {});
    to_worker_.assign(size_t{W_} * A_ * S_, {});
    in_sync_ = true;
    for (uint32_t a = 0; a < A_; ++a) {
      engines_.push_back(std::make_unique<ColumnEngine>(setup_.shape, a, kJob, seq_, spec, nullptr,
                                                        error_memory_.empty() ? nullptr : error_memory_[a].get()));
      refs_.push_back(std::make_unique<RefAggregator>(setup_.shape, a, spec, seq_, &model_errors_[a]));
      FUZZ_CHECK(engines_[a]->done() == refs_[a]->Done(), "aggregator %u: done() of a fresh engine", a);
      CheckAwaited(*engines_[a], a);
    }
    for (uint32_t r = 0; r < W_; ++r) tensors_.push_back(fuzz::MakeTensor(spec, rng_, densities_[r]));
    // The dense reference result of §6: ((0 + x_0) + x_1) + ... in the dtype's arithmetic.
    expected_.assign(spec.element_count * 4, std::byte{0});
    for (uint64_t i = 0; i < spec.element_count; ++i) {
      for (uint32_t r = 0; r < W_; ++r) {
        if (spec.dtype == DType::kFloat32) {
          float x, y;
          std::memcpy(&x, expected_.data() + i * 4, 4);
          std::memcpy(&y, tensors_[r].data() + i * 4, 4);
          x = x + y;
          std::memcpy(expected_.data() + i * 4, &x, 4);
        } else {
          uint32_t x, y;
          std::memcpy(&x, expected_.data() + i * 4, 4);
          std::memcpy(&y, tensors_[r].data() + i * 4, 4);
          x += y;
          std::memcpy(expected_.data() + i * 4, &x, 4);
        }
      }
    }
    for (uint32_t r = 0; r < W_; ++r) {
      if (spec.codec.codec == Codec::kNone) {
        workers_.push_back(std::make_unique<WorkerCollective>(setup_.shape, kJob, seq_, spec, tensors_[r]));
      } else {
        const CodecContext context{&key_states_[r], r, kJob ^ seq_};
        workers_.push_back(std::make_unique<WorkerCollective>(setup_.shape, kJob, seq_, spec, tensors_[r],
                                                              CollectiveScratch{}, context));
      }
      for (uint32_t a = 0; a < A_; ++a) {
        for (const OutgoingFrame& f : workers_[r]->Start(a)) {
          FUZZ_CHECK(f.slot < S_, "Start produced slot %u", f.slot);
          to_agg_[Q(r, a, f.slot)].push_back(Bytes(workers_[r]->EncodeFrame(f)));
        }
      }
      // Every slot is started (and so scanned) now. fp16 / bf16 send the nonzero blocks too; 3LC, DIANA and
      // top-k choose their own.
      const Codec c = spec.codec.codec;
      if (c == Codec::kNone || c == Codec::kFloat16 || c == Codec::kBFloat16) {
        uint64_t nonzero = 0;
        for (uint64_t b = 0; b < fuzz::NumBlocks(spec); ++b) nonzero += fuzz::BlockIsNonzero(spec, tensors_[r], b);
        FUZZ_CHECK(workers_[r]->nonzero_blocks() == nonzero, "rank %u: nonzero_blocks %llu, expected %llu", r,
                   static_cast<unsigned long long>(workers_[r]->nonzero_blocks()),
                   static_cast<unsigned long long>(nonzero));
      }
    }
  }

  // Runs the operations of the input. Returns false once a frame was rejected (the run is over).
  bool Step(ByteReader& in) {
    const uint8_t op = in.U8();
    if (op == 0xFF && NextCollective()) return true;
    switch (op % 8) {
      case 0:
      case 1:
      case 2:
        return in_sync_ ? DeliverContribution(in.U8()) : GenerateAndFeed(in);
      case 3:
      case 4:
        return in_sync_ ? DeliverResult(in.U8()) : GenerateAndFeed(in);
      case 5:
        return GenerateAndFeed(in);
      case 6:
        return Mutated(in);
      default:
        return Raw(in);
    }
  }

  // End of input: run the collective to completion and check the outcome.
  void Drain() {
    if (in_sync_) {
      for (bool progress = true; progress;) {
        progress = false;
        for (size_t q = 0; q < to_agg_.size(); ++q) {
          while (!to_agg_[q].empty()) {
            progress = true;
            DeliverFromQueue(q);
          }
        }
        for (size_t q = 0; q < to_worker_.size(); ++q) {
          while (!to_worker_[q].empty()) {
            progress = true;
            DeliverResultFromQueue(q);
          }
        }
      }
      for (uint32_t a = 0; a < A_; ++a) FUZZ_CHECK(engines_[a]->done(), "aggregator %u not done after the drain", a);
      for (uint32_t r = 0; r < W_; ++r) {
        FUZZ_CHECK(workers_[r]->done(), "worker %u not done after the drain", r);
        workers_[r]->Finish();
        if (setup_.spec.codec.codec == Codec::kNone) {
          FUZZ_CHECK(fuzz::SameElements(tensors_[r], expected_, setup_.spec.dtype),
                     "rank %u: result differs from the dense reference sum", r);
        } else {
          // Lossy: not the dense sum, but every worker decoded the same RESULTs (and DIANA's replica of h is the
          // same on every worker), so all ranks hold the same result.
          FUZZ_CHECK(fuzz::SameElements(tensors_[r], tensors_[0], DType::kFloat32),
                     "rank %u: result differs from rank 0's under codec %s", r, CodecName(setup_.spec.codec.codec));
        }
      }
    } else {
      Rng choices(rng_.Next());
      for (bool progress = true; progress;) {
        progress = false;
        for (uint32_t a = 0; a < A_; ++a) {
          for (uint32_t r = 0; r < W_; ++r) {
            for (uint32_t s = 0; s < S_; ++s) {
              if (!refs_[a]->CanSend(r, s)) continue;
              progress = true;
              // Mostly END, so that the drain finishes in few frames.
              auto choose = [&] { return static_cast<uint8_t>(choices.Below(2) ? 0xFF : choices.Below(4)); };
              Feed(r, a, refs_[a]->Generate(r, s, choose, rng_), /*must_accept=*/true);
            }
          }
        }
      }
      for (uint32_t a = 0; a < A_; ++a) {
        FUZZ_CHECK(engines_[a]->done(), "aggregator %u not done after the drain", a);
      }
    }
  }

 private:
  size_t Q(uint32_t r, uint32_t a, uint32_t s) const { return (size_t{r} * A_ + a) * S_ + s; }
  void Unq(size_t q, uint32_t* r, uint32_t* a, uint32_t* s) const {
    *s = static_cast<uint32_t>(q % S_);
    *a = static_cast<uint32_t>(q / S_ % A_);
    *r = static_cast<uint32_t>(q / S_ / A_);
  }
  static std::vector<std::byte> Bytes(const ByteBuffer& b) { return {b.data(), b.data() + b.size()}; }

  template <typename Queue>
  static std::vector<size_t> NonEmpty(const std::vector<Queue>& queues) {
    std::vector<size_t> out;
    for (size_t q = 0; q < queues.size(); ++q) {
      if (!queues[q].empty()) out.push_back(q);
    }
    return out;
  }

  bool DeliverContribution(uint8_t choice) {
    const std::vector<size_t> ready = NonEmpty(to_agg_);
    if (ready.empty()) return true;
    DeliverFromQueue(ready[choice % ready.size()]);
    return true;
  }

  void DeliverFromQueue(size_t q) {
    uint32_t r, a, s;
    Unq(q, &r, &a, &s);
    std::vector<std::byte> frame = std::move(to_agg_[q].front());
    to_agg_[q].pop_front();
    Feed(r, a, frame, /*must_accept=*/true);
  }

  bool DeliverResult(uint8_t choice) {
    const std::vector<size_t> ready = NonEmpty(to_worker_);
    if (ready.empty()) return true;
    DeliverResultFromQueue(ready[choice % ready.size()]);
    return true;
  }

  void DeliverResultFromQueue(size_t q) {
    uint32_t r, a, s;
    Unq(q, &r, &a, &s);
    const std::shared_ptr<const ByteBuffer> frame = to_worker_[q].front();
    to_worker_[q].pop_front();
    Result<FrameHeader> h = DecodeFrameHeader(frame->span());
    FUZZ_CHECK(h.ok(), "RESULT header: %s", h.status().ToString().c_str());
    FUZZ_CHECK(h->payload_length <= workers_[r]->MaxResultPayload(), "RESULT payload above the worker's limit");
    std::vector<OutgoingFrame> next;
    const Status st = workers_[r]->OnResult(a, *h, frame->span().subspan(kFrameHeaderSize), &next);
    FUZZ_CHECK(st.ok(), "rank %u rejected a RESULT of aggregator %u slot %u: %s", r, a, s, st.ToString().c_str());
    for (const OutgoingFrame& f : next) {
      FUZZ_CHECK(f.slot == s, "contribution for slot %u after a RESULT on slot %u", f.slot, s);
      to_agg_[Q(r, a, f.slot)].push_back(Bytes(workers_[r]->EncodeFrame(f)));
    }
  }

  // Picks a (rank, aggregator, slot) that may send a CONTRIBUTION now; false if none may.
  bool PickOwed(uint8_t choice, uint32_t* r, uint32_t* a, uint32_t* s) const {
    std::vector<size_t> owed;
    for (uint32_t rr = 0; rr < W_; ++rr) {
      for (uint32_t aa = 0; aa < A_; ++aa) {
        for (uint32_t ss = 0; ss < S_; ++ss) {
          if (refs_[aa]->CanSend(rr, ss)) owed.push_back(Q(rr, aa, ss));
        }
      }
    }
    if (owed.empty()) return false;
    Unq(owed[choice % owed.size()], r, a, s);
    return true;
  }

  // With a codec's upload format a byte more: bit 0 set, some block bodies are arbitrary bytes (RandomWireBlock),
  // so the frame may be invalid (the model decides).
  bool GenerateAndFeed(ByteReader& in) {
    uint32_t r, a, s;
    if (!PickOwed(in.U8(), &r, &a, &s)) return true;
    in_sync_ = false;
    const uint8_t bodies = up_ != fuzz::Wire::kRaw ? in.U8() : 0;
    return Feed(r, a, refs_[a]->Generate(r, s, [&] { return in.U8(); }, rng_, bodies),
                /*must_accept=*/(bodies & 1) == 0);
  }

  bool Mutated(ByteReader& in) {
    uint32_t r = 0, a = 0, s = 0;
    std::vector<std::byte> frame;
    const std::vector<size_t> ready = NonEmpty(to_agg_);
    const uint8_t choice = in.U8();
    if (in_sync_ && !ready.empty()) {
      const size_t q = ready[choice % ready.size()];
      Unq(q, &r, &a, &s);
      frame = std::move(to_agg_[q].front());
      to_agg_[q].pop_front();
    } else if (PickOwed(choice, &r, &a, &s)) {
      frame = refs_[a]->Generate(r, s, [&] { return in.U8(); }, rng_);
      in_sync_ = false;
    } else {
      return Raw(in);
    }
    const uint8_t as_rank = in.U8();
    if (as_rank < 32) r = as_rank % (W_ + 1);  // occasionally from another (or an out-of-range) rank
    if (fuzz::MutateFrame(frame, in) || as_rank < 32) in_sync_ = false;
    return Feed(r, a, frame, /*must_accept=*/in_sync_);
  }

  bool Raw(ByteReader& in) {
    const uint32_t a = in.U8() % A_;
    const uint32_t r = in.U8() % (W_ + 1);
    const uint8_t style = in.U8();
    const uint32_t slot = in.U8() % (S_ + 1);
    const std::vector<std::byte> frame = fuzz::ArbitraryDataFrame(
        in, rng_, setup_.spec, setup_.shape.blocks_per_message, FrameType::kContribution, slot, kJob, seq_,
        /*structured=*/style % 2 == 0, up_);
    in_sync_ = false;
    return Feed(r, a, frame, /*must_accept=*/false);
  }

  // One CONTRIBUTION from `rank` to aggregator `a`, as the aggregator's connection and Job would hand it to the
  // engine. Returns false if it was rejected.
  bool Feed(uint32_t rank, uint32_t a, const std::vector<std::byte>& frame, bool must_accept) {
    Result<FrameHeader> h = DecodeFrameHeader(frame);
    FUZZ_CHECK(h.ok() || !must_accept, "valid frame's header rejected: %s", h.status().ToString().c_str());
    if (!h.ok()) return false;
    // aggregator/job.cc CheckContribution, and the stream framing (exactly payload_length bytes follow).
    if (h->type != FrameType::kContribution || h->job != kJob || h->seq != seq_ || h->slot >= setup_.shape.slots ||
        engines_[a]->SlotColumns(h->slot) == 0 || h->payload_length > engines_[a]->MaxContributionPayload(h->slot) ||
        h->entry_count > engines_[a]->SlotColumns(h->slot) || !engines_[a]->CheckWindow(rank, h->slot).ok() ||
        frame.size() != kFrameHeaderSize + uint64_t{h->payload_length}) {
      FUZZ_CHECK(!must_accept, "valid frame fails the Job's pre-checks");
      return false;
    }
    const std::span<const std::byte> bytes = std::span(frame).subspan(kFrameHeaderSize);
    ByteBuffer payload;
    // Empty payloads are lent too, though the ring never lends one: the engine must not depend on that (its copy
    // of a lent payload once passed an empty buffer's null data to memcpy).
    if (loans_.Below(2)) {
      payload = lender_->Lend(a, rank, bytes);
    } else {
      payload = ByteBuffer(bytes.size());
      if (!bytes.empty()) std::memcpy(payload.data(), bytes.data(), bytes.size());
    }

    std::vector<EntryView> views;
    std::vector<std::vector<std::byte>> want;
    const bool ref_ok = DecodeDataPayload(*h, payload.span(), &views).ok() &&
                        refs_[a]->Offer(rank, h->slot, views, &want);
    std::vector<ColumnEngine::Broadcast> out;
    const Status st = engines_[a]->OnContribution(rank, *h, std::move(payload), &out);
    // A codec's blocks are checked on arrival and decoded later: the engine copies a lent payload at once and gives
    // the loan back, whatever its verdict (the lender scribbles over it, so a later read would fail the checks).
    FUZZ_CHECK(up_ == fuzz::Wire::kRaw || lender_->Outstanding(a, rank) == 0,
               "aggregator %u kept a lent payload of rank %u under a codec", a, rank);
    FUZZ_CHECK(st.ok() == ref_ok, "aggregator %u, rank %u, slot %u: engine says %s, reference model says %s", a,
               rank, h->slot, st.ok() ? "OK" : st.ToString().c_str(), ref_ok ? "accept" : "reject");
    FUZZ_CHECK(st.ok() || !must_accept, "valid CONTRIBUTION rejected: %s", st.ToString().c_str());
    if (!st.ok()) return false;

    FUZZ_CHECK(out.size() == want.size(), "engine emitted %zu RESULT frames, reference model %zu", out.size(),
               want.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const ColumnEngine::Broadcast& b = out[i];
      FUZZ_CHECK(b.slot == h->slot, "RESULT for slot %u after a CONTRIBUTION on slot %u", b.slot, h->slot);
      CheckResult(a, b, want[i]);
      if (in_sync_) {
        for (uint32_t r = 0; r < W_; ++r) to_worker_[Q(r, a, b.slot)].push_back(b.frame);
      }
    }
    FUZZ_CHECK(engines_[a]->done() == refs_[a]->Done(), "aggregator %u: engine done()=%d, reference model %d", a,
               engines_[a]->done(), refs_[a]->Done());
    CheckAwaited(*engines_[a], a);
    if (loans_.Below(4) == 0) {
      const auto recalled = static_cast<uint32_t>(loans_.Below(W_));
      engines_[a]->ReturnLoans(recalled);
      FUZZ_CHECK(lender_->Outstanding(a, recalled) == 0, "aggregator %u kept payloads of rank %u after ReturnLoans",
                 a, recalled);
    }
    if (engines_[a]->done()) {
      for (uint32_t r = 0; r < W_; ++r) {
        FUZZ_CHECK(lender_->Outstanding(a, r) == 0, "aggregator %u is done but holds payloads of rank %u", a, r);
      }
    }
    return true;
  }

  // ColumnEngine::AwaitedRanks (if this version has it): the ranks some slot still waits for, ascending.
  template <typename Engine>
  void CheckAwaited(const Engine& engine, uint32_t a) const {
    if constexpr (requires { { engine.AwaitedRanks() } -> std::same_as<std::vector<uint32_t>>; }) {
      std::vector<uint32_t> want;
      for (uint32_t r = 0; r < W_; ++r) {
        if (refs_[a]->Awaits(r)) want.push_back(r);
      }
      FUZZ_CHECK(engine.AwaitedRanks() == want, "aggregator %u: AwaitedRanks differs from the reference model", a);
    }
  }

  void CheckResult(uint32_t a, const ColumnEngine::Broadcast& b, const std::vector<std::byte>& want) {
    const ByteBuffer& frame = *b.frame;
    Result<FrameHeader> h = DecodeFrameHeader(frame.span());
    FUZZ_CHECK(h.ok(), "RESULT header does not decode: %s", h.status().ToString().c_str());
    FUZZ_CHECK(h->type == FrameType::kResult && h->job == kJob && h->seq == seq_ && h->slot == b.slot,
               "RESULT header fields");
    FUZZ_CHECK(frame.size() == kFrameHeaderSize + uint64_t{h->payload_length}, "RESULT frame size");
    FUZZ_CHECK(h->payload_length <= workers_[0]->MaxResultPayload(), "RESULT payload %u above the limit %llu",
               h->payload_length, static_cast<unsigned long long>(workers_[0]->MaxResultPayload()));
    std::vector<EntryView> entries;
    const Status st = DecodeDataPayload(*h, frame.span().subspan(kFrameHeaderSize), &entries);
    FUZZ_CHECK(st.ok(), "RESULT payload does not decode: %s", st.ToString().c_str());
    FUZZ_CHECK(entries.size() >= 1 && entries.size() <= setup_.shape.blocks_per_message, "RESULT with %zu entries",
               entries.size());
    const size_t table = kFrameHeaderSize + size_t{kEntrySize} * entries.size();
    FUZZ_CHECK(frame.size() == want.size() && std::memcmp(frame.data(), want.data(), std::min(table, want.size())) == 0,
               "aggregator %u slot %u: RESULT header/entries differ from the reference model", a, b.slot);
    if (down_ == fuzz::Wire::kRaw) {
      FUZZ_CHECK(fuzz::SameElements(frame.span().subspan(table), std::span(want).subspan(table), setup_.spec.dtype),
                 "aggregator %u slot %u: RESULT data differs from the reference model", a, b.slot);
      return;
    }
    // The same entry table (compared above), so the same data lengths and padding; blocks compared per format.
    std::vector<EntryView> model;
    FUZZ_CHECK(DecodeDataPayload(*h, std::span(want).subspan(kFrameHeaderSize), &model).ok() &&
                   model.size() == entries.size(),
               "reference model's RESULT does not decode");
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].data.empty() && model[i].data.empty()) continue;  // the announce reply
      const uint32_t n = fuzz::ElementsOf(setup_.spec, entries[i].block);
      FUZZ_CHECK(fuzz::DecodeWireRef(down_, entries[i].data, n, nullptr),
                 "aggregator %u slot %u: RESULT block %llu is not a valid %s block", a, b.slot,
                 static_cast<unsigned long long>(entries[i].block), CodecName(setup_.spec.codec.codec));
      FUZZ_CHECK(fuzz::SameWireBlock(down_, entries[i].data, model[i].data),
                 "aggregator %u slot %u: RESULT block %llu differs from the reference model", a, b.slot,
                 static_cast<unsigned long long>(entries[i].block));
    }
  }

  fuzz::SmallSetup setup_;
  uint32_t W_, A_, S_;
  fuzz::Wire up_, down_;
  Rng rng_;
  Rng loans_;  // which payloads are lent and when loans are recalled
  uint64_t seq_ = kSeq;  // the running collective
  std::vector<uint8_t> densities_;  // per rank
  // Codec state across the collectives of one input: per rank, and per aggregator (the engine's and the model's).
  std::vector<codec::KeyState> key_states_;
  std::vector<std::unique_ptr<codec::ErrorMemory>> error_memory_;
  std::vector<std::map<uint64_t, std::vector<float>>> model_errors_;
  std::shared_ptr<testing::TestLender> lender_ = std::make_shared<testing::TestLender>();
  std::vector<std::unique_ptr<ColumnEngine>> engines_;
  std::vector<std::unique_ptr<RefAggregator>> refs_;
  std::vector<std::vector<std::byte>> tensors_;
  std::vector<std::byte> expected_;
  std::vector<std::unique_ptr<WorkerCollective>> workers_;
  std::vector<std::deque<std::vector<std::byte>>> to_agg_;                       // [Q(rank, aggregator, slot)]
  std::vector<std::deque<std::shared_ptr<const ByteBuffer>>> to_worker_;         // [Q(rank, aggregator, slot)]
  bool in_sync_ = true;  // the engines have seen only the real workers' frames
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  fuzz::SmallSetup setup = fuzz::ReadSmallSetup(in);
  fuzz::ReadCodec(in, setup);
  Harness harness(setup, in);
  while (!in.empty()) {
    if (!harness.Step(in)) return 0;
  }
  harness.Drain();
  return 0;
}
