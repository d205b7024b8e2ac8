// The aggregator's Prometheus metrics (text format 0.0.4 on /metrics; docs/OPERATIONS.md lists them). Thread-safe:
// every update is an atomic operation, called from any job strand or session.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "core/status.h"

namespace sparsereduce::aggregator {

class Metrics {
 public:
  explicit Metrics(const std::string& instance);

  void SetJobs(size_t jobs) { jobs_.Set(static_cast<double>(jobs)); }
  void WorkerJoined() { workers_.Increment(); }
  void WorkerLeft() { workers_.Decrement(); }
  void BytesReceived(uint64_t n) { bytes_received_.Increment(static_cast<double>(n)); }
  void BytesSent(uint64_t n) { bytes_sent_.Increment(static_cast<double>(n)); }
  // A CONTRIBUTION summed where it lies in a shared-memory ring (transport::Channel::ReadPayloadLent).
  void ContributionInPlace() { contributions_in_place_.Increment(); }
  // A connection needed back the ring space its in-place CONTRIBUTIONs held: the job copied them out.
  void RingRecalled() { ring_recalls_.Increment(); }
  // `owned_blocks`: blocks of the tensor in this aggregator's columns; those not aggregated were skipped because
  // every worker's block there was zero.
  void CollectiveCompleted(double seconds, uint64_t blocks_aggregated, uint64_t owned_blocks);
  void CollectiveFailed() { collectives_failed_.Increment(); }
  // Every error the aggregator reports (to a worker or on a connection it drops), by its code.
  void Error(StatusCode code);

  // The text exposition of every metric, with the sampled gauges set to these values.
  std::string Render(uint64_t memory_reserved, bool draining);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& jobs_;
  prometheus::Gauge& workers_;
  prometheus::Family<prometheus::Counter>& collectives_;
  prometheus::Counter& collectives_completed_;
  prometheus::Counter& collectives_failed_;
  prometheus::Counter& bytes_received_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& contributions_in_place_;
  prometheus::Counter& ring_recalls_;
  prometheus::Counter& blocks_aggregated_;
  prometheus::Counter& blocks_skipped_;
  prometheus::Histogram& collective_duration_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Gauge& memory_reserved_;
  prometheus::Gauge& draining_;
};

}  // namespace sparsereduce::aggregator
