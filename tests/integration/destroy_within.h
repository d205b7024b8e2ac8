// Destroying a Worker with a bound on its destructor, for tests of the destructor: a hang fails the test instead of
// holding ctest until its timeout (a std::async future would wait for the destructor in its own).
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "sparsereduce/worker.h"

namespace sparsereduce::testing {

// Destroys `worker` on a thread of its own and waits up to `timeout`. False when the destructor has not returned by
// then: the Worker is left to that thread, which the test process's exit ends.
inline bool DestroyWithin(std::unique_ptr<Worker> worker, std::chrono::milliseconds timeout) {
  auto destroyed = std::make_shared<std::promise<void>>();
  std::future<void> done = destroyed->get_future();
  std::thread([w = std::move(worker), destroyed]() mutable {
    w.reset();
    destroyed->set_value();
  }).detach();
  return done.wait_for(timeout) == std::future_status::ready;
}

}  // namespace sparsereduce::testing
