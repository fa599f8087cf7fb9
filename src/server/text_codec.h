// SPDX-License-Identifier: Apache-2.0
// Text ↔ tokens for the HTTP layer: prompt encoding, chat-template rendering and incremental detokenization.
// The production implementation (tokenizer_codec.h) wraps runtime::Tokenizer and runtime::ChatTemplate. Every
// method is called from HTTP handler threads concurrently, so implementations must be immutable after
// construction; per-request state lives in the Detokenizer each request creates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::server {

struct ChatTurn {
  std::string role;
  std::string content;
};

/// Turns generated ids into text piece by piece without splitting UTF-8 sequences. One per request.
class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  /// Text that became final with `id` (may be empty while a multi-byte character is incomplete).
  virtual std::string push(int32_t id) = 0;
  /// Whatever is still held back at the end of generation.
  virtual std::string flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  /// The chat template applied to `messages` with the generation prompt appended. Throws fp4serve::Error when
  /// the template rejects the conversation (the server answers 400 with the message).
  virtual std::string render_chat(const std::vector<ChatTurn>& messages) const = 0;
  virtual std::unique_ptr<Detokenizer> detokenizer() const = 0;
  virtual int64_t vocab_size() const = 0;
  /// Ids that end generation unless the request sets ignore_eos.
  virtual std::vector<int32_t> eos_token_ids() const = 0;
};

}  // namespace fp4serve::server
