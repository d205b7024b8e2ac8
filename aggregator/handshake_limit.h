// How many connections from one client address may be in their handshake at once (--max-handshakes-per-address).
// A connection holds a descriptor and a Session until its handshake ends, at most --handshake-timeout-ms; without
// a bound one host could hold as many as it can open (tens of thousands per address), and so the descriptors that
// every other client needs. A handshake takes a round trip or two, so a host's real workers are far below it.
// Thread-safe.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace sparsereduce::aggregator {

class HandshakeLimit {
 public:
  explicit HandshakeLimit(uint32_t per_address) : per_address_(per_address) {}
  HandshakeLimit(const HandshakeLimit&) = delete;
  HandshakeLimit& operator=(const HandshakeLimit&) = delete;

  // One address's place, given back when destroyed.
  class Slot {
   public:
    Slot(HandshakeLimit* limit, boost::asio::ip::address address) : limit_(limit), address_(std::move(address)) {}
    Slot(Slot&& other) noexcept : limit_(other.limit_), address_(other.address_) { other.limit_ = nullptr; }
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        if (limit_) limit_->Release(address_);
        limit_ = std::exchange(other.limit_, nullptr);
        address_ = other.address_;
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    ~Slot() {
      if (limit_) limit_->Release(address_);
    }

   private:
    HandshakeLimit* limit_;
    boost::asio::ip::address address_;
  };

  // A place for one more handshake from `address`, or nullopt when it has per_address() already.
  std::optional<Slot> TryAcquire(const boost::asio::ip::address& address) {
    std::lock_guard lock(mutex_);
    uint32_t& count = counts_[address];
    if (count >= per_address_) return std::nullopt;
    ++count;
    return std::optional<Slot>(std::in_place, this, address);
  }
  uint32_t per_address() const { return per_address_; }

 private:
  void Release(const boost::asio::ip::address& address) {
    std::lock_guard lock(mutex_);
    auto it = counts_.find(address);
    if (it != counts_.end() && --it->second == 0) counts_.erase(it);
  }

  const uint32_t per_address_;
  std::mutex mutex_;
  std::map<boost::asio::ip::address, uint32_t> counts_;  // only addresses with a handshake running
};

}  // namespace sparsereduce::aggregator
