#include "aggregator/job.h"

#include <algorithm>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <spdlog/spdlog.h>

#include "aggregator/job_registry.h"
#include "aggregator/peer_text.h"
#include "aggregator/service_context.h"
#include "aggregator/session.h"
#include "codec/codec_spec.h"
#include "codec/wire.h"
#include "core/dtype.h"
#include "protocol/control.h"
#include "protocol/frame_format.h"

namespace sparsereduce::aggregator {
namespace {

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (uint32_t r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

JobShape ShapeOf(const proto::Hello& h) {
  return JobShape{h.world_size(), h.num_aggregators(), h.slots(), h.blocks_per_message(), h.window()};
}

// How a Hello's shape differs from the job's, only the fields that do: "rank 2 (PEER) has world_size=4 where rank(s)
// 0,1 have world_size=3; ..." (the whole shapes side by side had to be compared by eye).
std::string ShapeMismatch(const std::string& newcomer, const JobShape& got, uint32_t got_index,
                          const std::string& members, const JobShape& job, uint32_t job_index) {
  std::string has, have;
  const auto field = [&](const char* name, uint32_t a, uint32_t b) {
    if (a == b) return;
    has += std::string(has.empty() ? "" : " and ") + name + "=" + std::to_string(a);
    have += std::string(have.empty() ? "" : " and ") + name + "=" + std::to_string(b);
  };
  field("world_size", got.world_size, job.world_size);
  field("aggregators", got.num_aggregators, job.num_aggregators);
  field("slots", got.slots, job.slots);
  field("blocks_per_message", got.blocks_per_message, job.blocks_per_message);
  field("window", got.window, job.window);
  std::string out;
  if (!has.empty()) {
    out = newcomer + " has " + has + " where " + members + " have " + have + "; every rank must use the same values";
  }
  if (got_index != job_index) {
    out += std::string(out.empty() ? "" : "; and ") + newcomer + " lists this aggregator at position " +
           std::to_string(got_index) + " of its aggregator list, " + members + " at position " +
           std::to_string(job_index) + ": every rank must list the same aggregators in the same order";
  }
  return out;
}

}  // namespace

Job::Job(uint64_t id, boost::asio::any_io_executor strand, JobRegistry& registry, ServiceContext& context)
    : id_(id),
      strand_(strand),
      registry_(registry),
      context_(context),
      stall_timer_(strand),
      formation_timer_(strand),
      uncongested_(strand, std::chrono::steady_clock::time_point::max()) {}

namespace {

// The most the frames queued for a member may hold before the job stops reading, unless two RESULTs already do.
constexpr uint64_t kQueuedResultBytes = 64ull << 20;

// Version 2's lockstep rounds let at most S RESULTs wait per member. A deeper queue keeps a CPU-bound reader
// (loopback) busy; the RESULTs are shared by all members, so this bounds the job's queued RESULTs.
size_t CongestionFramesByCount(const JobShape& shape) { return 16 * size_t{shape.slots} + 16; }

// Fewer where RESULTs are large (K x B chosen by the workers), so that the bound is one of bytes too.
size_t CongestionFrames(const JobShape& shape, uint64_t max_result_buffer) {
  return static_cast<size_t>(
      std::clamp<uint64_t>(kQueuedResultBytes / max_result_buffer, 2, CongestionFramesByCount(shape)));
}

}  // namespace

size_t Job::CongestionLimit() const {
  return congestion_limit_ != 0 ? congestion_limit_ : CongestionFramesByCount(shape_);
}

bool Job::AnyMemberQueued() const {
  return std::any_of(members_.begin(), members_.end(), [](const auto& m) { return m && m->queued_frames() > 0; });
}

void Job::HoldQueuedResults() {
  // Its RESULTs may still wait for slow members: their reservation stays until every queue ran empty.
  if (active_->results_memory && AnyMemberQueued()) {
    undelivered_results_.push_back(std::move(*active_->results_memory));
  }
}

void Job::OnMemberIdle() {
  if (!undelivered_results_.empty() && !AnyMemberQueued()) undelivered_results_.clear();
}

std::vector<uint32_t> Job::CongestedRanks() const {
  const size_t limit = CongestionLimit();
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < members_.size(); ++r) {
    if (members_[r] && members_[r]->queued_frames() > limit) ranks.push_back(r);
  }
  return ranks;
}

boost::asio::awaitable<void> Job::WaitWhileCongested(uint32_t rank) {
  while (!dead_) {
    std::vector<uint32_t> congested;
    if (active_) {
      congested = CongestedRanks();
    } else if (rank < members_.size() && members_[rank] && members_[rank]->queued_frames() > CongestionLimit()) {
      // Between collectives only a member's own frames pile up (a CollectiveAccepted per CollectiveBegin it sends,
      // e.g. of empty tensors) when it does not read them: it alone is held back. Its queue grew without bound.
      congested = {rank};
    }
    if (congested.empty()) co_return;
    for (uint32_t r : congested) {
      members_[r]->NotifyWhenQueuedAtMost(CongestionLimit() / 2, [weak = weak_from_this()] {
        if (auto job = weak.lock()) job->uncongested_.cancel();
      });
    }
    boost::system::error_code ec;
    co_await uncongested_.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
}

void Job::ArmStallTimer(std::chrono::steady_clock::time_point deadline) {
  stall_timer_.expires_at(deadline);
  stall_timer_.async_wait([self = shared_from_this(), seq = active_->seq](const boost::system::error_code& ec) {
    if (!ec) self->OnStallTimer(seq);
  });
}

void Job::OnStallTimer(uint64_t seq) {
  if (dead_ || !active_ || active_->seq != seq) return;
  const auto now = std::chrono::steady_clock::now();
  const bool all_begun = active_->begun_count == shape_.world_size;
  const auto stalled_at = last_progress_ + context_.options.stall_timeout;
  const std::string collective = "job " + std::to_string(id_) + ", collective " + std::to_string(seq);
  const std::string stalled = collective + " made no progress for " +
                              std::to_string(context_.options.stall_timeout.count()) + " ms (--stall-timeout-ms); ";
  const std::vector<uint32_t> congested = CongestedRanks();
  if (now >= stalled_at && !congested.empty()) {
    // The others are held back because these ranks do not read their RESULTs; in the begin phase too, where the
    // hold keeps the late ranks' CollectiveBegins unread.
    Abort(Status(StatusCode::kDeadlineExceeded,
                 stalled + "rank(s) " + RankList(congested) + " do not read their RESULTs" + PeersOf(congested)),
          congested);
    return;
  }
  const auto deadline = last_progress_ + (all_begun ? context_.options.stall_timeout : context_.options.begin_timeout);
  if (now < deadline) {
    // There was progress since the timer was set, or ranks are still awaited: then look again for a member that
    // stopped reading at every stall timeout.
    const auto recheck = now < stalled_at ? stalled_at : now + context_.options.stall_timeout;
    ArmStallTimer(all_begun ? deadline : std::min(deadline, recheck));
    return;
  }
  if (!all_begun) {
    std::vector<uint32_t> late;
    for (uint32_t r = 0; r < shape_.world_size; ++r) {
      if (!active_->begun[r]) late.push_back(r);
    }
    Abort(Status(StatusCode::kDeadlineExceeded,
                 collective + ": rank(s) " + RankList(late) + PeersOf(late) + " did not start it within " +
                     std::to_string(context_.options.begin_timeout.count()) +
                     " ms of its last progress (--begin-timeout-ms)"),
          late);
    return;
  }
  const std::vector<uint32_t> waiting = active_->engine->AwaitedRanks();
  Abort(Status(StatusCode::kDeadlineExceeded, stalled + "still waiting for rank(s) " + RankList(waiting) +
                                                  PeersOf(waiting)),
        waiting);
}

void Job::ArmFormationTimer() {
  formation_timer_.expires_after(context_.options.formation_timeout);
  // A weak reference: a job released before the deadline is not kept alive by its timer.
  formation_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    if (ec) return;
    if (std::shared_ptr<Job> job = weak.lock()) job->OnFormationTimer();
  });
}

void Job::OnFormationTimer() {
  if (dead_ || formed_) return;
  std::vector<uint32_t> joined, missing;
  for (uint32_t r = 0; r < members_.size(); ++r) (members_[r] ? joined : missing).push_back(r);
  Abort(Status(StatusCode::kDeadlineExceeded,
               "job " + std::to_string(id_) + " did not form within " +
                   std::to_string(context_.options.formation_timeout.count()) +
                   " ms (--formation-timeout-ms): rank(s) " + RankList(joined) + PeersOf(joined) +
                   " joined, still waiting for rank(s) " + RankList(missing)),
        missing);
}

std::string Job::DescribeDepartures() const {
  // Each reason is cut to kMaxPeerText; quoting at most this many keeps the Error and the log line short however
  // many ranks left (they were all quoted: W KiB for a job of W ranks).
  constexpr size_t kMaxQuoted = 8;
  std::string reasons;
  size_t quoted = 0, unquoted = 0;
  for (uint32_t r : departed_) {
    auto it = departure_reasons_.find(r);
    if (it == departure_reasons_.end()) continue;
    if (quoted == kMaxQuoted) {
      ++unquoted;
      continue;
    }
    ++quoted;
    reasons += (reasons.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " because: " + it->second);
  }
  if (unquoted > 0) reasons += "; and " + std::to_string(unquoted) + " more";
  const std::string text = "rank(s) " + RankList(departed_) + " left the job";
  return reasons.empty() ? text : text + " (" + reasons + ")";
}

std::string Job::PeersOf(const std::vector<uint32_t>& ranks) const {
  constexpr size_t kMaxNamed = 16;  // enough to find the hosts; the Error's ranks list has them all
  std::string out;
  size_t named = 0;
  for (uint32_t r : ranks) {
    if (r >= members_.size() || !members_[r]) continue;
    if (named++ == kMaxNamed) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " at " + members_[r]->peer());
  }
  return out.empty() ? "" : " (" + out + ")";
}

std::string Job::Describe(uint32_t rank) const { return "job " + std::to_string(id_) + " " + DescribeMember(rank); }

std::string Job::DescribeMember(uint32_t rank) const {
  std::string peer = rank < members_.size() && members_[rank] ? members_[rank]->peer() : "?";
  return "rank " + std::to_string(rank) + " (peer " + peer + ")";
}

bool Job::Retired(const std::shared_ptr<Session>& session) {
  if (dead_) return true;
  if (formed_ && !departed_.empty()) {
    // A member of a broken job is reconnecting: the old formation can never run another collective.
    Abort(Status(StatusCode::kPeerLeft, "job " + std::to_string(id_) + " is being formed again (rank " +
                                            std::to_string(session->rank()) + " reconnected from " +
                                            session->peer() + ") after " + DescribeDepartures()),
          departed_);
    return true;
  }
  return false;
}

Job::JoinOutcome Job::Join(const std::shared_ptr<Session>& session) {
  const proto::Hello& hello = session->hello();
  const uint32_t rank = hello.rank();
  if (formed_) {
    const std::string holder = rank < members_.size() && members_[rank]
                                   ? "; rank " + std::to_string(rank) + " is connected from " + members_[rank]->peer()
                                   : "";
    const Status error(StatusCode::kJobFull, "job " + std::to_string(id_) + " is already formed with all " +
                                                 std::to_string(shape_.world_size) + " ranks" + holder +
                                                 " (Hello of rank " + std::to_string(rank) + " from " +
                                                 session->peer() + ")");
    // The job runs on: not an abort, but worth a line (unless refusals come too fast) and a count.
    if (context_.refusal_log.Admit()) spdlog::warn("{}; refused", error.ToString());
    context_.metrics.Error(error.code());
    session->Fail(error, 0, {rank});
    return JoinOutcome::kRejected;
  }
  if (members_.empty()) {
    shape_ = ShapeOf(hello);
    aggregator_index_ = hello.aggregator_index();
    members_.resize(shape_.world_size);
    ArmFormationTimer();
  } else if (ShapeOf(hello) != shape_ || hello.aggregator_index() != aggregator_index_) {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < members_.size(); ++r) {
      if (members_[r]) ranks.push_back(r);
    }
    const Status error(StatusCode::kJobConfigMismatch,
                       "job " + std::to_string(id_) + ": " +
                           ShapeMismatch("rank " + std::to_string(rank) + " (" + session->peer() + ")",
                                         ShapeOf(hello), hello.aggregator_index(), "rank(s) " + RankList(ranks),
                                         shape_, aggregator_index_));
    ranks.push_back(rank);
    session->Fail(error, 0, ranks);
    Abort(error, ranks);
    return JoinOutcome::kRejected;
  }
  if (members_[rank]) {
    const Status error(StatusCode::kDuplicateRank, "job " + std::to_string(id_) + ": rank " + std::to_string(rank) +
                                                       " joined twice, from " + members_[rank]->peer() + " and from " +
                                                       session->peer());
    session->Fail(error, 0, {rank});
    Abort(error, {rank});
    return JoinOutcome::kRejected;
  }
  members_[rank] = session;
  ++joined_;
  spdlog::info("job {}: rank {} joined from {} ({}/{})", id_, rank, session->peer(), joined_, shape_.world_size);
  if (joined_ == shape_.world_size) {
    formed_ = true;
    formation_timer_.cancel();
    for (auto& m : members_) {
      proto::ControlMessage ready;
      ready.mutable_job_ready()->set_protocol_version(kProtocolVersion);
      ready.mutable_job_ready()->set_transport(m->transport());
      m->SendControl(ready);
    }
    spdlog::info("job {}: formed with {}", id_, shape_.ToString());
  }
  return JoinOutcome::kJoined;
}

Result<uint64_t> Job::CheckContribution(uint32_t rank, const FrameHeader& header) const {
  if (header.job != id_) {
    return ProtocolError("CONTRIBUTION for job " + std::to_string(header.job) + " on a connection of job " +
                         std::to_string(id_));
  }
  if (!active_ || header.seq != active_->seq) {
    return ProtocolError("CONTRIBUTION for collective " + std::to_string(header.seq) + ", which is not in progress");
  }
  if (!active_->begun[rank]) {
    return ProtocolError("CONTRIBUTION for collective " + std::to_string(header.seq) + " before its CollectiveBegin");
  }
  // Bounded by what the slot can carry, not by K alone: its payload is read (and held) before the entries are
  // checked, and a slot with few columns here (a small tensor) would otherwise let through frames of up to
  // K x (24 + block bytes) that no valid frame reaches.
  if (header.slot >= shape_.slots) {
    return ProtocolError("CONTRIBUTION for slot " + std::to_string(header.slot) + "; the job has " +
                         std::to_string(shape_.slots) + " slots");
  }
  const uint32_t columns = active_->engine->SlotColumns(header.slot);
  if (columns == 0) {
    return ProtocolError("CONTRIBUTION for slot " + std::to_string(header.slot) + ", which has no blocks on this " +
                         "aggregator in collective " + std::to_string(header.seq));
  }
  const uint64_t limit = active_->engine->MaxContributionPayload(header.slot);
  if (header.payload_length > limit) {
    return ProtocolError("CONTRIBUTION payload of " + std::to_string(header.payload_length) +
                         " bytes exceeds the collective's limit of " + std::to_string(limit) + " on slot " +
                         std::to_string(header.slot) + " (" + std::to_string(columns) + " columns here)");
  }
  if (header.entry_count > shape_.blocks_per_message) {
    return ProtocolError("CONTRIBUTION of " + std::to_string(header.entry_count) + " entries, more than the job's " +
                         std::to_string(shape_.blocks_per_message) + " blocks per message");
  }
  if (header.entry_count > columns) {
    return ProtocolError("CONTRIBUTION of " + std::to_string(header.entry_count) + " entries on slot " +
                         std::to_string(header.slot) + ", which has " + std::to_string(columns) +
                         " columns on this aggregator");
  }
  if (Status room = active_->engine->CheckWindow(rank, header.slot); !room.ok()) return room;
  return limit;
}

void Job::OnContribution(uint32_t rank, const FrameHeader& header, ByteBuffer payload) {
  if (dead_) return;
  // The header was checked before the payload was read; the collective may have finished (or another one
  // begun) while the payload was on its way.
  if (Result<uint64_t> limit = CheckContribution(rank, header); !limit.ok()) {
    Violation(rank, limit.status());
    return;
  }
  std::vector<ColumnEngine::Broadcast> out;
  Status st = active_->engine->OnContribution(rank, header, std::move(payload), &out);
  if (!st.ok()) {
    Violation(rank, st);
    return;
  }
  for (const auto& b : out) {
    for (auto& m : members_) m->Send(b.frame);
  }
  Progress();
  MaybeCompleteCollective();
}

void Job::ReturnLoans(uint32_t rank) {
  if (active_ && active_->engine) active_->engine->ReturnLoans(rank);
}

void Job::OnControl(uint32_t rank, const proto::ControlMessage& message) {
  if (dead_) return;
  switch (message.body_case()) {
    case proto::ControlMessage::kCollectiveBegin:
      if (!formed_) {
        Violation(rank, ProtocolError("CollectiveBegin before the job was formed"));
      } else {
        OnCollectiveBegin(rank, message.collective_begin());
      }
      return;
    case proto::ControlMessage::kGoodbye: {
      // The peer's own text: escaped and cut before it reaches the log or another rank's Error.
      const std::string reason = PeerText(message.goodbye().reason());
      if (active_) {
        Abort(Status(StatusCode::kPeerLeft, Describe(rank) + " left during collective " +
                                                std::to_string(active_->seq) +
                                                (reason.empty() ? "" : " because: " + reason)),
              {rank});
        return;
      }
      if (!formed_) {
        // Its place is free again, at once: the rank (or a new process for it) may join again, and the last rank
        // to join must not find the place counted as taken but empty. OnDisconnect then finds another session.
        spdlog::info("{}: left before the job formed ({})", Describe(rank), reason);
        std::shared_ptr<Session> leaving = std::move(members_[rank]);
        --joined_;
        leaving->Close();
        ReleaseIfEmpty();
        return;
      }
      spdlog::info("{}: left the job ({})", Describe(rank), reason);
      // Departed from now on, not only once the connection has closed: a CollectiveBegin of another rank may
      // arrive first. Why it left is what the other ranks need to hear at their next collective, which will fail.
      departed_.push_back(rank);
      if (!reason.empty()) departure_reasons_[rank] = reason;
      members_[rank]->Close();
      return;  // OnDisconnect follows when the connection closes
    }
    default:
      Violation(rank, ProtocolError("unexpected control message (field " +
                                    std::to_string(static_cast<int>(message.body_case())) + ") after Hello"));
  }
}

void Job::OnCollectiveBegin(uint32_t rank, const proto::CollectiveBegin& begin) {
  if (!departed_.empty()) {
    Abort(Status(StatusCode::kPeerLeft, "job " + std::to_string(id_) + ": collective " + std::to_string(begin.seq()) +
                                            " (begun by " + DescribeMember(rank) + ") cannot run: " +
                                            DescribeDepartures()),
          departed_);
    return;
  }
  Result<CollectiveSpec> spec = SpecFromProto(begin.spec());
  Status valid = spec.ok() ? ValidateSpec(*spec) : spec.status();
  if (valid.ok()) valid = ValidateFrameSize(shape_, *spec);
  if (!valid.ok()) {
    Abort(valid.WithContext(Describe(rank) + ", collective " + std::to_string(begin.seq())), {rank});
    return;
  }
  if (!active_) {
    if (begin.seq() != last_completed_seq_ + 1) {
      Violation(rank, ProtocolError("CollectiveBegin for collective " + std::to_string(begin.seq()) + ", expected " +
                                    std::to_string(last_completed_seq_ + 1)));
      return;
    }
    Result<Admission> reserved = Admit(*spec);
    if (!reserved.ok()) {
      Abort(reserved.status().WithContext(Describe(rank) + ", collective " + std::to_string(begin.seq())), {rank});
      return;
    }
    Result<codec::ErrorMemory*> error_memory = ErrorMemoryFor(*spec);
    if (!error_memory.ok()) {  // (the reservations go with `reserved`)
      Abort(error_memory.status().WithContext(Describe(rank) + ", collective " + std::to_string(begin.seq())),
            {rank});
      return;
    }
    active_.emplace();
    active_->memory.emplace(std::move(reserved->engine));
    active_->results_memory.emplace(std::move(reserved->results));
    active_->started = std::chrono::steady_clock::now();
    active_->seq = begin.seq();
    active_->spec = *spec;
    active_->begun.assign(shape_.world_size, false);
    active_->engine = std::make_unique<ColumnEngine>(shape_, aggregator_index_, id_, begin.seq(), *spec,
                                                     context_.buffers, *error_memory);
    Progress();
    // The first of the two deadlines; OnStallTimer extends it while ranks are awaited.
    ArmStallTimer(last_progress_ + std::min(context_.options.stall_timeout, context_.options.begin_timeout));
  } else if (begin.seq() != active_->seq || active_->begun[rank]) {
    Violation(rank, ProtocolError("CollectiveBegin for collective " + std::to_string(begin.seq()) + " while " +
                                  std::to_string(active_->seq) + " is in progress"));
    return;
  } else if (!(*spec == active_->spec)) {
    std::vector<uint32_t> agreeing;
    for (uint32_t r = 0; r < shape_.world_size; ++r) {
      if (active_->begun[r]) agreeing.push_back(r);
    }
    std::vector<uint32_t> ranks = agreeing;
    ranks.push_back(rank);
    Abort(Status(StatusCode::kSpecMismatch, "job " + std::to_string(id_) + ", collective " +
                                                std::to_string(active_->seq) + ": rank " + std::to_string(rank) +
                                                " passed " + spec->ToString() + " but rank(s) " +
                                                RankList(agreeing) + " passed " + active_->spec.ToString() +
                                                PeersOf(ranks) +
                                                "; every rank must call allreduce with the same element count, "
                                                "dtype, block size, codec and key, in the same order"),
          ranks);
    return;
  }
  active_->begun[rank] = true;
  Progress();
  if (++active_->begun_count == shape_.world_size) {
    ArmStallTimer(last_progress_ + context_.options.stall_timeout);
    proto::ControlMessage accepted;
    accepted.mutable_collective_accepted()->set_seq(active_->seq);
    for (auto& m : members_) m->SendControl(accepted);
  }
  MaybeCompleteCollective();
}

Result<codec::ErrorMemory*> Job::ErrorMemoryFor(const CollectiveSpec& spec) {
  auto it = error_memories_.find(spec.codec.key);
  if (spec.codec.codec != Codec::kThreeLC || spec.codec.result_fp32) {
    // The key now carries something else; the workers start its error over when it is 3LC again (a new codec or
    // size gives a fresh state, codec/tensor_codec.cc), and so does this memory.
    if (it != error_memories_.end()) EraseErrorMemory(it);
    return nullptr;
  }
  const ColumnLayout layout(shape_, spec.element_count, spec.block_size, FindDType(spec.dtype)->size);
  const uint64_t blocks = layout.BlocksOf(aggregator_index_);
  if (it != error_memories_.end() && it->second->elements == spec.element_count &&
      it->second->memory.block_size() == spec.block_size) {
    return &it->second->memory;
  }
  if (it != error_memories_.end()) EraseErrorMemory(it);  // the key's tensor changed shape: start over
  // A key costs its entry even where this aggregator holds none of its blocks (or the tensor is empty), so that
  // the limits below bound the number of keys too: keys of 0 bytes grew the map without bound.
  const uint64_t bytes = blocks * spec.block_size * sizeof(float) + kErrorMemoryEntryBytes;
  // One job's keys together stay within --max-job-memory, so that it cannot take the whole --max-total-memory from
  // the other jobs by using many keys.
  const uint64_t held = error_memory_bytes_;
  if (held + bytes > context_.options.max_job_memory) {
    return Status(StatusCode::kResourceExhausted,
                  "3LC error memory for key " + std::to_string(spec.codec.key) + " needs " + std::to_string(bytes) +
                      " bytes but job " + std::to_string(id_) + "'s other keys already hold " + std::to_string(held) +
                      " of its --max-job-memory of " + std::to_string(context_.options.max_job_memory) +
                      "; use fewer keys (one per tensor) or another codec");
  }
  if (!context_.memory.TryReserve(bytes)) {
    return Status(StatusCode::kResourceExhausted,
                  "3LC error memory for key " + std::to_string(spec.codec.key) + " needs " + std::to_string(bytes) +
                      " bytes but the aggregator's jobs already hold " + std::to_string(context_.memory.reserved()) +
                      " of its --max-total-memory of " + std::to_string(context_.memory.limit()));
  }
  // Held from here on, so that any allocation below that throws gives the bytes back.
  MemoryReservation reserved(context_.memory, bytes);
  auto entry = std::make_unique<KeyedErrorMemory>(spec.element_count, blocks, spec.block_size, std::move(reserved));
  codec::ErrorMemory* memory = &entry->memory;
  error_memories_[spec.codec.key] = std::move(entry);
  error_memory_bytes_ += bytes;
  return memory;
}

void Job::EraseErrorMemory(std::map<uint64_t, std::unique_ptr<KeyedErrorMemory>>::iterator it) {
  error_memory_bytes_ -= it->second->reservation.bytes();
  error_memories_.erase(it);
}

Result<Job::Admission> Job::Admit(const CollectiveSpec& spec) {
  const ServerOptions& limits = context_.options;
  const DTypeInfo& dtype = *FindDType(spec.dtype);
  const uint32_t element_size = dtype.size;
  if (spec.element_count > limits.max_tensor_bytes / element_size) {
    return Status(StatusCode::kResourceExhausted,
                  "the tensor of " + std::to_string(spec.element_count) + " " + dtype.name +
                      " elements (" + std::to_string(element_size) + " bytes each) exceeds this aggregator's " +
                      "--max-tensor-bytes of " + std::to_string(limits.max_tensor_bytes) +
                      ": split it into smaller collectives, or raise the limit");
  }
  // For the columns of this collective that this aggregator serves (a small tensor leaves most lanes empty).
  const ColumnLayout layout(shape_, spec.element_count, spec.block_size, element_size);
  uint64_t columns = 0;
  for (uint32_t s = 0; s < shape_.slots; ++s) columns += layout.NonEmptyLanes(aggregator_index_, s);
  const uint64_t engine =
      ColumnEngine::MemoryBound(shape_, columns, uint64_t{spec.block_size} * element_size, layout);
  // RESULTs waiting for the slowest member (they are shared by all): up to the backpressure limit of frames, plus
  // what one more read completes, which the engine held (their buffers at most four times its blocks); never more
  // than all of the collective's RESULTs. They held memory nobody accounted for: a member that reads nothing with
  // large K x B made the daemon queue far beyond --max-job-memory.
  const uint64_t wire_block = codec::MaxWireBytes(DownloadFormat(spec.codec), spec.block_size, element_size);
  const uint64_t result_buffer = ColumnEngine::MaxResultBufferBytes(shape_, wire_block);
  const size_t congestion_frames = CongestionFrames(shape_, result_buffer);
  const uint64_t results =
      std::min(ColumnEngine::ResultMemoryBound(shape_, layout.BlocksOf(aggregator_index_), columns, wire_block),
               (congestion_frames + 1) * result_buffer + 4 * engine);
  const uint64_t memory = engine + results;
  // Earlier collectives' RESULTs still queued for members that have not read them keep their reservations
  // (undelivered_results_): they count against the job's limit too, or a member that never reads would let its job
  // pile one collective's reservation on another, far beyond --max-job-memory, into the other jobs' share.
  uint64_t queued = 0;
  for (const MemoryReservation& reservation : undelivered_results_) queued += reservation.bytes();
  if (memory + queued > limits.max_job_memory) {
    const std::string earlier =
        queued == 0 ? "" : ", and its earlier collectives' RESULTs still queued for members that have not read "
                           "them hold " + std::to_string(queued);
    return Status(StatusCode::kResourceExhausted,
                  "the collective would hold up to " + std::to_string(memory) + " bytes on this aggregator (" +
                      std::to_string(engine) + " for " + std::to_string(shape_.world_size) + " ranks x window " +
                      std::to_string(shape_.window) + " frames per slot over " + std::to_string(columns) +
                      " columns of " + std::to_string(spec.block_size * element_size) +
                      "-byte blocks, a RESULT and tables over " + std::to_string(layout.num_places()) +
                      " columns of " + std::to_string(shape_.num_aggregators) + " aggregators; " +
                      std::to_string(results) + " for RESULTs waiting in send queues)" + earlier + ", above its " +
                      "--max-job-memory of " + std::to_string(limits.max_job_memory) +
                      (queued == 0 ? "; use fewer slots, blocks per message or a smaller window"
                                   : "; the members must read their RESULTs, or use fewer slots, blocks per message "
                                     "or a smaller window"));
  }
  if (!context_.memory.TryReserve(memory)) {
    return Status(StatusCode::kResourceExhausted,
                  "the collective needs " + std::to_string(memory) + " bytes but the aggregator's running " +
                      "collectives already hold " + std::to_string(context_.memory.reserved()) + " of its " +
                      "--max-total-memory of " + std::to_string(context_.memory.limit()) +
                      "; the job ends: rejoin (new Workers) and retry once others finish");
  }
  congestion_limit_ = congestion_frames;
  return Admission{MemoryReservation(context_.memory, engine), MemoryReservation(context_.memory, results)};
}

void Job::AbortIfForming(const Status& error, uint32_t rank) {
  if (dead_ || formed_) return;
  Abort(error, {rank});
}

void Job::MaybeCompleteCollective() {
  if (active_ && active_->begun_count == shape_.world_size && active_->engine->done()) {
    spdlog::debug("job {}: collective {} complete ({} blocks aggregated)", id_, active_->seq,
                  active_->engine->blocks_aggregated());
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - active_->started;
    context_.metrics.CollectiveCompleted(elapsed.count(), active_->engine->blocks_aggregated(),
                                         active_->engine->owned_blocks());
    last_completed_seq_ = active_->seq;
    HoldQueuedResults();
    active_.reset();
    stall_timer_.cancel();
    uncongested_.cancel();
    if (draining_) EndForDrain();
  }
}

void Job::Drain() {
  if (dead_) return;
  draining_ = true;
  if (!active_) EndForDrain();
}

void Job::EndForDrain() {
  Abort(Status(StatusCode::kShuttingDown,
               "job " + std::to_string(id_) + ": the aggregator is shutting down (drained after collective " +
                   std::to_string(last_completed_seq_) + ")"),
        {});
}

void Job::Violation(uint32_t rank, const Status& error) {
  Abort(error, {rank}, rank);  // which logs it, naming the rank: once, not here too
}

void Job::OnDisconnect(uint32_t rank, const Session* session, const Status& reason) {
  if (rank >= members_.size() || members_[rank].get() != session) {
    // A rejected or replaced session; or one that failed before its Join (an exception making its channel), which
    // may leave a job nobody joined: without a member nor a formation timer, nothing else would ever release it.
    if (joined_ == 0 && !formed_) ReleaseIfEmpty();
    return;
  }
  if (dead_ || std::find(departed_.begin(), departed_.end(), rank) != departed_.end()) {
    members_[rank].reset();  // the job is over, or the rank said Goodbye and is already counted as departed
    ReleaseIfEmpty();
    return;
  }
  // A frame of another version mid-stream is as much a violation as a malformed one (docs/PROTOCOL.md §9): the rank
  // gets the Error, the others learn it broke the protocol.
  if (reason.code() == StatusCode::kProtocolViolation || reason.code() == StatusCode::kVersionMismatch) {
    Violation(rank, reason);
    return;
  }
  if (!formed_) {
    spdlog::info("{}: left before the job formed ({})", Describe(rank), reason.message());
    members_[rank].reset();
    --joined_;
    ReleaseIfEmpty();
    return;
  }
  if (active_) {
    Abort(Status(StatusCode::kPeerLeft, Describe(rank) + " disconnected during collective " +
                                            std::to_string(active_->seq) + ": " + reason.message()),
          {rank});
    return;
  }
  spdlog::info("{}: disconnected ({})", Describe(rank), reason.message());
  departed_.push_back(rank);
  members_[rank].reset();
  ReleaseIfEmpty();
}

void Job::ReleaseIfEmpty() {
  for (const auto& m : members_) {
    if (m) return;
  }
  if (!dead_) spdlog::info("job {}: released", id_);
  dead_ = true;
  formation_timer_.cancel();
  registry_.Remove(this);
}

void Job::Abort(const Status& error, const std::vector<uint32_t>& ranks, std::optional<uint32_t> offender) {
  if (dead_) return;
  dead_ = true;
  const Status own = offender ? error.WithContext(Describe(*offender)) : error;
  spdlog::warn("job aborted: {}", own.ToString());  // each reason names the job (job.h)
  context_.metrics.Error(own.code());
  if (active_) context_.metrics.CollectiveFailed();
  const uint64_t seq = active_ ? active_->seq : 0;
  for (uint32_t r = 0; r < members_.size(); ++r) {
    if (!members_[r]) continue;
    if (offender && r != *offender) {
      members_[r]->Fail(Status(StatusCode::kPeerLeft, "job " + std::to_string(id_) + " aborted because " +
                                                          DescribeMember(*offender) + " broke the protocol: " +
                                                          error.message()),
                        seq, ranks);
    } else {
      members_[r]->Fail(own, seq, ranks);
    }
  }
  if (active_) HoldQueuedResults();  // a failed collective's RESULTs may still wait, ahead of the Errors
  active_.reset();
  stall_timer_.cancel();
  formation_timer_.cancel();
  uncongested_.cancel();
  registry_.Remove(this);
}

}  // namespace sparsereduce::aggregator
