#include "tools/common/synthetic_tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace sparsereduce::tools {
namespace {

SyntheticSpec Valid() { return SyntheticSpec{1 << 20, 256, 0.5, Overlap::kRandom, 4, 7}; }

TEST(SyntheticTensor, ValidSpecsPass) {
  for (const double density : {0.0, 1e-9, 0.5, 1.0}) {
    SyntheticSpec spec = Valid();
    spec.density = density;
    EXPECT_TRUE(ValidateSpec(spec).ok()) << density;
  }
  SyntheticSpec one = Valid();
  one.block_size = 1;
  one.world_size = 1;
  EXPECT_TRUE(ValidateSpec(one).ok());
}

// A block size of 0 would divide by zero in FillTensor and UnionDensity; densities outside [0, 1] mean nothing.
TEST(SyntheticTensor, InvalidSpecsFailWithTheReason) {
  SyntheticSpec spec = Valid();
  spec.block_size = 0;
  Status st = ValidateSpec(spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block size 0"), std::string::npos) << st.ToString();

  spec = Valid();
  spec.world_size = 0;
  st = ValidateSpec(spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("world size 0"), std::string::npos) << st.ToString();

  for (const double density : {-0.1, 1.0000001, 2.0, std::numeric_limits<double>::quiet_NaN(),
                               std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    spec = Valid();
    spec.density = density;
    st = ValidateSpec(spec);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << density;
    EXPECT_NE(st.message().find("density"), std::string::npos) << st.ToString();
  }
}

double MeasuredRankDensity(const SyntheticSpec& spec, uint32_t rank) {
  std::vector<float> x(spec.elements);
  FillTensor(spec, rank, x);
  uint64_t nonzero = 0, blocks = 0;
  for (uint64_t begin = 0; begin < spec.elements; begin += spec.block_size, ++blocks) nonzero += x[begin] != 0.0f;
  return static_cast<double>(nonzero) / static_cast<double>(blocks);
}

// Disjoint overlap deals each rank every W-th block, so a rank cannot have more than 1/W of them nonzero, whatever
// density was asked for; RankDensity says what the tensors really hold.
TEST(SyntheticTensor, RankDensityIsWhatTheTensorsHold) {
  SyntheticSpec spec = Valid();
  spec.overlap = Overlap::kDisjoint;
  spec.density = 0.9;
  EXPECT_DOUBLE_EQ(RankDensity(spec), 0.25);
  for (uint32_t rank = 0; rank < spec.world_size; ++rank) {
    EXPECT_DOUBLE_EQ(MeasuredRankDensity(spec, rank), 0.25) << rank;  // every owned block is nonzero
  }
  spec.density = 0.1;
  EXPECT_DOUBLE_EQ(RankDensity(spec), 0.1);
  EXPECT_NEAR(MeasuredRankDensity(spec, 1), 0.1, 0.02);

  for (const Overlap overlap : {Overlap::kRandom, Overlap::kFull}) {
    spec.overlap = overlap;
    spec.density = 0.9;
    EXPECT_DOUBLE_EQ(RankDensity(spec), 0.9);
    EXPECT_NEAR(MeasuredRankDensity(spec, 2), 0.9, 0.02);
  }
}

}  // namespace
}  // namespace sparsereduce::tools
