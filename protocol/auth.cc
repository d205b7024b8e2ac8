#include "protocol/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

namespace sparsereduce::auth {
namespace {

// Little-endian, like the data plane.
template <typename T>
void AppendLittleEndian(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void AppendU64(std::string& out, uint64_t v) { AppendLittleEndian(out, v); }
void AppendU32(std::string& out, uint32_t v) { AppendLittleEndian(out, v); }
void AppendField(std::string& out, std::string_view field) {
  AppendU32(out, static_cast<uint32_t>(field.size()));  // length-prefixed: no ambiguity between fields
  out.append(field);
}

std::string Proof(std::string_view label, std::string_view secret, const Transcript& t) {
  std::string message;
  AppendField(message, label);
  AppendU64(message, t.job);
  AppendU32(message, t.rank);
  AppendU32(message, t.world_size);
  AppendU32(message, t.aggregator_index);
  AppendField(message, t.client_nonce);
  AppendField(message, t.server_nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_size) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");  // only on OpenSSL misconfiguration
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_size);
}

}  // namespace

std::string ServerProof(std::string_view secret, const Transcript& t) {
  return Proof("sparsereduce/1 aggregator proof", secret, t);
}

std::string ClientProof(std::string_view secret, const Transcript& t) {
  return Proof("sparsereduce/1 worker proof", secret, t);
}

bool ProofMatches(std::string_view expected, std::string_view received) {
  return expected.size() == received.size() && CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

std::string RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(bytes.size())) != 1) {
    throw std::runtime_error("the OS random generator failed");
  }
  return bytes;
}

std::string RandomNonce() { return RandomBytes(kNonceSize); }

Result<std::string> NormalizeSecret(std::string raw, const std::string& source) {
  if (raw.ends_with("\r\n")) {
    raw.resize(raw.size() - 2);
  } else if (raw.ends_with('\n')) {
    raw.pop_back();
  }
  if (raw.empty()) return InvalidArgument("the job secret from " + source + " is empty");
  return raw;
}

}  // namespace sparsereduce::auth
