// Fuzzes the worker's side of a collective (protocol/worker_collective.h, protocol/worker_schedule.h;
// docs/PROTOCOL.md §4, §6, §7) with fuzzer-provided RESULT frames, structure-aware.
//
// The input first picks a small job and collective (fuzz::ReadSmallSetup), a tensor seed and density, and an
// end-of-input mode. The harness builds one WorkerCollective over a tensor of exactly N elements (so that ASan
// catches any write outside it), starts it on every aggregator, and keeps an independent reference model of the
// worker (RefWorker below, written from PROTOCOL.md). Bits 2-7 of the first byte may name a codec (fuzz::ReadCodec);
// RESULT blocks then travel in its download format (EndResult decodes them into the tensor), and the blocks the worker
// sends come from an encoder of the harness's own. The rest of the input is a sequence of operations:
//
//   op % 8 = 0..4  a valid RESULT generated from the reference model for a slot that awaits one: the announce reply,
//                  or 1..K entries of input-chosen columns (a column possibly more than once), with input-chosen
//                  `next` indices (anything between the current block and this worker's own next) and random data
//            5     such a RESULT with 1..4 bytes changed, possibly delivered as another aggregator's
//            6     a structured RESULT with input-chosen slot, entries, indices and data lengths
//            7     arbitrary payload bytes under a valid RESULT header
//
// Frames pass the link's checks first (header decode, payload limit MaxResultPayload). Checked:
//  - no crash, no out-of-bounds access (ASan/UBSan), in particular no tensor write outside the tensor;
//  - RESULTs go through BeginResult, a copy into the targets it names, and EndResult, as the worker reads them;
//    they are accepted exactly when the reference model accepts them (valid generated RESULTs always); a RESULT
//    whose table BeginResult rejects leaves the tensor untouched, one EndResult rejects changes no byte outside
//    the blocks its table names (their data is read in place before the padding is checked); the run stops at
//    the first rejection;
//  - after each accepted RESULT: the CONTRIBUTIONs the worker asks to send next (0..n) equal the reference model's,
//    the tensor equals the reference model's, AggregatorDone()/done() agree; Start()'s frames (announce and first
//    window of blocks per slot) equal the model's;
//  - at the end of the input, the harness delivers valid RESULTs until the collective is done, then Finish(): every
//    own nonzero block was received, and the tensor holds exactly the received data, all-zero bits elsewhere;
//  - if WorkerCollective has Restore() (detected at compile time) it is called after a rejected RESULT, or at the
//    end of the input when the end mode asks for it, and must give back the original tensor bit for bit; if its
//    constructor takes recycled backup storage, the end mode also picks its size (none, too small, exact, larger).
//
// End mode byte: bit 0: at the end of the input Restore() instead of completing the collective; bits 1-2: backup
// storage size.
#include <algorithm>
#include <memory>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/frame.h"
#include "protocol/worker_collective.h"

using namespace sparsereduce;
using fuzz::ByteReader;
using fuzz::PlainEntry;
using fuzz::Rng;

namespace {

constexpr uint64_t kJob = 0xC0FFEE;
constexpr uint64_t kSeq = 11;

template <typename T>
concept HasRestore = requires(T& t) { t.Restore(); };

// The worker of docs/PROTOCOL.md (version 3: announce, then streamed blocks) on every aggregator, written from the
// document (no code shared with protocol/worker_schedule.cc or protocol/layout.cc). Also tracks the tensor the
// worker must end up with.
//
// Sending (§4): on start, a slot's announce, then its own nonzero blocks in increasing block order, K per frame
// (the last one possibly shorter), as long as fewer than D sent frames still hold blocks not aggregated; after
// every accepted RESULT on an unfinished slot, the frames the window admits again (often none).
class RefWorker {
 public:
  // `send`: without a codec, null (the own blocks are the nonzero ones); with one, its choice (per block, the
  // wire bytes of a block it sends, 0 for one it does not), from an encoder of the harness's own.
  RefWorker(const JobShape& shape, const CollectiveSpec& spec, std::span<const std::byte> tensor,
            const std::vector<uint32_t>* send)
      : A_(shape.num_aggregators),
        S_(shape.slots),
        K_(shape.blocks_per_message),
        D_(shape.window),
        spec_(spec),
        down_(fuzz::DownloadWire(spec.codec)),
        nb_(fuzz::NumBlocks(spec)),
        columns_(uint64_t{A_} * S_ * K_),
        shape_(shape),
        run_length_(fuzz::RunLength(shape, nb_)),
        tensor_(tensor.begin(), tensor.end()),
        received_(nb_, false),
        slots_(A_, std::vector<Slot>(S_)) {
    for (uint64_t b = 0; b < nb_; ++b) {
      own_.push_back(send ? (*send)[b] != 0 : fuzz::BlockIsNonzero(spec, tensor, b));
      up_bytes_.push_back(send ? (*send)[b] : fuzz::BlockBytesOf(spec, b));
    }
  }

  // The announces and first CONTRIBUTIONs of every slot of aggregator `a`, slot by slot.
  std::vector<OutgoingFrame> Start(uint32_t a) {
    std::vector<OutgoingFrame> frames;
    for (uint32_t s = 0; s < S_; ++s) {
      Slot& sl = slots_[a][s];
      for (uint32_t k = 0; k < K_ && Column(a, s, k) < nb_; ++k) {
        const uint64_t c = Column(a, s, k);
        sl.column.push_back(c);
        sl.lane.push_back(Lane{c, NextOwn(c)});
      }
      if (sl.lane.empty()) continue;
      for (uint64_t b = 0; b < nb_; ++b) {
        if (own_[b] && LaneOf(sl, b) >= 0) sl.own.push_back(b);
      }
      OutgoingFrame f{s, {}};
      for (const Lane& l : sl.lane) f.entries.push_back(Entry{l.cur, l.mine, 0});
      frames.push_back(std::move(f));
      SendBlocks(sl, s, &frames);
    }
    return frames;
  }

  // May a RESULT come on (a, s), i.e. can Generate make a valid one?
  bool Awaiting(uint32_t a, uint32_t s) const {
    const Slot& sl = slots_[a][s];
    if (!Active(sl)) return false;
    if (!sl.replied) return true;
    for (const Lane& l : sl.lane) {
      if (Eligible(sl, l)) return true;
    }
    return false;
  }
  bool AggregatorDone(uint32_t a) const {
    for (const Slot& sl : slots_[a]) {
      if (Active(sl)) return false;
    }
    return true;
  }
  bool Done() const {
    for (uint32_t a = 0; a < A_; ++a) {
      if (!AggregatorDone(a)) return false;
    }
    return true;
  }

  // §7, worker on a RESULT (the header's job/seq/type are checked by the caller).
  bool Check(uint32_t a, uint32_t s, std::span<const EntryView> entries) const {
    if (s >= S_) return false;
    Slot copy = slots_[a][s];
    return Advance(copy, entries);
  }

  // Applies an accepted RESULT; `*frames`: the CONTRIBUTIONs the worker must send next on the slot.
  void Apply(uint32_t a, uint32_t s, std::span<const EntryView> entries, std::vector<OutgoingFrame>* frames) {
    Slot& sl = slots_[a][s];
    FUZZ_CHECK(Advance(sl, entries), "reference model: Apply of a RESULT it rejects");
    for (const EntryView& e : entries) {
      if (e.data.empty()) continue;
      std::byte* block = tensor_.data() + e.block * spec_.block_size * 4;
      if (down_ == fuzz::Wire::kRaw) {
        std::memcpy(block, e.data.data(), e.data.size());
      } else {
        const uint32_t n = fuzz::ElementsOf(spec_, e.block);
        std::vector<float> v(n);
        FUZZ_CHECK(fuzz::DecodeWireRef(down_, e.data, n, v.data()), "reference model: applied a bad block");
        std::memcpy(block, v.data(), 4 * size_t{n});
      }
      received_[e.block] = true;
    }
    frames->clear();
    if (Active(sl)) SendBlocks(sl, s, frames);
  }

  // A valid RESULT for (a, s), which must be Awaiting; `choose()` picks the entry count, the columns and each
  // entry's next index (anything between the current block and this worker's own next). With a codec's download
  // format and bit 0 of `bodies` set, about half the blocks get arbitrary bytes of a length the format allows
  // (RandomWireBlock) instead of a well-formed body, so the RESULT may be invalid.
  template <typename Choose>
  std::vector<std::byte> Generate(uint32_t a, uint32_t s, Choose choose, Rng& rng, uint8_t bodies = 0) const {
    Slot sl = slots_[a][s];
    std::vector<PlainEntry> entries;
    if (!sl.replied) {
      for (const Lane& l : sl.lane) {
        std::vector<uint64_t> candidates;
        for (uint64_t b = l.cur; b < nb_ && b <= l.mine; b += columns_) candidates.push_back(b);
        if (l.mine == kEndOfColumn) candidates.push_back(kEndOfColumn);
        entries.push_back(PlainEntry{l.cur, candidates[choose() % candidates.size()], {}});
      }
      return fuzz::WriteDataFrame(FrameType::kResult, s, kJob, kSeq, entries);
    }
    const uint32_t count = 1 + choose() % K_;
    while (entries.size() < count) {
      std::vector<uint32_t> eligible;
      for (uint32_t k = 0; k < sl.lane.size(); ++k) {
        if (Eligible(sl, sl.lane[k])) eligible.push_back(k);
      }
      if (eligible.empty()) break;
      Lane& l = sl.lane[eligible[choose() % eligible.size()]];
      const uint64_t my_next = l.cur == l.mine ? NextOwn(l.cur + columns_) : l.mine;
      std::vector<uint64_t> candidates;
      for (uint64_t b = l.cur + columns_; b < nb_ && b <= my_next; b += columns_) candidates.push_back(b);
      if (my_next == kEndOfColumn) candidates.push_back(kEndOfColumn);
      FUZZ_CHECK(!candidates.empty(), "reference model: no valid next for block %llu",
                 static_cast<unsigned long long>(l.cur));
      PlainEntry e{l.cur, candidates[choose() % candidates.size()],
                   std::vector<std::byte>(fuzz::BlockBytesOf(spec_, l.cur))};
      if (down_ != fuzz::Wire::kRaw) {
        e.data = fuzz::RandomWireBlock(down_, fuzz::ElementsOf(spec_, l.cur), rng, (bodies & 1) && rng.Below(2));
      } else {
        for (size_t i = 0; i < e.data.size(); i += 4) {
          const uint32_t v = fuzz::RandomElement(rng, spec_.dtype, /*allow_any_bits=*/true);
          std::memcpy(e.data.data() + i, &v, 4);
        }
      }
      l.mine = my_next;
      l.cur = e.next;
      entries.push_back(std::move(e));
    }
    FUZZ_CHECK(!entries.empty(), "reference model: no RESULT entry possible on an awaiting slot");
    return fuzz::WriteDataFrame(FrameType::kResult, s, kJob, kSeq, entries);
  }

  // The tensor after Finish(): received blocks hold their data, all others all-zero bits (§6). Every own nonzero
  // block must have been received (the aggregation visits every column's nonzero blocks).
  std::vector<std::byte> Finished() const {
    std::vector<std::byte> t = tensor_;
    for (uint64_t b = 0; b < nb_; ++b) {
      if (received_[b]) continue;
      FUZZ_CHECK(!own_[b], "own nonzero block %llu was never received", static_cast<unsigned long long>(b));
      std::memset(t.data() + b * spec_.block_size * 4, 0, fuzz::BlockBytesOf(spec_, b));
    }
    return t;
  }

  const std::vector<std::byte>& tensor() const { return tensor_; }

 private:
  struct Lane {
    uint64_t cur;   // block aggregated next (END: finished)
    uint64_t mine;  // own next nonzero block not yet aggregated
  };
  struct Slot {
    bool replied = false;
    std::vector<uint64_t> column;  // [lane]
    std::vector<Lane> lane;
    std::vector<uint64_t> own;     // own nonzero blocks of the slot, increasing
    size_t sent = 0;               // own[0..sent) are sent
    std::vector<uint64_t> frame_first;    // first block of each frame sent
    std::vector<uint32_t> frame_waiting;  // its blocks not yet aggregated
    uint32_t held = 0;                    // frames with blocks not yet aggregated
  };

  static bool Active(const Slot& sl) {
    if (sl.lane.empty()) return false;
    if (!sl.replied) return true;
    return std::any_of(sl.lane.begin(), sl.lane.end(), [](const Lane& l) { return l.cur != kEndOfColumn; });
  }
  static bool Sent(const Slot& sl, uint64_t block) { return sl.sent > 0 && block <= sl.own[sl.sent - 1]; }
  // Can a RESULT carry the lane's cur now? (Not one of the worker's own blocks it has not sent.)
  static bool Eligible(const Slot& sl, const Lane& l) {
    return l.cur != kEndOfColumn && (l.cur != l.mine || Sent(sl, l.cur));
  }

  int LaneOf(const Slot& sl, uint64_t block) const {
    if (block >= nb_) return -1;
    for (size_t k = 0; k < sl.column.size(); ++k) {
      if (sl.column[k] == block % columns_) return static_cast<int>(k);
    }
    return -1;
  }

  bool NextOk(uint64_t next, uint64_t column, uint64_t after, bool inclusive) const {
    if (next == kEndOfColumn) return true;
    if (next >= nb_ || next % columns_ != column) return false;
    return inclusive ? next >= after : next > after;
  }

  // Checks a RESULT against `sl` and advances it (entry by entry); false: a protocol violation.
  bool Advance(Slot& sl, std::span<const EntryView> entries) const {
    if (!Active(sl)) return false;
    if (!sl.replied) {
      if (entries.size() != sl.lane.size()) return false;
      for (size_t k = 0; k < entries.size(); ++k) {
        const EntryView& e = entries[k];
        const Lane& l = sl.lane[k];
        if (e.block != l.cur || !e.data.empty() || !NextOk(e.next, l.cur, l.cur, /*inclusive=*/true) ||
            e.next > l.mine) {
          return false;
        }
      }
      for (size_t k = 0; k < entries.size(); ++k) sl.lane[k].cur = entries[k].next;
      sl.replied = true;
      return true;
    }
    if (entries.empty()) return false;
    for (const EntryView& e : entries) {
      const int k = LaneOf(sl, e.block);
      if (k < 0) return false;
      Lane& l = sl.lane[k];
      if (e.block != l.cur) return false;
      // The block's length in the download format, and a well-formed body (§11).
      if (!fuzz::DecodeWireRef(down_, e.data, fuzz::ElementsOf(spec_, e.block), nullptr)) return false;
      uint64_t my_next = l.mine;
      const bool mine = l.cur == l.mine;
      if (mine) {
        if (!Sent(sl, l.cur)) return false;
        my_next = NextOwn(l.cur + columns_);
      }
      if (!NextOk(e.next, e.block % columns_, e.block, /*inclusive=*/false) || e.next > my_next) return false;
      if (mine) {
        const size_t f = static_cast<size_t>(
            std::upper_bound(sl.frame_first.begin(), sl.frame_first.end(), e.block) - sl.frame_first.begin() - 1);
        if (--sl.frame_waiting[f] == 0) --sl.held;
      }
      l.mine = my_next;
      l.cur = e.next;
    }
    return true;
  }

  void SendBlocks(Slot& sl, uint32_t s, std::vector<OutgoingFrame>* frames) const {
    while (sl.sent < sl.own.size() && sl.held < D_) {
      OutgoingFrame f{s, {}};
      while (f.entries.size() < K_ && sl.sent < sl.own.size()) {
        const uint64_t b = sl.own[sl.sent++];
        f.entries.push_back(Entry{b, NextOwn(b + columns_), up_bytes_[b]});
      }
      sl.frame_first.push_back(f.entries.front().block);
      sl.frame_waiting.push_back(static_cast<uint32_t>(f.entries.size()));
      ++sl.held;
      frames->push_back(std::move(f));
    }
  }

  uint64_t Column(uint32_t a, uint32_t s, uint32_t k) const { return fuzz::ColumnOf(shape_, run_length_, a, s, k); }
  uint64_t NextOwn(uint64_t from) const {
    for (uint64_t b = from; b < nb_; b += columns_) {
      if (own_[b]) return b;
    }
    return kEndOfColumn;
  }

  uint32_t A_, S_, K_, D_;
  CollectiveSpec spec_;
  fuzz::Wire down_;
  uint64_t nb_, columns_;
  JobShape shape_;
  uint32_t run_length_;
  std::vector<std::byte> tensor_;
  std::vector<bool> own_, received_;
  std::vector<uint32_t> up_bytes_;  // per block: data_bytes of its CONTRIBUTION entry
  std::vector<std::vector<Slot>> slots_;  // [aggregator][slot]
};

bool SameFrame(const OutgoingFrame& x, const OutgoingFrame& y) {
  if (x.slot != y.slot || x.entries.size() != y.entries.size()) return false;
  for (size_t i = 0; i < x.entries.size(); ++i) {
    const Entry& a = x.entries[i];
    const Entry& b = y.entries[i];
    if (a.block != b.block || a.next != b.next || a.data_bytes != b.data_bytes) return false;
  }
  return true;
}

class Harness {
 public:
  Harness(const fuzz::SmallSetup& setup, ByteReader& in)
      : setup_(setup),
        rng_(in.U32()),
        original_(fuzz::MakeTensor(setup.spec, rng_, in.U8())),
        end_mode_(in.U8()),
        tensor_(new std::byte[original_.size()]),
        codec_seed_(setup.spec.codec.codec != Codec::kNone ? rng_.Next() : 0),
        ref_send_(RefCodecChoice()),
        ref_(setup.shape, setup.spec, original_, codec() ? &ref_send_ : nullptr) {
    if (!original_.empty()) std::memcpy(tensor_.get(), original_.data(), original_.size());
    worker_ = MakeWorker<WorkerCollective>(BackupStorage((end_mode_ >> 1) & 3));
    for (uint32_t a = 0; a < setup.shape.num_aggregators; ++a) {
      const std::vector<OutgoingFrame> got = worker_->Start(a);
      const std::vector<OutgoingFrame> want = ref_.Start(a);
      FUZZ_CHECK(got.size() == want.size(), "aggregator %u: %zu first frames, expected %zu", a, got.size(),
                 want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        FUZZ_CHECK(SameFrame(got[i], want[i]), "aggregator %u: first frame %zu differs", a, i);
        // The encoded CONTRIBUTION must be a well-formed frame.
        const ByteBuffer f = worker_->EncodeFrame(got[i]);
        Result<FrameHeader> h = DecodeFrameHeader(f.span());
        std::vector<EntryView> v;
        FUZZ_CHECK(h.ok() && DecodeDataPayload(*h, f.span().subspan(kFrameHeaderSize), &v).ok(),
                   "first frame does not decode");
      }
      FUZZ_CHECK(worker_->AggregatorDone(a) == ref_.AggregatorDone(a), "AggregatorDone(%u) after Start", a);
    }
  }

  // One operation; false once a RESULT was rejected (the run is over).
  bool Step(ByteReader& in) {
    const uint8_t op = in.U8();
    const uint32_t A = setup_.shape.num_aggregators;
    if (op % 8 <= 5) {
      uint32_t a, s;
      if (!PickAwaiting(in.U8(), &a, &s)) return true;
      // With a codec's download format, ops 0..4 read a byte more: bit 0 set, some block bodies are arbitrary.
      const uint8_t bodies = op % 8 < 5 && down_ != fuzz::Wire::kRaw ? in.U8() : 0;
      std::vector<std::byte> frame = ref_.Generate(a, s, [&] { return in.U8(); }, rng_, bodies);
      if (op % 8 < 5) return Feed(a, frame, /*must_accept=*/(bodies & 1) == 0);
      const uint8_t as_aggregator = in.U8();
      bool changed = fuzz::MutateFrame(frame, in);
      if (as_aggregator < 32 && as_aggregator % A != a) {
        a = as_aggregator % A;
        changed = true;
      }
      return Feed(a, frame, /*must_accept=*/!changed);
    }
    const uint32_t a = in.U8() % A;
    const uint32_t slot = in.U8() % (setup_.shape.slots + 1);
    const std::vector<std::byte> frame = fuzz::ArbitraryDataFrame(
        in, rng_, setup_.spec, setup_.shape.blocks_per_message, FrameType::kResult, slot, kJob, kSeq,
        /*structured=*/op % 8 == 6, down_);
    return Feed(a, frame, /*must_accept=*/false);
  }

  // End of input: either abort (Restore) or complete the collective with valid RESULTs, then Finish().
  void End() {
    if ((end_mode_ & 1) && !worker_->done() && TryRestore(*worker_)) return;
    Rng choices(rng_.Next());
    uint32_t a, s;
    while (PickAwaiting(static_cast<uint8_t>(choices.Next()), &a, &s)) {
      // Mostly the worker's own next block (the largest candidate), sometimes an earlier one.
      Feed(a, ref_.Generate(a, s, [&] { return static_cast<uint8_t>(choices.Below(2) ? 0xFF : choices.Below(4)); },
                            rng_),
           /*must_accept=*/true);
    }
    FUZZ_CHECK(worker_->done(), "worker not done after every slot received its last RESULT");
    worker_->Finish();
    std::vector<std::byte> want = ref_.Finished();
    if (codec()) {
      // The codec's last step (DIANA: W·h + S and the new h; the others leave the sums), by the harness's encoder.
      ref_encoder_->Finish(std::span(reinterpret_cast<float*>(want.data()), setup_.spec.element_count));
      FUZZ_CHECK(fuzz::SameElements(std::span(tensor_.get(), original_.size()), want, DType::kFloat32),
                 "tensor after Finish() is wrong (codec %s)", CodecName(setup_.spec.codec.codec));
    } else {
      FUZZ_CHECK(fuzz::SameBytes(tensor_.get(), want.data(), want.size()), "tensor after Finish() is wrong");
    }
  }

 private:
  // Recycled memory for Restore()'s copies, as the worker library hands it from one collective to the next:
  // none, too small, exactly the blocks that may need a copy, or larger; filled with garbage.
  ByteBuffer BackupStorage(uint32_t mode) const {
    uint64_t exact = 0;
    for (uint64_t b = 0; b < fuzz::NumBlocks(setup_.spec); ++b) {
      const uint64_t first = b * setup_.spec.block_size * 4;
      const uint64_t bytes = fuzz::BlockBytesOf(setup_.spec, b);
      exact += std::any_of(original_.begin() + first, original_.begin() + first + bytes,
                           [](std::byte x) { return x != std::byte{0}; });
    }
    const size_t sizes[4] = {0, 5, exact * setup_.spec.block_size * 4, 4096};
    ByteBuffer storage(sizes[mode]);
    if (storage.size()) std::memset(storage.data(), 0xA5, storage.size());
    return storage;
  }

  // A WorkerCollective over the tensor, with `storage` for its backups if this version takes it.
  // With a codec, the worker's KeyState and rank (the harness's encoder gets a KeyState of its own, equally fresh).
  template <typename WC>
  std::unique_ptr<WC> MakeWorker(ByteBuffer storage) {
    const std::span<std::byte> tensor(tensor_.get(), original_.size());
    if constexpr (std::is_constructible_v<WC, const JobShape&, uint64_t, uint64_t, const CollectiveSpec&,
                                          std::span<std::byte>, CollectiveScratch, CodecContext>) {
      CollectiveScratch scratch;
      scratch.backup_data = std::move(storage);
      return std::make_unique<WC>(setup_.shape, kJob, kSeq, setup_.spec, tensor, std::move(scratch),
                                  CodecContext{&key_state_, setup_.shape.world_size - 1, codec_seed_});
    } else if constexpr (std::is_constructible_v<WC, const JobShape&, uint64_t, uint64_t, const CollectiveSpec&,
                                                 std::span<std::byte>, ByteBuffer>) {
      return std::make_unique<WC>(setup_.shape, kJob, kSeq, setup_.spec, tensor, std::move(storage));
    } else {
      return std::make_unique<WC>(setup_.shape, kJob, kSeq, setup_.spec, tensor);
    }
  }

  bool codec() const { return setup_.spec.codec.codec != Codec::kNone; }

  // The tensor equals the model's: bit for bit; with a codec NaN equals NaN (fp16 NaNs decode to NaNs whose
  // payload the model and codec/half.cc, F16C or not, need not agree on).
  bool SameAsModel() const {
    return codec() ? fuzz::SameElements(std::span(tensor_.get(), original_.size()), ref_.tensor(), DType::kFloat32)
                   : fuzz::SameBytes(tensor_.get(), ref_.tensor().data(), original_.size());
  }

  // With a codec: the blocks it sends and their wire bytes, from an encoder of the harness's own (codec/, tested on
  // its own) over the same tensor, rank and seed; per block the wire bytes, 0 for a block it does not send.
  std::vector<uint32_t> RefCodecChoice() {
    if (!codec()) return {};
    const CollectiveSpec& spec = setup_.spec;
    ref_encoder_ = codec::MakeEncoder(spec.codec, spec.block_size, ref_key_state_, setup_.shape.world_size - 1,
                                      setup_.shape.world_size, codec_seed_);
    std::vector<uint8_t> send(fuzz::NumBlocks(spec));
    ref_encoder_->Prepare(std::span(reinterpret_cast<const float*>(original_.data()), spec.element_count), send);
    std::vector<uint32_t> bytes(send.size());
    for (uint64_t b = 0; b < send.size(); ++b) {
      if (!send[b]) continue;
      bytes[b] = static_cast<uint32_t>(ref_encoder_->Block(b).size());
      FUZZ_CHECK(bytes[b] > 0, "the codec sends block %llu without bytes", static_cast<unsigned long long>(b));
    }
    return bytes;
  }

  // Calls Restore() if WorkerCollective has it and checks that the original tensor is back.
  template <typename WC>
  bool TryRestore(WC& worker) {
    if constexpr (HasRestore<WC>) {
      worker.Restore();
      FUZZ_CHECK(fuzz::SameBytes(tensor_.get(), original_.data(), original_.size()),
                 "Restore() did not give back the original tensor");
      return true;
    } else {
      return false;
    }
  }

  bool PickAwaiting(uint8_t choice, uint32_t* a, uint32_t* s) const {
    std::vector<std::pair<uint32_t, uint32_t>> ready;
    for (uint32_t aa = 0; aa < setup_.shape.num_aggregators; ++aa) {
      for (uint32_t ss = 0; ss < setup_.shape.slots; ++ss) {
        if (ref_.Awaiting(aa, ss)) ready.emplace_back(aa, ss);
      }
    }
    if (ready.empty()) return false;
    std::tie(*a, *s) = ready[choice % ready.size()];
    return true;
  }

  // After a RESULT rejected by EndResult: its data was read in place before its padding (and a codec's block body)
  // was checked, so the blocks its entry table names with data may have changed; every other byte must be as
  // before.
  void CheckOnlyNamedBlocksChanged(const FrameHeader& h, std::span<const std::byte> payload) {
    std::vector<bool> may_change(original_.size(), false);
    std::vector<Entry> entries;
    const uint64_t table_bytes = uint64_t{h.entry_count} * kEntrySize;
    if (h.type == FrameType::kResult && table_bytes <= payload.size() &&
        DecodeEntryTable(h, payload.first(table_bytes), &entries).ok()) {
      const ColumnLayout layout(setup_.shape, setup_.spec.element_count, setup_.spec.block_size,
                                FindDType(setup_.spec.dtype)->size);
      for (const Entry& e : entries) {
        if (e.data_bytes == 0 || e.block >= layout.num_blocks()) continue;
        const uint64_t first = layout.BlockByteOffset(e.block);
        std::fill_n(may_change.begin() + first, layout.BlockBytes(e.block), true);
      }
    }
    for (size_t i = 0; i < original_.size(); i += 4) {
      // (With a codec, blocks decoded earlier may hold NaNs whose payloads differ from the model's.)
      FUZZ_CHECK(may_change[i] || (codec() ? fuzz::SameElements(std::span(tensor_.get() + i, 4),
                                                                 std::span(ref_.tensor()).subspan(i, 4),
                                                                 DType::kFloat32)
                                            : fuzz::SameBytes(tensor_.get() + i, ref_.tensor().data() + i, 4)),
                 "a rejected RESULT changed bytes %zu.. of the tensor, outside the blocks it names", i);
    }
  }

  // One frame from aggregator `a`'s connection, as AggregatorLink hands it to the collective.
  bool Feed(uint32_t a, const std::vector<std::byte>& frame, bool must_accept) {
    Result<FrameHeader> h = DecodeFrameHeader(frame);
    FUZZ_CHECK(h.ok() || !must_accept, "valid RESULT header rejected: %s", h.status().ToString().c_str());
    if (!h.ok() || h->type == FrameType::kControl || h->payload_length > worker_->MaxResultPayload() ||
        frame.size() != kFrameHeaderSize + uint64_t{h->payload_length}) {
      FUZZ_CHECK(!must_accept, "valid RESULT fails the link's checks");
      return false;
    }
    ByteBuffer payload(h->payload_length);
    if (payload.size()) std::memcpy(payload.data(), frame.data() + kFrameHeaderSize, payload.size());
    std::vector<EntryView> views;
    const bool ref_ok = h->type == FrameType::kResult && h->job == kJob && h->seq == kSeq &&
                        DecodeDataPayload(*h, payload.span(), &views).ok() && ref_.Check(a, h->slot, views);

    // As the worker reads it: the entry table, then the data straight into the targets BeginResult names.
    std::vector<OutgoingFrame> next;
    const uint64_t table_bytes = uint64_t{h->entry_count} * kEntrySize;  // fits: DecodeFrameHeader checked it
    std::vector<std::span<std::byte>> targets;
    Status st = worker_->BeginResult(a, *h, payload.span().first(table_bytes), &next, &targets);
    const bool began = st.ok();
    if (began) {
      uint64_t at = table_bytes;
      for (const std::span<std::byte>& t : targets) {
        FUZZ_CHECK(t.size() <= payload.size() - at, "RESULT targets hold more than the frame's data region");
        std::memcpy(t.data(), payload.data() + at, t.size());
        at += t.size();
      }
      FUZZ_CHECK(at == payload.size(), "RESULT targets hold %llu bytes less than the data region",
                 static_cast<unsigned long long>(payload.size() - at));
      st = worker_->EndResult(a);
    }
    FUZZ_CHECK(st.ok() == ref_ok, "aggregator %u slot %u: worker says %s, reference model says %s", a, h->slot,
               st.ok() ? "OK" : st.ToString().c_str(), ref_ok ? "accept" : "reject");
    FUZZ_CHECK(st.ok() || !must_accept, "valid RESULT rejected: %s", st.ToString().c_str());
    if (!st.ok()) {
      if (began) {
        CheckOnlyNamedBlocksChanged(*h, payload.span());
      } else {
        FUZZ_CHECK(SameAsModel(), "a RESULT whose entry table was rejected changed the tensor");
      }
      TryRestore(*worker_);
      return false;
    }
    std::vector<OutgoingFrame> want;
    ref_.Apply(a, h->slot, views, &want);
    FUZZ_CHECK(next.size() == want.size(), "aggregator %u slot %u: worker sends %zu CONTRIBUTIONs, reference model %zu",
               a, h->slot, next.size(), want.size());
    for (size_t i = 0; i < next.size(); ++i) {
      FUZZ_CHECK(SameFrame(next[i], want[i]),
                 "aggregator %u slot %u: CONTRIBUTION %zu differs from the reference model", a, h->slot, i);
      const ByteBuffer f = worker_->EncodeFrame(next[i]);
      Result<FrameHeader> fh = DecodeFrameHeader(f.span());
      std::vector<EntryView> v;
      FUZZ_CHECK(fh.ok() && fh->payload_length <= worker_->MaxResultPayload() &&
                     DecodeDataPayload(*fh, f.span().subspan(kFrameHeaderSize), &v).ok(),
                 "CONTRIBUTION frame does not decode");
      for (const Entry& e : next[i].entries) {
        if (!codec() || e.data_bytes == 0) continue;
        const std::span<const std::byte> sent = worker_->BlockData(e.block), own = ref_encoder_->Block(e.block);
        FUZZ_CHECK(sent.size() == own.size() && fuzz::SameBytes(sent.data(), own.data(), own.size()),
                   "CONTRIBUTION block %llu: not the codec's wire bytes", static_cast<unsigned long long>(e.block));
      }
      const ByteBuffer prefix = worker_->EncodePrefix(next[i]);
      FUZZ_CHECK(prefix.size() <= f.size() && fuzz::SameBytes(prefix.data(), f.data(), prefix.size()),
                 "EncodePrefix differs from EncodeFrame");
    }
    FUZZ_CHECK(SameAsModel(), "tensor differs from the reference model after a RESULT");
    FUZZ_CHECK(worker_->AggregatorDone(a) == ref_.AggregatorDone(a) && worker_->done() == ref_.Done(),
               "done state differs from the reference model");
    return true;
  }

  fuzz::SmallSetup setup_;
  Rng rng_;
  std::vector<std::byte> original_;
  uint8_t end_mode_;
  std::unique_ptr<std::byte[]> tensor_;  // exactly N elements: ASan reports any access past it
  fuzz::Wire down_ = fuzz::DownloadWire(setup_.spec.codec);
  uint64_t codec_seed_;
  codec::KeyState key_state_;      // the worker's, for the spec's key
  codec::KeyState ref_key_state_;  // the harness's encoder's
  std::unique_ptr<codec::TensorEncoder> ref_encoder_;
  std::vector<uint32_t> ref_send_;
  RefWorker ref_;
  std::unique_ptr<WorkerCollective> worker_;
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
  harness.End();
  return 0;
}
