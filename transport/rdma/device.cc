#include "transport/rdma/device.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sparsereduce::rdma {
namespace {

std::string Bytes(uint64_t n) {
  if (n == UINT64_MAX) return "unlimited";
  if (n >= (1ull << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= (1ull << 10)) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

}  // namespace

MemlockState ReadMemlockState() {
  MemlockState state;
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    state.limit = limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(limit.rlim_cur);
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) == 0) {
    state.cap_ipc_lock = (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
  }
  return state;
}

Status CheckMemlock(const MemlockState& state, uint64_t needed) {
  if (state.cap_ipc_lock || state.limit == UINT64_MAX || state.limit >= needed) return Status::Ok();
  return Status(StatusCode::kResourceExhausted,
                "RDMA needs to lock " + Bytes(needed) + " of registered memory but the memlock limit is " +
                    Bytes(state.limit) + " and the process lacks CAP_IPC_LOCK: raise the limit (systemd "
                    "LimitMEMLOCK=infinity, `ulimit -l unlimited`, docker --ulimit memlock=-1) or grant "
                    "CAP_IPC_LOCK");
}

uint64_t ConnectionsWithinMemlock(const MemlockState& state, uint64_t per_connection) {
  if (state.cap_ipc_lock || state.limit == UINT64_MAX || per_connection == 0) return UINT64_MAX;
  return state.limit / per_connection;
}

Result<std::shared_ptr<RdmaDevice>> RdmaDevice::Open(const RdmaOptions& options, uint64_t memory_needed) {
  if (Status st = CheckMemlock(ReadMemlockState(), memory_needed); !st.ok()) return st;
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    // On a kernel without RDMA (no ib_uverbs), rdma-core reports ENOSYS instead of an empty list.
    const int error = errno;
    return Status(StatusCode::kUnavailable,
                  std::string("no RDMA support in this kernel (ibv_get_device_list: ") + std::strerror(error) +
                      "): load the NIC's RDMA driver and ib_uverbs, or use another transport");
  }
  std::shared_ptr<RdmaDevice> device(new RdmaDevice());
  device->options_ = options;
  std::string names;
  ibv_device* chosen = nullptr;
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + std::string(name);
    if (chosen == nullptr && (options.device.empty() || options.device == name)) chosen = list[i];
  }
  if (chosen == nullptr) {
    ibv_free_device_list(list);
    if (count == 0) return Status(StatusCode::kUnavailable, "no RDMA device found (ibv_devices lists none)");
    return Status(StatusCode::kUnavailable, "RDMA device '" + options.device + "' not found; devices: " + names);
  }
  device->name_ = ibv_get_device_name(chosen);
  device->context_ = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (device->context_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  "cannot open RDMA device " + device->name_ + ": " + std::strerror(errno) +
                      " (is /dev/infiniband/uverbs* accessible?)");
  }
  if (int e = ibv_query_device(device->context_, &device->device_attr_)) {
    return Status(StatusCode::kUnavailable, "ibv_query_device on " + device->name_ + ": " + std::strerror(e));
  }
  if (ibv_query_port(device->context_, options.port, &device->port_attr_) != 0) {
    return Status(StatusCode::kUnavailable,
                  "RDMA device " + device->name_ + " has no port " + std::to_string(options.port));
  }
  if (device->port_attr_.state != IBV_PORT_ACTIVE) {
    return Status(StatusCode::kUnavailable, "port " + std::to_string(options.port) + " of RDMA device " +
                                                device->name_ + " is not active (" +
                                                ibv_port_state_str(device->port_attr_.state) + ")");
  }
  if (options.gid_index >= 0) {
    const ibv_gid empty{};
    // An index within the table but not in use reads as all zeros: no address a peer could reach.
    if (options.gid_index >= device->port_attr_.gid_tbl_len ||
        ibv_query_gid(device->context_, options.port, options.gid_index, &device->gid_) != 0 ||
        std::memcmp(device->gid_.raw, empty.raw, sizeof empty.raw) == 0) {
      return Status(StatusCode::kUnavailable,
                    "RDMA device " + device->name_ + " port " + std::to_string(options.port) + " has no GID at index " +
                        std::to_string(options.gid_index) + " (" + std::to_string(device->port_attr_.gid_tbl_len) +
                        " entries; `show_gids` lists those in use)");
    }
  }
  if (options.gid_index < 0 && device->port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET) {
    return Status(StatusCode::kInvalidArgument,
                  "RDMA device " + device->name_ + " is RoCE (Ethernet): give a GID index (RoCEv2: usually 3; "
                  "`show_gids` lists them)");
  }
  return device;
}

RdmaDevice::~RdmaDevice() {
  if (context_ != nullptr) ibv_close_device(context_);
}

}  // namespace sparsereduce::rdma
