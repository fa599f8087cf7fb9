// SPDX-License-Identifier: Apache-2.0
// UTF-8 and Unicode helpers for the tokenizer pipeline: code point iteration, the character classes the HF
// `tokenizers` library tests with Rust's char methods, lossy decoding, and normalization through utf8proc.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::text::unicode {

/// Length in bytes of the UTF-8 sequence that starts with lead byte `lead` (1 for ASCII and for bytes that
/// cannot start a sequence, so iteration over arbitrary bytes always advances).
inline size_t sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

/// Decodes the code point at byte `pos` of valid UTF-8 `s`. Returns the code point; `len` receives its length.
char32_t decode_at(std::string_view s, size_t pos, size_t& len);

/// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value) to `out`.
void append_utf8(std::string& out, char32_t cp);

/// Byte offset of the first invalid UTF-8 sequence in `s`, or nullopt when `s` is valid UTF-8 (well-formed
/// per Unicode table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
std::optional<size_t> find_invalid_utf8(std::string_view s);

/// Decodes arbitrary bytes as Rust's `String::from_utf8_lossy` does: each maximal subpart of an ill-formed
/// sequence becomes one U+FFFD (the Unicode "substitution of maximal subparts" practice).
std::string utf8_lossy(std::string_view bytes);

/// Unicode White_Space property (Rust `char::is_whitespace`, regex `\s`).
bool is_white_space(char32_t cp);

/// Rust regex `\w`: Alphabetic, marks, decimal digits, connector punctuation and the joiners U+200C/U+200D.
bool is_word_char(char32_t cp);

/// Rust `char::is_numeric`: general categories Nd, Nl and No.
bool is_numeric(char32_t cp);

/// Unicode normalization forms. NFC/NFKC/NFD/NFKD through utf8proc (Unicode 15 tables).
/// Throws FormatError naming `what` if utf8proc rejects the input (only possible for invalid UTF-8).
enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

/// The extended grapheme clusters of valid UTF-8 `s` (UAX #29, utf8proc's rules), as views into `s`.
std::vector<std::string_view> graphemes(std::string_view s);

/// Lower-cases every code point with utf8proc's simple case mapping. Rust's `str::to_lowercase` uses the
/// full mapping; the two differ only for U+0130 (İ → "i̇" in Rust, "i" here) and final-sigma context.
std::string lowercase(std::string_view s);

}  // namespace fp4serve::text::unicode
