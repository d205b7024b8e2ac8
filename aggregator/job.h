// One job on the aggregator: its members (one Session per rank), formation, the current collective's spec check
// and ColumnEngine, and the abort path. Every method runs on the job's strand.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/memory_budget.h"
#include "codec/three_lc.h"
#include "core/byte_buffer.h"
#include "core/status.h"
#include "proto/control.pb.h"
#include "protocol/column_engine.h"
#include "protocol/frame.h"
#include "protocol/layout.h"

namespace sparsereduce::aggregator {

class Session;
class JobRegistry;
struct ServiceContext;

// The collective a job is running. (At namespace scope: clang rejects std::optional of a nested class with
// default member initializers inside its enclosing class.)
struct ActiveCollective {
  uint64_t seq = 0;
  CollectiveSpec spec;
  std::vector<bool> begun;
  uint32_t begun_count = 0;
  std::unique_ptr<ColumnEngine> engine;
  std::chrono::steady_clock::time_point started;
  std::optional<MemoryReservation> memory;  // this collective's share of --max-total-memory: the engine
  std::optional<MemoryReservation> results_memory;  // and its RESULTs waiting in send queues, until they are written
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(uint64_t id, boost::asio::any_io_executor strand, JobRegistry& registry, ServiceContext& context);

  uint64_t id() const { return id_; }
  const boost::asio::any_io_executor& strand() const { return strand_; }

  // True when this job takes no member any more: it ended, or it formed and lost ranks (then the reconnecting
  // session ends it now). The session joins a fresh job of the same id instead. Touches nothing of the session,
  // so that it can be asked before the session's channel exists: the channel belongs to the strand of the job it
  // finally joins.
  bool Retired(const std::shared_ptr<Session>& session);
  enum class JoinOutcome { kJoined, kRejected };
  // Adds the session as its Hello's rank, once Retired said no. Sends JobReady to everyone when the last rank
  // arrives. On rejection the session has been sent an Error and closed.
  JoinOutcome Join(const std::shared_ptr<Session>& session);

  // The largest payload a CONTRIBUTION with this header may have, or the violation.
  Result<uint64_t> CheckContribution(uint32_t rank, const FrameHeader& header) const;
  void OnContribution(uint32_t rank, const FrameHeader& header, ByteBuffer payload);
  // The rank's connection needs the memory of the payloads it lent back (transport::Channel::ReadPayloadLent): the
  // running collective copies what it still holds of them.
  void ReturnLoans(uint32_t rank);
  void OnControl(uint32_t rank, const proto::ControlMessage& message);
  // The rank's connection ended (or broke the protocol: `reason` is a kProtocolViolation).
  void OnDisconnect(uint32_t rank, const Session* session, const Status& reason);
  // A member's send queue ran empty (on the strand): releases the reservations of completed collectives' RESULTs
  // once no member has frames queued.
  void OnMemberIdle();

  // Fails the job: every member gets an Error (`offender`, if any, gets `error` with its description in front, the
  // others a PEER_LEFT naming it; without one, all get `error`) and is disconnected; the job leaves the registry.
  // `error` names the job (or, with an offender, the description does): it is logged as it is.
  void Abort(const Status& error, const std::vector<uint32_t>& ranks, std::optional<uint32_t> offender = {});

  bool dead() const { return dead_; }

  // Backpressure (docs/PROTOCOL.md §4 lets workers stream ahead): while some member has more RESULTs queued than
  // it reads, the members' sessions stop reading CONTRIBUTIONs, so that the RESULTs a slow reader has not taken
  // stay bounded instead of growing with the tensor; reading resumes once no member is over the limit (checked
  // whenever a congested member's queue drains to half). Between collectives only member `rank`'s own queue holds
  // its own reading back. Returns at once when no member is behind.
  boost::asio::awaitable<void> WaitWhileCongested(uint32_t rank);
  // The aggregator is draining: a running collective may finish, then the job ends with SHUTTING_DOWN; a job with
  // no collective running ends at once.
  void Drain();
  // A rank of this job sent a Hello that cannot be accepted (e.g. rank out of range): while the job is still
  // forming it can never complete, so its members learn why at once instead of at their join timeout.
  void AbortIfForming(const Status& error, uint32_t rank);

 private:
  void OnCollectiveBegin(uint32_t rank, const proto::CollectiveBegin& begin);
  // The error memory of the spec's key when its codec needs one (3LC with ternary results), created (and its
  // memory reserved) at first use; nullptr when none is needed.
  Result<codec::ErrorMemory*> ErrorMemoryFor(const CollectiveSpec& spec);
  // Checks the limits a new collective must fit (tensor size, per-job and total memory) and reserves its memory
  // in the shared budget: the engine's, and what its RESULTs can hold while they wait in members' send queues
  // (bounded by the backpressure limit, which it sets for this collective). Returns the two reservations.
  struct Admission {
    MemoryReservation engine;
    MemoryReservation results;
  };
  Result<Admission> Admit(const CollectiveSpec& spec);
  void EndForDrain();
  void MaybeCompleteCollective();
  void Violation(uint32_t rank, const Status& error);
  std::string Describe(uint32_t rank) const;        // "job J rank R (peer P)"
  std::string DescribeMember(uint32_t rank) const;  // "rank R (peer P)", in a text that names the job already
  // The active collective (completed or failed) ends: its RESULTs still in send queues keep their reservation in
  // undelivered_results_ until written (OnMemberIdle) or the job goes.
  void HoldQueuedResults();
  // " (rank R at P, ...)" for those of `ranks` that are connected; "" if none is.
  std::string PeersOf(const std::vector<uint32_t>& ranks) const;
  std::string DescribeDepartures() const;     // "rank(s) R left the job (rank R because: why)"
  void ReleaseIfEmpty();
  void Progress() { last_progress_ = std::chrono::steady_clock::now(); }
  void ArmStallTimer(std::chrono::steady_clock::time_point deadline);
  // Members with more than the backpressure limit of frames queued (ascending ranks).
  std::vector<uint32_t> CongestedRanks() const;
  size_t CongestionLimit() const;
  bool AnyMemberQueued() const;
  void OnStallTimer(uint64_t seq);
  // --formation-timeout-ms after the first Hello: ends the job if it has not formed by then.
  void ArmFormationTimer();
  void OnFormationTimer();

  const uint64_t id_;
  boost::asio::any_io_executor strand_;
  JobRegistry& registry_;
  JobShape shape_;
  uint32_t aggregator_index_ = 0;
  std::vector<std::shared_ptr<Session>> members_;  // by rank; empty until the first Hello fixes the shape
  uint32_t joined_ = 0;
  bool formed_ = false;
  bool dead_ = false;
  std::vector<uint32_t> departed_;                       // ranks that left after formation
  std::map<uint32_t, std::string> departure_reasons_;  // their Goodbye reasons, where they gave one
  std::optional<ActiveCollective> active_;
  // Frames queued for one member beyond which the job stops reading (WaitWhileCongested); set per collective from
  // its largest RESULT, 0 until the first.
  size_t congestion_limit_ = 0;
  // Completed collectives' RESULT reservations, held until no member has frames queued (OnMemberIdle).
  std::vector<MemoryReservation> undelivered_results_;
  // 3LC's error feedback on the results this aggregator sends, per collective key, for the job's lifetime; each
  // holds its share of --max-total-memory while it exists.
  struct KeyedErrorMemory {
    KeyedErrorMemory(uint64_t elements, uint64_t blocks, uint32_t block_size, MemoryReservation&& reserved)
        : reservation(std::move(reserved)), elements(elements), memory(blocks, block_size) {}
    // First: it holds the bytes reserved before while `memory` is allocated (which may throw).
    MemoryReservation reservation;
    uint64_t elements;  // of the tensor it was made for: another size starts over, as the workers' error does
    codec::ErrorMemory memory;
  };
  std::map<uint64_t, std::unique_ptr<KeyedErrorMemory>> error_memories_;
  uint64_t error_memory_bytes_ = 0;  // reserved by error_memories_, entries included
  // What a key's entry costs beyond its blocks (the map node, the structs, the vectors' headers), rounded up.
  static constexpr uint64_t kErrorMemoryEntryBytes = 256;
  void EraseErrorMemory(std::map<uint64_t, std::unique_ptr<KeyedErrorMemory>>::iterator it);
  uint64_t last_completed_seq_ = 0;
  ServiceContext& context_;
  bool draining_ = false;
  boost::asio::steady_timer stall_timer_;
  boost::asio::steady_timer formation_timer_;
  // Never expires: sessions held back by WaitWhileCongested wait on it, and cancel() wakes them all.
  boost::asio::steady_timer uncongested_;
  std::chrono::steady_clock::time_point last_progress_;
};

}  // namespace sparsereduce::aggregator
