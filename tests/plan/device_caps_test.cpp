// SPDX-License-Identifier: Apache-2.0
// plan::detect_cuda against a fake driver library (fake_libcuda.cpp, first on LD_LIBRARY_PATH for this binary
// only): the device it reports is read correctly, and the driver library stays loaded after the call — unloading
// it after cuInit has crashed processes on real drivers (issue 21).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "plan/device_caps.h"

namespace fp4serve::plan {
namespace {

TEST(DetectCuda, ReadsTheDriverAndKeepsItLoaded) {
  const auto caps = detect_cuda();
  ASSERT_TRUE(caps.has_value()) << "the fake libcuda.so.1 was not found: is LD_LIBRARY_PATH set by ctest?";
  EXPECT_EQ(caps->kind, DeviceKind::Cuda);
  EXPECT_EQ(caps->sm, 90);
  EXPECT_EQ(caps->name, "fp4serve fake GPU");
  EXPECT_EQ(caps->memory_bytes, size_t{141} << 30);
  // RTLD_NOLOAD opens nothing: it succeeds only when the library is still resident.
  void* resident = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  EXPECT_NE(resident, nullptr) << "libcuda.so.1 was unloaded after cuInit";
  if (resident != nullptr) dlclose(resident);  // drops only the reference NOLOAD added
  // A second detection reuses the same handle and gives the same answer.
  const auto again = detect_cuda();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->sm, 90);
}

}  // namespace
}  // namespace fp4serve::plan
