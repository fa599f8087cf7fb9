// SPDX-License-Identifier: Apache-2.0
// fp4serve command-line entry point: parses arguments, runs one subcommand, and turns errors into one-line
// messages and exit codes (no stack traces for user errors):
//   0  success
//   1  nothing runnable: `explain` found a layer with no scheme on the device (the plan is printed first)
//   2  bad input: a usage error (unknown command or option, missing or invalid value), an unreadable or
//      unsupported checkpoint, a request that does not fit (context length, device), a failed write
//   3  internal error (a bug: please report it)
#include <cstdio>
#include <cstring>
#include <exception>

#include "app/commands.h"
#include "app/log.h"
#include "app/suggest.h"
#include "app/tensor_parallel.h"
#include "app/threads.h"
#include "app/version.h"
#include "fp4serve/error.h"

namespace {

constexpr int kExitBadInput = 2;

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

// After a failed parse: "did you mean …?" for a mistyped subcommand (the first word that names none) or for the
// unexpected --options of the subcommand that was being parsed. Empty when nothing is close.
std::string parse_hint(CLI::App& root, int argc, char** argv) {
  CLI::App* app = &root;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("-")) {
      if (arg == "--log-level" && app == &root) ++i;  // the root's only option with a value
      continue;
    }
    if (app->get_subcommands([](const CLI::App*) { return true; }).empty()) break;
    CLI::App* sub = nullptr;
    try {
      sub = app->get_subcommand(arg);
    } catch (const CLI::OptionNotFound&) {
      const auto match = fp4serve::app::closest_match(arg, subcommand_names(*app));
      return match ? fmt::format("'{}' is not a command; did you mean `{}`?", arg, *match)
                   : fmt::format("'{}' is not a command; the commands are: {}", arg, fmt::join(subcommand_names(*app), ", "));
    }
    app = sub;
  }
  if (app == &root) return {};
  std::vector<std::string> options;
  for (const CLI::Option* opt : app->get_options()) {
    for (const std::string& l : opt->get_lnames()) options.push_back("--" + l);
  }
  // With fallthrough, an option the subcommand does not know may be left over on the root instead.
  std::vector<std::string> extras = app->remaining();
  for (const std::string& e : root.remaining()) extras.push_back(e);
  for (const std::string& extra : extras) {
    if (!extra.starts_with("--")) continue;
    const std::string name = extra.substr(0, extra.find('='));
    if (const auto match = fp4serve::app::closest_match(name, options)) {
      return fmt::format("unknown option {}; did you mean {}?", name, *match);
    }
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  fp4serve::app::set_default_wait_policy(argv);
  CLI::App root{"fp4serve: load FP4-quantized LLM checkpoints (compressed-tensors, ModelOpt) and run them.\n"
                "Exit codes: 0 ok, 1 nothing runnable (explain: a layer has no scheme), 2 bad input, 3 internal error."};
  root.require_subcommand(1);
  root.fallthrough();  // --log-level / -q / -v may also follow the subcommand
  std::string version = fp4serve::app::version_text();
  if (!version.empty() && version.back() == '\n') version.pop_back();
  root.set_version_flag("--version", version, "print the version, git hash, compiled SIMD targets and CUDA support");
  std::string log_level = "info";
  bool quiet = false, verbose = false;
  root.add_option("--log-level", log_level, "error | warning | info | debug (stderr messages shown)")
      ->check([](const std::string& v) { return fp4serve::app::parse_log_level(v) ? std::string() : "expected error, warning, info or debug"; })
      ->capture_default_str();
  root.add_flag("-q,--quiet", quiet, "errors only on stderr (same as --log-level error; hides the W4A4 warning)");
  root.add_flag("-v,--verbose", verbose, "debug messages too (same as --log-level debug)");
  root.parse_complete_callback([&] {
    auto level = *fp4serve::app::parse_log_level(log_level);
    if (quiet) level = fp4serve::app::LogLevel::Error;
    if (verbose) level = fp4serve::app::LogLevel::Debug;
    fp4serve::app::set_log_level(level);
  });
  fp4serve::app::register_inspect(root);
  fp4serve::app::register_explain(root);
  fp4serve::app::register_quantize(root);
  fp4serve::app::register_generate(root);
  fp4serve::app::register_chat(root);
  fp4serve::app::register_perplexity(root);
  fp4serve::app::register_serve(root);
  fp4serve::app::register_bench(root);
  fp4serve::app::register_template(root);
  // -tp N → --tensor-parallel-size N; argv is kept for the mpirun command a refused launch prints.
  std::vector<std::string> args = fp4serve::app::remember_command_line(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    root.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own non-zero status (explain: a layer has no scheme); already reported
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return root.exit(e);  // --help, --version
    const std::string hint = parse_hint(root, argc, argv);
    if (!hint.empty()) {
      std::fprintf(stderr, "fp4serve: error: %s\n", hint.c_str());
    } else {
      root.exit(e);
    }
    return kExitBadInput;  // every usage error, whatever CLI11's own code (104–109)
  } catch (const fp4serve::Error& e) {
    std::fprintf(stderr, "fp4serve: error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4serve: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
