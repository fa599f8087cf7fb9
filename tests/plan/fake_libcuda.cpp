// SPDX-License-Identifier: Apache-2.0
// A stand-in for the CUDA driver library (built as libcuda.so.1 in its own folder, found through LD_LIBRARY_PATH
// by device_caps_test only): the six driver entry points plan::detect_cuda resolves, reporting one sm_90 device.
// Return value 0 is CUDA_SUCCESS; attribute ids 75/76 are the compute capability major/minor (cuda.h).
#include <cstddef>
#include <cstring>

extern "C" {
__attribute__((visibility("default"))) int cuInit(unsigned /*flags*/) { return 0; }
__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  *count = 1;
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? 0 : 101;  // CUDA_ERROR_INVALID_DEVICE
}
__attribute__((visibility("default"))) int cuDeviceGetAttribute(int* value, int attribute, int /*device*/) {
  if (attribute == 75) *value = 9;
  else if (attribute == 76) *value = 0;
  else return 1;  // CUDA_ERROR_INVALID_VALUE
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceGetName(char* name, int length, int /*device*/) {
  std::strncpy(name, "fp4serve fake GPU", static_cast<size_t>(length));
  return 0;
}
__attribute__((visibility("default"))) int cuDeviceTotalMem_v2(size_t* bytes, int /*device*/) {
  *bytes = size_t{141} << 30;
  return 0;
}
}
