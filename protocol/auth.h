// Job authentication (docs/PROTOCOL.md §5.1, docs/SECURITY.md): a challenge-response over HMAC-SHA256 with the
// job's shared secret, in which each side proves it knows the secret and the secret never crosses the wire. Both
// proofs cover both nonces and the worker's Hello identity, so a proof cannot be replayed on another connection,
// job or rank, and the two directions use distinct labels so one side's proof is never valid for the other.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace sparsereduce::auth {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kProofSize = 32;  // HMAC-SHA256

// What both proofs are bound to.
struct Transcript {
  uint64_t job = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t aggregator_index = 0;
  std::string_view client_nonce;
  std::string_view server_nonce;
};

std::string ServerProof(std::string_view secret, const Transcript& transcript);
std::string ClientProof(std::string_view secret, const Transcript& transcript);
// Constant-time comparison (no early exit that would leak how many leading bytes matched).
bool ProofMatches(std::string_view expected, std::string_view received);
// kNonceSize bytes from the OS's cryptographic generator.
std::string RandomNonce();
// `n` bytes from the OS's cryptographic generator (OpenSSL RAND_bytes); throws std::runtime_error if it fails.
std::string RandomBytes(size_t n);

// A secret as read from a file or variable: one trailing newline (as `echo` or an editor leaves it) is dropped.
// INVALID_ARGUMENT when nothing remains.
Result<std::string> NormalizeSecret(std::string raw, const std::string& source);

}  // namespace sparsereduce::auth
