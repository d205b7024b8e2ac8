// Opening an RDMA device for the verbs backend, with the checks users trip over first: no RDMA in the kernel, no
// device, a port that is down, a memlock limit too low for the registered rings and no CAP_IPC_LOCK to lift it.
// Every failure is a Status whose message says what to do.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace sparsereduce::rdma {

struct RdmaOptions {
  std::string device;  // e.g. "mlx5_0"; empty: the first device
  uint8_t port = 1;
  int gid_index = -1;  // RoCE (v2: usually 3 on Mellanox/NVIDIA NICs); -1: InfiniBand addressing by LID
};

// What the memlock check needs, separated from the system calls so it can be tested.
struct MemlockState {
  uint64_t limit = 0;  // RLIMIT_MEMLOCK soft limit in bytes; UINT64_MAX when unlimited
  bool cap_ipc_lock = false;
};
MemlockState ReadMemlockState();
// Ok when `needed` bytes may be registered (pinned) under `state`, else an error that says how to fix it.
Status CheckMemlock(const MemlockState& state, uint64_t needed);
// How many connections of `per_connection` pinned bytes each fit under `state` at once; UINT64_MAX when unbounded.
uint64_t ConnectionsWithinMemlock(const MemlockState& state, uint64_t per_connection);

// An open device: context, port and device attributes. Shared by the connections of one process; each connection
// has a protection domain of its own (RdmaConnection).
class RdmaDevice {
 public:
  // Opens `options.device` (or the first one) and checks the port. `memory_needed` is what the caller will
  // register; it is checked against the memlock limit first.
  static Result<std::shared_ptr<RdmaDevice>> Open(const RdmaOptions& options, uint64_t memory_needed);

  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;
  ~RdmaDevice();

  ibv_context* context() const { return context_; }
  const RdmaOptions& options() const { return options_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  const ibv_gid& gid() const { return gid_; }
  const std::string& name() const { return name_; }

 private:
  RdmaDevice() = default;

  RdmaOptions options_;
  std::string name_;
  ibv_context* context_ = nullptr;
  ibv_port_attr port_attr_{};
  ibv_device_attr device_attr_{};
  ibv_gid gid_{};
};

}  // namespace sparsereduce::rdma
