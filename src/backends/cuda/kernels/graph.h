// SPDX-License-Identifier: Apache-2.0
// CUDA graphs of a repeated step (the decode step of a backend): one graph per batch-size bucket, captured on
// first use and replayed afterwards, so that a step of ~600 kernel launches costs one cudaGraphLaunch instead of
// ~600 launches (a few µs each on the host). Host-facing: compiles with plain g++.
//
// The contract for a step function that is captured:
// - it runs the same launches for a given bucket every time, reading everything that changes between steps
//   (token ids, positions, cache rows, sequence lengths) from device buffers at fixed addresses, which the
//   caller refreshes with cudaMemcpyAsync on the same stream BEFORE run() — a graph bakes pointers and host
//   scalars at capture time;
// - it handles `bucket` rows: the rows past the real batch are padding whose results are ignored (they must
//   still be valid work: e.g. a scratch cache row and seq_len 1);
// - it makes no synchronous CUDA call (cudaMemcpy, cudaMalloc, cudaStreamSynchronize) — those fail a capture;
//   allocations happen in the eager warm-up run that precedes every capture (run() does it); and nothing on this
//   thread touches the legacy default stream during the capture (a Stream of device.h is a blocking stream, so
//   such a call would add an implicit dependency and invalidate the capture);
// - after the buffers it reads are reallocated, call reset().
// A step that cannot be captured (a library call that refuses capture) is detected at its first capture: that
// bucket then runs eagerly for good, and capture_error() says why.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fp4serve::kernels::cuda {

/// Bucket sizes of StepGraphs by default: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256 (padding stays
/// under half of the bucket, under a third from 17 rows on).
std::vector<int64_t> default_graph_buckets();

class StepGraphs {
 public:
  /// How run() executed the step.
  enum class Ran : uint8_t {
    Eager,     ///< launched directly (no bucket fits, or the bucket cannot be captured)
    Captured,  ///< launched directly as warm-up, then captured (not replayed yet)
    Replayed,  ///< one cudaGraphLaunch of the bucket's graph
  };
  /// The step: queue the work of `rows` rows on `stream` (rows = the bucket, or the real batch when eager).
  using Step = std::function<void(int64_t rows, cudaStream_t stream)>;

  /// Throws UsageError unless `buckets` is non-empty, positive and strictly ascending.
  explicit StepGraphs(std::vector<int64_t> buckets = default_graph_buckets());
  ~StepGraphs();
  StepGraphs(StepGraphs&& other) noexcept;
  StepGraphs& operator=(StepGraphs&& other) noexcept;
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  const std::vector<int64_t>& buckets() const { return buckets_; }
  /// The smallest bucket ≥ rows, or 0 when rows exceeds the largest (partition.h graph_bucket).
  int64_t bucket_for(int64_t rows) const;

  /// Runs the step for a batch of `rows` (≥ 1) on `stream` (not the legacy default stream: it cannot be
  /// captured). First call for a bucket: step(bucket) eagerly, then a capture of step(bucket) in
  /// cudaStreamCaptureModeThreadLocal; later calls: a replay. Asynchronous like the step itself. Throws
  /// UsageError for rows < 1, DeviceError when a replay fails; an exception of the eager run propagates.
  Ran run(int64_t rows, cudaStream_t stream, const Step& step);

  /// Drops every graph (the next run of each bucket captures again) and forgets capture failures.
  void reset();
  /// Drops every graph but `bucket`'s (after a buffer that the others baked has moved while `bucket` was being
  /// captured with the new one); keeps capture failures.
  void reset_except(int64_t bucket);
  /// Buckets that hold a graph now.
  size_t graphs() const;
  /// Why the last failed capture failed; empty when none has.
  const std::string& capture_error() const { return capture_error_; }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    bool eager_only = false;
  };
  void capture(int64_t bucket, cudaStream_t stream, const Step& step, Entry& entry);

  std::vector<int64_t> buckets_;
  std::map<int64_t, Entry> entries_;
  std::string capture_error_;
};

}  // namespace fp4serve::kernels::cuda
