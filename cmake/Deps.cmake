# Dependencies come from Debian's -dev packages (scripts/install-deps.sh); no network fetches. The one exception,
# xgrammar (not packaged by Debian), is built from its pinned PyPI sdist by scripts/build-xgrammar.sh, which
# install-deps.sh runs; CMake only looks for the result.
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
# Constrained decoding (src/runtime/structured_output.*): xgrammar's static library and headers, by default in
# .deps/xgrammar (FP4SERVE_XGRAMMAR_ROOT); a system-wide install is found too. Its public headers include dlpack,
# which the same prefix holds. Imported as SYSTEM includes: our warnings-as-errors are not for its headers.
set(FP4SERVE_XGRAMMAR_ROOT "${PROJECT_SOURCE_DIR}/.deps/xgrammar" CACHE PATH "Where scripts/build-xgrammar.sh installed xgrammar")
if(FP4SERVE_XGRAMMAR)
  find_path(XGRAMMAR_INCLUDE_DIR xgrammar/xgrammar.h HINTS "${FP4SERVE_XGRAMMAR_ROOT}/include")
  find_library(XGRAMMAR_LIBRARY NAMES libxgrammar.a xgrammar HINTS "${FP4SERVE_XGRAMMAR_ROOT}/lib")
  if(NOT XGRAMMAR_INCLUDE_DIR OR NOT XGRAMMAR_LIBRARY OR NOT EXISTS "${XGRAMMAR_INCLUDE_DIR}/dlpack/dlpack.h")
    message(FATAL_ERROR "xgrammar not found in ${FP4SERVE_XGRAMMAR_ROOT}: run scripts/install-deps.sh (it builds the "
                        "pinned sdist with scripts/build-xgrammar.sh), or configure with -DFP4SERVE_XGRAMMAR=OFF "
                        "(structured outputs and forced tool calls are then refused with 400)")
  endif()
  add_library(xgrammar::xgrammar STATIC IMPORTED)
  set_target_properties(xgrammar::xgrammar PROPERTIES
    IMPORTED_LOCATION "${XGRAMMAR_LIBRARY}"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${XGRAMMAR_INCLUDE_DIR}"
    INTERFACE_INCLUDE_DIRECTORIES "${XGRAMMAR_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "XGRAMMAR_ENABLE_CPPTRACE=0;XGRAMMAR_ENABLE_INTERNAL_CHECK=0"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
  message(STATUS "xgrammar: ${XGRAMMAR_LIBRARY}")
endif()
