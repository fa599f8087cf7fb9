// SPDX-License-Identifier: Apache-2.0
#include "server/request_channel.h"

namespace fp4serve::server {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "error";
}

void RequestChannel::push_token(int32_t token, runtime::TokenLogprobs* logprobs) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    pending_.push_back(token);
    if (logprobs != nullptr) pending_logprobs_.push_back(std::move(*logprobs));
  }
  cv_.notify_all();
}

void RequestChannel::finish(FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finished_ = true;
    reason_ = reason;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

ChannelUpdate RequestChannel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
  ChannelUpdate update;
  update.tokens.swap(pending_);
  update.logprobs.swap(pending_logprobs_);
  update.finished = finished_;
  update.reason = reason_;
  update.error = error_;
  return update;
}

}  // namespace fp4serve::server
