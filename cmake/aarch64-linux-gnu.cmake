# Cross build for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu and the arm64 multiarch -dev packages
# (scripts/install-deps.sh --arm64). Tests run under qemu-user (`make test-arm`): CMake uses the emulator for
# gtest discovery and ctest, with `-cpu max` unless FP4SERVE_QEMU_CPU names another CPU model.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Only the arm64 multiarch libraries and config files; headers are shared between architectures.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
if(NOT DEFINED FP4SERVE_QEMU_CPU)
  set(FP4SERVE_QEMU_CPU max)
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-cpu;${FP4SERVE_QEMU_CPU})
