// SPDX-License-Identifier: Apache-2.0
// The chat REPL's input: libedit (BSD licence) line editing and in-memory history when stdin is a terminal,
// plain line reads otherwise (pipes, files); and the Ctrl-C flag that stops a reply without ending the session.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace fp4serve::app {

class LineEditor {
 public:
  /// Prompts go to stderr, so stdout carries the replies alone.
  LineEditor();
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  enum class Status { Line, Interrupted, End };
  struct Input {
    Status status;
    std::string line;  ///< without the newline; set for Status::Line
  };
  /// Reads one line after `prompt`. Ctrl-C at the prompt gives Interrupted (the line is dropped), Ctrl-D or end of
  /// input gives End. Non-empty lines join the history (Up/Down recall them).
  Input read(const char* prompt);

  /// SIGINT handling for the whole session: the handler only sets a flag (no SA_RESTART, so a blocked read
  /// returns). Replies poll interrupted() between tokens.
  static bool interrupted();
  static void clear_interrupt();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fp4serve::app
