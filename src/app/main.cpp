// SPDX-License-Identifier: Apache-2.0
// fp4serve command-line entry point: parses arguments, runs one subcommand, and turns fp4serve::Error into a
// one-line message with exit code 2 (no stack traces for user errors).
#include <cstdio>
#include <exception>

#include "app/commands.h"
#include "fp4serve/error.h"

int main(int argc, char** argv) {
  CLI::App root{"fp4serve: load FP4-quantized LLM checkpoints (compressed-tensors, ModelOpt) and run them"};
  root.require_subcommand(1);
  fp4serve::app::register_inspect(root);
  fp4serve::app::register_explain(root);
  fp4serve::app::register_quantize(root);
  fp4serve::app::register_generate(root);
  fp4serve::app::register_chat(root);
  fp4serve::app::register_perplexity(root);
  fp4serve::app::register_serve(root);
  fp4serve::app::register_bench(root);
  fp4serve::app::register_template(root);
  try {
    root.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own non-zero status (explain: a layer has no scheme); already reported
  } catch (const CLI::ParseError& e) {
    return root.exit(e);
  } catch (const fp4serve::Error& e) {
    std::fprintf(stderr, "fp4serve: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4serve: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
