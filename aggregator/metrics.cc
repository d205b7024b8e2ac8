#include "aggregator/metrics.h"

#include <prometheus/text_serializer.h>

namespace sparsereduce::aggregator {

namespace pm = prometheus;

namespace {

template <typename Builder>
auto& Register(Builder builder, const char* name, const char* help, pm::Registry& registry,
               const std::string& instance) {
  return builder.Name(name).Help(help).Labels({{"instance_name", instance}}).Register(registry);
}

}  // namespace

Metrics::Metrics(const std::string& instance)
    : registry_(std::make_shared<pm::Registry>()),
      jobs_(Register(pm::BuildGauge(), "sparsereduce_jobs", "Jobs this aggregator is serving (forming or formed)",
                     *registry_, instance)
                .Add({})),
      workers_(Register(pm::BuildGauge(), "sparsereduce_connected_workers",
                        "Worker connections that joined a job and are still open", *registry_, instance)
                   .Add({})),
      collectives_(Register(pm::BuildCounter(), "sparsereduce_collectives_total", "Collectives that ended, by outcome",
                            *registry_, instance)),
      collectives_completed_(collectives_.Add({{"outcome", "completed"}})),
      collectives_failed_(collectives_.Add({{"outcome", "failed"}})),
      bytes_received_(Register(pm::BuildCounter(), "sparsereduce_received_bytes_total",
                               "Bytes received from workers (frame headers included)", *registry_, instance)
                          .Add({})),
      bytes_sent_(Register(pm::BuildCounter(), "sparsereduce_sent_bytes_total",
                           "Bytes queued to workers (frame headers included)", *registry_, instance)
                      .Add({})),
      contributions_in_place_(Register(pm::BuildCounter(), "sparsereduce_contributions_in_place_total",
                                       "CONTRIBUTION frames summed where they lie in a shared-memory ring (not copied)",
                                       *registry_, instance)
                                  .Add({})),
      ring_recalls_(Register(pm::BuildCounter(), "sparsereduce_ring_recalls_total",
                             "Times a shared-memory connection needed back the ring space its in-place frames held "
                             "(they were copied out)",
                             *registry_, instance)
                        .Add({})),
      blocks_aggregated_(Register(pm::BuildCounter(), "sparsereduce_blocks_aggregated_total",
                                  "Blocks summed and sent back (nonzero on at least one worker)", *registry_,
                                  instance)
                             .Add({})),
      blocks_skipped_(Register(pm::BuildCounter(), "sparsereduce_blocks_skipped_total",
                               "Blocks in this aggregator's columns that no worker sent (zero everywhere)",
                               *registry_, instance)
                          .Add({})),
      collective_duration_(
          Register(pm::BuildHistogram(), "sparsereduce_collective_duration_seconds",
                   "Time from a collective's first CollectiveBegin to its last RESULT on this aggregator", *registry_,
                   instance)
              .Add({}, pm::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                       0.5, 1, 2.5, 5, 10, 30})),
      errors_(Register(pm::BuildCounter(), "sparsereduce_errors_total",
                       "Errors reported to workers or on dropped connections, by kind", *registry_, instance)),
      memory_reserved_(Register(pm::BuildGauge(), "sparsereduce_memory_reserved_bytes",
                                "Memory bound reserved by running collectives, RESULTs still queued and 3LC error "
                                "memory (see --max-total-memory)",
                                *registry_, instance)
                           .Add({})),
      draining_(Register(pm::BuildGauge(), "sparsereduce_draining",
                         "1 while the aggregator drains after SIGTERM (not ready), else 0", *registry_, instance)
                    .Add({})) {
  // Every kind from 0 at start: a series that appears only with its first error is invisible to rate() and
  // increase(), so an alert on them would miss the first error of each kind.
  for (int code = static_cast<int>(StatusCode::kOk) + 1; code <= static_cast<int>(StatusCode::kInternal); ++code) {
    errors_.Add({{"kind", StatusCodeName(static_cast<StatusCode>(code))}});
  }
}

void Metrics::CollectiveCompleted(double seconds, uint64_t blocks_aggregated, uint64_t owned_blocks) {
  collectives_completed_.Increment();
  collective_duration_.Observe(seconds);
  blocks_aggregated_.Increment(static_cast<double>(blocks_aggregated));
  if (owned_blocks > blocks_aggregated)
    blocks_skipped_.Increment(static_cast<double>(owned_blocks - blocks_aggregated));
}

void Metrics::Error(StatusCode code) { errors_.Add({{"kind", StatusCodeName(code)}}).Increment(); }

std::string Metrics::Render(uint64_t memory_reserved, bool draining) {
  memory_reserved_.Set(static_cast<double>(memory_reserved));
  draining_.Set(draining ? 1 : 0);
  return pm::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace sparsereduce::aggregator
