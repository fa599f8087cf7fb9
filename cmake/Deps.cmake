# Dependencies come from Debian's -dev packages (scripts/install-deps.sh); no network fetches.
find_package(PkgConfig REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(hwy REQUIRED)
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
# Tensor parallelism's host collectives and launch (src/dist): Open MPI, Debian libopenmpi-dev + openmpi-bin. The
# C API only (MPI_CXX_SKIP_MPICXX: the deprecated C++ bindings stay out).
if(FP4SERVE_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(HTTPLIB IMPORTED_TARGET cpp-httplib)
# The chat REPL's line editing and history (BSD-licensed libedit, Debian libedit-dev; not GPL readline).
pkg_check_modules(LIBEDIT REQUIRED IMPORTED_TARGET libedit)
find_library(UTF8PROC_LIBRARY NAMES utf8proc REQUIRED)
if(FP4SERVE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  # SHA-256 digests of reference tensors in tests/data (libssl-dev); tests only, the engine does not link it.
  find_package(OpenSSL REQUIRED COMPONENTS Crypto)
endif()
if(FP4SERVE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
  # Optional: only bench_gemm_fp4's dequantize + sgemm baselines use it; without it they are not built.
  pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
endif()
