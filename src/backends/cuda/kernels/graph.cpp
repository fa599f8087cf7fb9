// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/kernels/graph.h"

#include <exception>
#include <string>
#include <utility>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/partition.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {

std::vector<int64_t> default_graph_buckets() { return {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}; }

StepGraphs::StepGraphs(std::vector<int64_t> buckets) : buckets_(std::move(buckets)) {
  if (buckets_.empty()) throw UsageError("StepGraphs: no bucket sizes");
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] < 1 || (i > 0 && buckets_[i] <= buckets_[i - 1])) {
      throw UsageError("StepGraphs: bucket sizes must be positive and strictly ascending; bucket " +
                       std::to_string(i) + " is " + std::to_string(buckets_[i]));
    }
  }
}

StepGraphs::~StepGraphs() { reset(); }

StepGraphs::StepGraphs(StepGraphs&& other) noexcept
    : buckets_(std::move(other.buckets_)),
      entries_(std::exchange(other.entries_, {})),
      capture_error_(std::move(other.capture_error_)) {}

StepGraphs& StepGraphs::operator=(StepGraphs&& other) noexcept {
  if (this != &other) {
    reset();
    buckets_ = std::move(other.buckets_);
    entries_ = std::exchange(other.entries_, {});
    capture_error_ = std::move(other.capture_error_);
  }
  return *this;
}

int64_t StepGraphs::bucket_for(int64_t rows) const { return graph_bucket(rows, buckets_); }

void StepGraphs::reset() {
  for (auto& [bucket, entry] : entries_) {
    if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);  // no check: also runs in the destructor
  }
  entries_.clear();
  capture_error_.clear();
}

void StepGraphs::reset_except(int64_t bucket) {
  for (auto& [b, entry] : entries_) {
    if (b != bucket && entry.exec != nullptr) {
      cudaGraphExecDestroy(entry.exec);
      entry.exec = nullptr;
    }
  }
}

size_t StepGraphs::graphs() const {
  size_t n = 0;
  for (const auto& [bucket, entry] : entries_) n += entry.exec != nullptr ? 1 : 0;
  return n;
}

void StepGraphs::capture(int64_t bucket, cudaStream_t stream, const Step& step, Entry& entry) {
  std::string failure;
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    failure = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(status);
  } else {
    set_thread_capturing(true);
    try {
      step(bucket, stream);
    } catch (const std::exception& e) {  // any exception: the capture must end before anything else runs
      failure = e.what();
    }
    set_thread_capturing(false);
    status = cudaStreamEndCapture(stream, &graph);  // always ends the capture, also after a failure
    if (failure.empty() && status != cudaSuccess) failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(status);
    if (failure.empty()) {
      status = cudaGraphInstantiate(&entry.exec, graph, 0);
      if (status != cudaSuccess) {
        entry.exec = nullptr;
        failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(status);
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (!failure.empty()) {
    cudaGetLastError();  // a failed capture leaves a sticky launch error the next check must not see
    entry.eager_only = true;
    capture_error_ = "bucket " + std::to_string(bucket) + ": " + failure;
  }
}

StepGraphs::Ran StepGraphs::run(int64_t rows, cudaStream_t stream, const Step& step) {
  if (rows < 1) throw UsageError("StepGraphs::run: rows = " + std::to_string(rows) + ", expected >= 1");
  const int64_t bucket = bucket_for(rows);
  if (bucket == 0) {
    step(rows, stream);
    return Ran::Eager;
  }
  Entry& entry = entries_[bucket];
  if (entry.exec != nullptr) {
    FP4SERVE_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream));
    return Ran::Replayed;
  }
  step(bucket, stream);  // warm-up outside capture: allocations and lazy loading happen here
  if (entry.eager_only) return Ran::Eager;
  capture(bucket, stream, step, entry);
  return entry.exec != nullptr ? Ran::Captured : Ran::Eager;
}

}  // namespace fp4serve::kernels::cuda
