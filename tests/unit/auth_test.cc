// Job authentication proofs (protocol/auth.h): both sides agree with the same secret, and any difference in the
// secret or in what the proof is bound to makes it fail.
#include "protocol/auth.h"

#include <gtest/gtest.h>

#include <boost/algorithm/hex.hpp>
#include <iterator>

namespace sparsereduce::auth {
namespace {

struct Fixture {
  std::string client_nonce = RandomNonce();
  std::string server_nonce = RandomNonce();
  Transcript transcript() const { return Transcript{7, 1, 4, 2, client_nonce, server_nonce}; }
};

TEST(Auth, SameSecretSameTranscriptMatches) {
  Fixture f;
  EXPECT_EQ(ServerProof("s3cret", f.transcript()).size(), kProofSize);
  EXPECT_TRUE(ProofMatches(ServerProof("s3cret", f.transcript()), ServerProof("s3cret", f.transcript())));
  EXPECT_TRUE(ProofMatches(ClientProof("s3cret", f.transcript()), ClientProof("s3cret", f.transcript())));
}

std::string Hex(const std::string& bytes) {
  std::string out;
  boost::algorithm::hex_lower(bytes.begin(), bytes.end(), std::back_inserter(out));
  return out;
}

// Known answers, computed from docs/PROTOCOL.md §5.1 alone (Python's hmac and struct.pack('<QIII', ...) over the
// transcript): the tests above compare the code with itself, and would pass if both proofs drifted from the
// contract together (byte order, field order, a label, the length prefixes).
TEST(Auth, ProofsMatchTheProtocolsKnownAnswers) {
  const std::string client_nonce(32, '\x11'), server_nonce(32, '\x22');
  const Transcript transcript{0x0102030405060708, 3, 4, 1, client_nonce, server_nonce};
  EXPECT_EQ(Hex(ServerProof("secret", transcript)),
            "3d5b5b834cf6928beccd18dac2e91c583eae85e1f7b82cb1dc12de5e996286d3");
  EXPECT_EQ(Hex(ClientProof("secret", transcript)),
            "8e3542344adbed92694ab846f0e168fbea857e169d4f2414d1434ae98c5ba494");
}

TEST(Auth, DirectionsAreDistinct) {
  Fixture f;
  // A server proof replayed as the client's answer must not pass.
  EXPECT_FALSE(ProofMatches(ClientProof("s3cret", f.transcript()), ServerProof("s3cret", f.transcript())));
}

TEST(Auth, EveryBoundFieldChangesTheProof) {
  Fixture f;
  const std::string base = ClientProof("s3cret", f.transcript());
  EXPECT_FALSE(ProofMatches(base, ClientProof("s3creT", f.transcript())));
  std::vector<Transcript> changed(6, f.transcript());
  changed[0].job = 8;
  changed[1].rank = 0;
  changed[2].world_size = 5;
  changed[3].aggregator_index = 0;
  const std::string other = RandomNonce();
  changed[4].client_nonce = other;
  changed[5].server_nonce = other;
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_FALSE(ProofMatches(base, ClientProof("s3cret", changed[i]))) << "field " << i;
  }
}

TEST(Auth, FieldsCannotShiftIntoEachOther) {
  // Length prefixes: moving a byte from one nonce to the other gives another proof.
  const std::string a = "abc", b = "def", a2 = "abcd", b2 = "ef";
  EXPECT_FALSE(
      ProofMatches(ClientProof("k", Transcript{1, 0, 1, 0, a, b}), ClientProof("k", Transcript{1, 0, 1, 0, a2, b2})));
}

TEST(Auth, ProofMatchesRejectsOtherLengths) {
  EXPECT_FALSE(ProofMatches("abcd", "abc"));
  EXPECT_FALSE(ProofMatches("abcd", ""));
  EXPECT_TRUE(ProofMatches("", ""));
}

TEST(Auth, NoncesAreFreshAndFullSize) {
  const std::string a = RandomNonce(), b = RandomNonce();
  EXPECT_EQ(a.size(), kNonceSize);
  EXPECT_NE(a, b);
}

TEST(Auth, NormalizeSecretDropsOneTrailingNewline) {
  auto normalized = [](std::string raw) {
    Result<std::string> r = NormalizeSecret(std::move(raw), "f");
    return r.ok() ? *r : "<error>";
  };
  EXPECT_EQ(normalized("abc\n"), "abc");
  EXPECT_EQ(normalized("abc\r\n"), "abc");
  EXPECT_EQ(normalized("abc\n\n"), "abc\n");
  EXPECT_EQ(normalized(" abc "), " abc ");
  EXPECT_FALSE(NormalizeSecret("\n", "f").ok());
  EXPECT_FALSE(NormalizeSecret("", "f").ok());
}

}  // namespace
}  // namespace sparsereduce::auth
