// The run-time NCCL rule (src/comm/nccl_version.h, used by check_nccl_version()): the same major
// version as the headers, at least as new.
#include <gtest/gtest.h>

#include "comm/nccl_version.h"

namespace mhccl::comm {
namespace {

TEST(NcclVersion, String) {
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(23203), "2.32.3");
  EXPECT_EQ(nccl_version_string(30001), "3.0.1");
}

TEST(NcclVersion, SameOrNewerOfTheSameMajorIsAccepted) {
  EXPECT_EQ(nccl_version_mismatch(22809, 22809), "");
  EXPECT_EQ(nccl_version_mismatch(22810, 22809), "");  // newer patch
  EXPECT_EQ(nccl_version_mismatch(23203, 22809), "");  // newer minor (a newer PyTorch's NCCL)
  EXPECT_EQ(nccl_version_mismatch(29999, 22809), "");
}

TEST(NcclVersion, OlderIsRefusedNamingBoth) {
  const std::string patch = nccl_version_mismatch(22803, 22809);  // 2.28.3: /usr/lib on the GPU machine
  EXPECT_NE(patch.find("2.28.3"), std::string::npos) << patch;
  EXPECT_NE(patch.find("2.28.9"), std::string::npos) << patch;
  EXPECT_NE(patch.find("older"), std::string::npos) << patch;
  const std::string minor = nccl_version_mismatch(22707, 22809);
  EXPECT_NE(minor.find("2.27.7"), std::string::npos) << minor;
  EXPECT_NE(minor.find("older"), std::string::npos) << minor;
}

TEST(NcclVersion, AnotherMajorIsRefusedNamingBoth) {
  for (int library : {30000, 32809, 12809}) {
    const std::string why = nccl_version_mismatch(library, 22809);
    EXPECT_NE(why.find(nccl_version_string(library)), std::string::npos) << why;
    EXPECT_NE(why.find("2.28.9"), std::string::npos) << why;
    EXPECT_NE(why.find("major"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace mhccl::comm
