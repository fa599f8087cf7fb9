// SPDX-License-Identifier: Apache-2.0
// fp4serve command-line entry point: parses arguments, runs one subcommand, and turns errors into one-line
// messages and exit codes (no stack traces for user errors):
//   0  success
//   1  nothing runnable: `explain` found a layer with no scheme on the device (the plan is printed first)
//   2  bad input: a usage error (unknown command or option, missing or invalid value), an unreadable or
//      unsupported checkpoint, a request that does not fit (context length, device), a failed write
//   3  internal error (a bug: please report it)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

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

// The command the words of the command line name (the deepest subcommand they reach), found without parsing so
// that hints can be given before CLI11 misreads a flag (-ngl is -n gl to it). `unknown` gets the first word that
// stands where a subcommand name must and names none.
CLI::App* named_command(CLI::App& root, const std::vector<std::string>& args, std::string& unknown) {
  CLI::App* app = &root;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.starts_with("-")) {
      if (arg == "--log-level" && app == &root) ++i;  // the root's only option with a value
      continue;
    }
    if (app->get_subcommands([](const CLI::App*) { return true; }).empty()) break;
    CLI::App* sub = nullptr;
    for (CLI::App* candidate : app->get_subcommands([](const CLI::App*) { return true; })) {
      if (candidate->check_name(arg)) sub = candidate;
    }
    if (sub == nullptr) {
      unknown = arg;
      break;
    }
    app = sub;
  }
  return app;
}

// "fp4serve bench model", for "see `… --help`".
std::string command_path(const CLI::App* app) {
  std::string path;
  // The root's own name is argv[0] as typed (build/release/fp4serve); the messages name the program.
  for (; app != nullptr && app->get_parent() != nullptr; app = app->get_parent()) path = " " + app->get_name() + path;
  return "fp4serve" + path;
}

// The commands (`fp4serve generate`, …) that take the option `name`, for an option given to one that does not.
std::vector<std::string> commands_taking(const CLI::App& app, const std::string& name) {
  std::vector<std::string> found;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_option_no_throw(name) != nullptr) found.push_back("`" + command_path(sub) + "`");
    for (std::string& deeper : commands_taking(*sub, name)) found.push_back(std::move(deeper));
  }
  return found;
}

// Every spelling the command accepts, its own and the root's (-q, -v, --log-level may follow the subcommand).
std::vector<std::string> option_names(const CLI::App& app, const CLI::App& root) {
  std::vector<std::string> names;
  for (const CLI::App* a : {&app, &root}) {
    for (const CLI::Option* opt : a->get_options()) {
      for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
      for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    }
  }
  return names;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  (void)std::strtod(s.c_str(), &end);
  return !s.empty() && end != nullptr && *end == '\0';
}

// Another engine's flag (--temp, -ngl, --dtype, …) that the command does not take: what fp4serve does instead.
// Checked before parsing: CLI11 would read -ngl 99 as -n gl, and -hf as -h (help).
std::optional<std::string> foreign_flag(const std::vector<std::string>& args, const std::vector<std::string>& real) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;  // the rest are values
    if (!args[i].starts_with("-") || is_number(args[i])) continue;
    const std::string name = args[i].substr(0, args[i].find('='));
    if (std::find(real.begin(), real.end(), name) != real.end()) continue;
    if (auto hint = fp4serve::app::foreign_flag_hint(name)) return hint;
  }
  return std::nullopt;
}

// One message for a failed parse, in the form every other error has: a mistyped command, an unknown option (with
// the closest real one, or what fp4serve does instead of another engine's flag), a stray argument, or CLI11's own
// message made to name the command whose --help lists the options.
std::string parse_error_text(CLI::App& root, const std::vector<std::string>& args, const CLI::ParseError& e) {
  std::string unknown;
  CLI::App* app = named_command(root, args, unknown);
  const std::string help = fmt::format("see `{} --help`", command_path(app));
  if (!unknown.empty()) {
    const auto match = fp4serve::app::closest_match(unknown, subcommand_names(*app));
    return match ? fmt::format("'{}' is not a command; did you mean `{}`?", unknown, *match)
                 : fmt::format("'{}' is not a command; the commands are: {}", unknown, fmt::join(subcommand_names(*app), ", "));
  }
  if (!subcommand_names(*app).empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    return fmt::format("`{}` needs a command: {} ({})", command_path(app), fmt::join(subcommand_names(*app), ", "), help);
  }
  const std::vector<std::string> real = option_names(*app, root);
  // With fallthrough, an option the subcommand does not know may be left over on the root instead.
  std::vector<std::string> extras = app->remaining();
  if (app != &root) {
    for (const std::string& extra : root.remaining()) extras.push_back(extra);
  }
  // Words after "--" are values, never options: one that is left over is an unexpected argument.
  const auto dashes = std::find(args.begin(), args.end(), "--");
  const std::vector<std::string> literal(dashes == args.end() ? args.end() : dashes + 1, args.end());
  for (const std::string& extra : extras) {
    if (!extra.starts_with("-") || is_number(extra)) continue;
    if (std::find(literal.begin(), literal.end(), extra) != literal.end()) continue;
    const std::string name = extra.substr(0, extra.find('='));
    if (auto hint = fp4serve::app::foreign_flag_hint(name)) return *hint;
    std::vector<std::string> long_names;  // a one-letter name is one edit from every other one
    for (const std::string& r : real) {
      if (r.starts_with("--") && r != "--help") long_names.push_back(r);
    }
    if (const std::vector<std::string> others = commands_taking(root, name); !others.empty()) {
      return fmt::format("`{}` takes no {}; {} {}", command_path(app), name, fmt::join(others, ", "),
                         others.size() == 1 ? "does" : "do");
    }
    const auto match = name.size() > 2 ? fp4serve::app::closest_match(name, long_names) : std::nullopt;
    return match ? fmt::format("unknown option {}; did you mean {}?", name, *match)
                 : fmt::format("unknown option {} for `{}` ({})", name, command_path(app), help);
  }
  if (!extras.empty()) {
    return fmt::format("unexpected argument '{}' for `{}`: it takes one MODEL, and a value with spaces needs quotes "
                       "(-p 'two words'); {}", extras.front(), command_path(app), help);
  }
  std::string what = e.what();
  if (what == "--model is required") {
    return fmt::format("`{}` needs a MODEL: a checkpoint folder, or ORG/NAME from the local Hugging Face cache "
                       "(positional, or -m/--model; {})", command_path(app), help);
  }
  // "Could not convert: --max-num-seqs = x": name the type the option takes.
  constexpr std::string_view kConvert = "Could not convert: ";
  if (what.starts_with(kConvert)) {
    const std::string rest = what.substr(kConvert.size());
    const size_t eq = rest.find(" = ");
    if (eq != std::string::npos) {
      const std::string name = rest.substr(0, eq);
      const CLI::Option* opt = app->get_option_no_throw(name);
      const std::string type = opt != nullptr ? opt->get_type_name() : std::string();
      return fmt::format("{} '{}' is not {} ({})", name, rest.substr(eq + 3),
                         type == "INT" || type == "UINT" ? "a whole number" : type == "FLOAT" ? "a number" : "valid",
                         help);
    }
  }
  return fmt::format("{} ({})", what, help);
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
    std::string unknown;
    const CLI::App* named = named_command(root, args, unknown);
    if (const auto hint = foreign_flag(args, option_names(*named, root))) throw fp4serve::UsageError(*hint);
    root.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own non-zero status (explain: a layer has no scheme); already reported
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return root.exit(e);  // --help, --version
    std::fprintf(stderr, "fp4serve: error: %s\n", parse_error_text(root, args, e).c_str());
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
