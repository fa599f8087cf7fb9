// SPDX-License-Identifier: Apache-2.0
// The exception hierarchy every fp4serve module throws. User-facing front ends (CLI, HTTP server) catch
// fp4serve::Error once, print its one-line message and map its kind to an exit code or HTTP status.
#pragma once

#include <stdexcept>
#include <string>

namespace fp4serve {

/// Base class of every error fp4serve raises on purpose. The message is complete on its own: it names the
/// file, tensor or layer concerned and states the expected and the found value.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A file on disk is malformed: a safetensors header, an index, a config.json, a tokenizer file.
class FormatError : public Error {
 public:
  using Error::Error;
};

/// The input is well formed but asks for something fp4serve does not support (an unknown architecture, a
/// quantization algorithm with no scheme on this device, a sparse format).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

/// The caller passed an invalid argument (a bad command-line value, a tensor shape that does not fit a kernel).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An operating-system call failed (open, mmap, read); the message carries the path and strerror text.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A GPU runtime or library call failed (CUDA runtime, cuBLAS): the message names the source file and line, the
/// call, and the driver's error text. Raised only by the CUDA backend.
class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace fp4serve
