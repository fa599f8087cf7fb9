// SPDX-License-Identifier: Apache-2.0
#include "app/line_editor.h"

#include <histedit.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <climits>
#include <clocale>
#include <cstring>
#include <cwchar>
#include <iostream>

namespace fp4serve::app {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) { g_interrupted = 1; }

// libedit's own reader retries a read that a signal interrupted, so one Ctrl-C at the prompt would be lost; this
// one gives up (-1) when our handler has set the flag, which makes el_gets return NULL.
extern "C" int read_char(EditLine*, wchar_t* out) {
  char buf[MB_LEN_MAX];
  size_t n = 0;
  while (true) {
    const ssize_t r = ::read(STDIN_FILENO, buf + n, 1);
    if (r == 0) return 0;
    if (r < 0) {
      if (errno == EINTR && g_interrupted == 0) continue;
      return -1;
    }
    ++n;
    std::mbstate_t state{};
    wchar_t wc = 0;
    const size_t k = std::mbrtowc(&wc, buf, n, &state);
    if (k == static_cast<size_t>(-2) && n < sizeof buf) continue;  // an incomplete UTF-8 sequence so far
    *out = k <= n ? wc : static_cast<wchar_t>(static_cast<unsigned char>(buf[0]));
    return 1;
  }
}

const char* g_prompt = "> ";
extern "C" const char* prompt_of(EditLine*) { return g_prompt; }

}  // namespace

struct LineEditor::State {
  EditLine* el = nullptr;
  History* history = nullptr;
  HistEvent event{};
  struct sigaction previous {};
};

LineEditor::LineEditor() : state_(std::make_unique<State>()) {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: Ctrl-C must end a blocked read at the prompt
  sigaction(SIGINT, &sa, &state_->previous);
  if (isatty(STDIN_FILENO) == 0) return;
  std::setlocale(LC_CTYPE, "");  // libedit decodes multibyte (UTF-8) input by the locale
  state_->el = el_init("fp4serve", stdin, stderr, stderr);
  state_->history = history_init();
  history(state_->history, &state_->event, H_SETSIZE, 1000);
  history(state_->history, &state_->event, H_SETUNIQUE, 1);
  el_set(state_->el, EL_HIST, history, state_->history);
  el_set(state_->el, EL_PROMPT, prompt_of);
  el_set(state_->el, EL_EDITOR, "emacs");
  el_set(state_->el, EL_SIGNAL, 0);  // our handler, not libedit's (which re-sends the signal to the process group)
  el_set(state_->el, EL_GETCFN, read_char);
  el_source(state_->el, nullptr);    // ~/.editrc, as every libedit program reads it
}

LineEditor::~LineEditor() {
  if (state_->el != nullptr) el_end(state_->el);
  if (state_->history != nullptr) history_end(state_->history);
  sigaction(SIGINT, &state_->previous, nullptr);
}

LineEditor::Input LineEditor::read(const char* prompt) {
  clear_interrupt();
  if (state_->el == nullptr) {
    std::fputs(prompt, stderr);
    std::fflush(stderr);
    std::string line;
    if (std::getline(std::cin, line)) return {Status::Line, line};
    if (interrupted()) {
      std::cin.clear();
      return {Status::Interrupted, {}};
    }
    return {Status::End, {}};
  }
  g_prompt = prompt;
  int count = 0;
  const char* text = el_gets(state_->el, &count);
  if (text == nullptr || count <= 0) {
    if (interrupted() || (count < 0 && errno == EINTR)) {
      // The cursor may sit inside the line: redraw its tail so the ^C lands after the whole dropped line.
      if (const LineInfo* li = el_line(state_->el); li != nullptr && li->lastchar > li->cursor) {
        std::fwrite(li->cursor, 1, static_cast<size_t>(li->lastchar - li->cursor), stderr);
      }
      std::fputs("^C\n", stderr);
      el_reset(state_->el);
      return {Status::Interrupted, {}};
    }
    return {Status::End, {}};
  }
  std::string line(text, static_cast<size_t>(count));
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (!line.empty()) history(state_->history, &state_->event, H_ENTER, line.c_str());
  return {Status::Line, line};
}

bool LineEditor::interrupted() { return g_interrupted != 0; }
void LineEditor::clear_interrupt() { g_interrupted = 0; }

}  // namespace fp4serve::app
