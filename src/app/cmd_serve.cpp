// SPDX-License-Identifier: Apache-2.0
// `fp4serve serve`: loads a checkpoint and serves the OpenAI-compatible API with continuous batching until
// SIGINT/SIGTERM. Wiring only; the parts live in src/server.
#include <fmt/format.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "app/chat_options.h"
#include "app/commands.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "app/tensor_parallel.h"
#include "app/threads.h"
#include "fp4serve/error.h"
#include "backends/load_model.h"
#include "runtime/sampler.h"
#include "runtime/structured_output.h"
#include "runtime/text_setup.h"
#include "server/decoder_step_model.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "server/tokenizer_codec.h"
#include "text/chat_template.h"

namespace fp4serve::app {
namespace {

// The grammar engine over the served vocabulary (structured outputs). Without it (a build with
// -DFP4SERVE_XGRAMMAR=OFF, or a tokenizer it cannot read) the server still runs and constrained requests get 400.
std::shared_ptr<const runtime::GrammarCompiler> make_grammar_compiler(const text::Tokenizer& tokenizer,
                                                                      const checkpoint::Checkpoint& ckpt,
                                                                      int64_t vocab_size, std::vector<int32_t> stop_ids,
                                                                      const runtime::GrammarLimits& limits) {
  if (!runtime::grammar_engine_available()) {
    log_info("structured outputs: off ({})\n", runtime::grammar_engine_description());
    return nullptr;
  }
  try {
    const auto path = ckpt.tokenizer_json();
    if (!path) throw FormatError("no tokenizer.json");
    std::ifstream in(*path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto start = std::chrono::steady_clock::now();
    auto compiler = std::make_shared<const runtime::GrammarCompiler>(
        runtime::vocabulary_info(tokenizer, text, vocab_size, std::move(stop_ids)), 2, int64_t{256} << 20, limits);
    log_info("structured outputs: {} ({} ms to index the vocabulary)\n", runtime::grammar_engine_description(),
             std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
    return compiler;
  } catch (const Error& e) {
    log_warning("structured outputs are off: {}", e.what());
    return nullptr;
  }
}

struct ServeOptions {
  ModelOptions model;
  std::string served_model_name;
  server::HttpConfig http;
  server::SchedulerConfig scheduler;
  double kv_cache_gib = 4.0;          ///< --kv-cache-memory: the block pool's bytes, in GiB
  /// --gpu-memory-utilization: the KV budget as the fraction of the device's memory the process may fill
  /// (server::kv_budget_for_utilization); unset: --kv-cache-memory's GiB.
  std::optional<double> gpu_memory_utilization;
  bool prefix_caching = true;         ///< --enable-prefix-caching / --no-enable-prefix-caching
  ChatTemplateOptions chat_template;
  std::optional<text::ContentFormat> content_format;  ///< --chat-template-content-format; nullopt: auto
  ToolCallParserChoice tool_call_parser;                ///< --tool-call-parser
  std::optional<server::ReasoningParser> reasoning_parser;  ///< --reasoning-parser
  bool disable_any_whitespace = false;  ///< --structured-outputs-config.disable_any_whitespace
  runtime::GrammarLimits grammar_limits;  ///< --max-grammar-bytes, --max-grammar-nesting, --grammar-compile-timeout
  std::string generation_config = "auto";              ///< --generation-config: auto | vllm | FOLDER
};

// --generation-config FOLDER: FOLDER/generation_config.json, read before the model loads so that a wrong path
// costs nothing.
nlohmann::json read_generation_config(const std::string& folder) {
  const std::filesystem::path file = std::filesystem::path(folder) / "generation_config.json";
  std::ifstream in(file);
  if (!in) {
    throw UsageError(fmt::format("--generation-config {}: no {} (give auto, vllm, or a folder holding a "
                                 "generation_config.json)", folder, file.string()));
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("--generation-config {}: {} is not valid JSON: {}", folder, file.string(), e.what()));
  }
}

// The sampling defaults of the served model, as vLLM derives them (runtime::serving_defaults), and a line saying
// what they are and where they come from.
runtime::ServingDefaults serving_defaults_for(const std::string& choice, const nlohmann::json& from_folder,
                                              const checkpoint::Checkpoint& checkpoint, std::string& described) {
  const bool neutral = choice == "vllm";
  const nlohmann::json& config = choice == "auto" ? checkpoint.generation_config() : from_folder;
  const std::string source = neutral ? "vLLM's neutral defaults (--generation-config vllm)"
                             : choice == "auto" ? (config.is_object() ? "the model's generation_config.json"
                                                                      : "the model (no generation_config.json)")
                                                : "--generation-config " + choice;
  runtime::ServingDefaults defaults;
  try {
    defaults = runtime::serving_defaults(neutral ? nlohmann::json() : config);
  } catch (const UsageError& e) {
    throw FormatError(fmt::format("{}: {}", source, e.what()));
  }
  std::string origin;
  if (neutral) {
    origin = source;
  } else if (defaults.taken.empty()) {
    origin = config.is_object() ? source + " sets none of them: OpenAI's values" : source + ": OpenAI's values";
  } else {
    origin = fmt::format("{} from {}, OpenAI's values otherwise", fmt::join(defaults.taken, ", "), source);
  }
  described = fmt::format("sampling defaults for requests that omit them: temperature {}, top_p {}, top_k {}, "
                          "min_p {}, repetition_penalty {}{} ({})",
                          defaults.sampling.temperature, defaults.sampling.top_p, defaults.sampling.top_k,
                          defaults.sampling.min_p, defaults.sampling.repetition_penalty,
                          defaults.max_tokens ? fmt::format(", max_tokens {}", *defaults.max_tokens) : "", origin);
  return defaults;
}

// --host/--port tried before the model loads (which can take minutes): a busy port or an unknown host is refused
// at once. The probe socket is closed again; HttpServer::bind takes the port after loading, and still reports a
// port taken in between.
void check_listen_address(const std::string& host, int port) {
  if (port == 0) return;  // any free port: nothing can be busy
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0 || found == nullptr) {
    throw UsageError(fmt::format("--host {}: the address does not resolve ({})", host, ::gai_strerror(rc)));
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  int error = 0;
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as the server binds: TIME_WAIT is no conflict
    if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0) error = errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (error == EADDRINUSE) {
    throw UsageError(fmt::format("--port {}: {}:{} is already in use (another server listens there); choose another "
                                 "--port, or --port 0 for any free port", port, host, port));
  }
  if (error == EACCES) {
    throw UsageError(fmt::format("--port {}: binding {}:{} is not permitted (ports below 1024 need privileges); "
                                 "choose a --port of 1024 or more", port, host, port));
  }
  if (error == EADDRNOTAVAIL) {
    throw UsageError(fmt::format("--host {}: not an address of this machine (use 127.0.0.1, 0.0.0.0 or one of its "
                                 "interfaces' addresses)", host));
  }
}

void run_serve(ServeOptions opts) {
  // SIGINT/SIGTERM are blocked in every thread (the mask is inherited) and taken by sigwait below, so shutdown
  // runs as ordinary code: drain the HTTP server (running requests may finish within --shutdown-timeout, the
  // rest end with an error event or a 503), then stop the scheduler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Followers keep the signals blocked too: mpirun forwards them to every rank, and a follower ends when rank 0's
  // shutdown (below, in the destructors) tells it to, not in the middle of a step.
  const nlohmann::json generation_config_folder =
      opts.generation_config == "auto" || opts.generation_config == "vllm" ? nlohmann::json()
                                                                           : read_generation_config(opts.generation_config);
  TensorParallelRun tp(opts.model);
  if (!tp.leader()) return tp.follow(std::span(&opts.model, 1));
  check_listen_address(opts.http.host, opts.http.port);
  const RankModel run = tp.load(opts.model);
  const model::LoadedModel& loaded = run.loaded;
  // A --max-model-len above the model's limit is refused here, at startup, not as a 500 per request.
  const int64_t context_length = effective_max_model_len(opts.model, loaded.config);
  text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::optional<text::ChatTemplates> chat_templates;
  try {
    chat_templates = load_chat_templates(loaded.checkpoint.root(), loaded.checkpoint.tokenizer_config(), opts.chat_template);
  } catch (const Error& e) {
    if (!opts.chat_template.chat_template.empty()) throw;  // an explicit --chat-template must work
    log_warning("no usable chat template ({}); /v1/chat/completions will answer 400", e.what());
  }
  const auto variables = template_variables(runtime::template_context(tokenizer, loaded.checkpoint), opts.chat_template);
  std::vector<int32_t> eos = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
  const auto grammars = make_grammar_compiler(tokenizer, loaded.checkpoint, loaded.config.vocab_size, eos,
                                              opts.grammar_limits);
  std::optional<server::ToolParser> tool_parser = opts.tool_call_parser.parser;
  if (opts.tool_call_parser.automatic) {
    tool_parser = server::detect_tool_parser(
        loaded.config.architecture_name,
        chat_templates ? chat_templates->select(/*with_tools=*/true).source() : std::string());
  }
  log_info("tool calls: {}{}\n", tool_parser ? server::tool_parser_name(*tool_parser) : "no parser (tool_choice auto is refused)",
           opts.tool_call_parser.automatic ? " (detected from the architecture and chat template)" : " (--tool-call-parser)");
  const server::TokenizerCodec codec(std::move(tokenizer), std::move(chat_templates), variables, std::move(eos),
                                    opts.content_format);
  if (const std::string format = codec.describe_content_format(); !format.empty()) {
    log_info("chat template content format: {}\n", format);
  }

  // The budget: --kv-cache-memory GiB (4 by default, as vLLM's CPU backend's VLLM_CPU_KVCACHE_SPACE), or the part
  // of --gpu-memory-utilization's share of the device that the loaded model leaves.
  int64_t budget_bytes = static_cast<int64_t>(opts.kv_cache_gib * static_cast<double>(int64_t{1} << 30));
  std::string budget_source = fmt::format("--kv-cache-memory {}", opts.kv_cache_gib);
  if (opts.gpu_memory_utilization) {
    const model::Backend::MemoryUse use = loaded.decoder->backend().memory_use();
    budget_bytes = server::kv_budget_for_utilization(*opts.gpu_memory_utilization, use.total, use.used);
    budget_source = fmt::format("--gpu-memory-utilization {}: {:.2f} of {:.2f} GiB, {:.2f} GiB in use after loading",
                                *opts.gpu_memory_utilization,
                                *opts.gpu_memory_utilization * static_cast<double>(use.total) / (1 << 30),
                                static_cast<double>(use.total) / (1 << 30), static_cast<double>(use.used) / (1 << 30));
  }
  const int64_t blocks = server::kv_blocks_for_budget(loaded.config, context_length, budget_bytes, loaded.kv_element);
  server::DecoderStepModel step_model(run.model(),
                                      model::KvCacheSpec{context_length, opts.scheduler.max_num_seqs, blocks});
  step_model.cache().set_prefix_caching(opts.prefix_caching);
  server::Metrics metrics;
  server::Scheduler scheduler(step_model, opts.scheduler, metrics);
  const std::string name = opts.served_model_name.empty() ? opts.model.model : opts.served_model_name;
  std::string defaults_line;
  const runtime::ServingDefaults defaults =
      serving_defaults_for(opts.generation_config, generation_config_folder, loaded.checkpoint, defaults_line);
  log_info("{}\n", defaults_line);
  server::HttpServer http(opts.http, server::ServeLimits{name, context_length, defaults.sampling, defaults.max_tokens, grammars,
                                                          tool_parser, opts.reasoning_parser,
                                                          opts.disable_any_whitespace},
                          codec, scheduler, metrics);
  const int port = http.bind();
  scheduler.start();
  // The address is printed even with -q: with --port 0 it is the only way to learn the port.
  fmt::print(stderr, "serving '{}' on http://{}:{}\n", name, opts.http.host, port);
  log_info("context {} | KV cache {} blocks of {} positions ({:.2f} GiB from {}, {}; prefix caching {}) | up to {} "
           "sequences | activations {} | {} tokens per step | queue {} | {}\n",
           context_length, blocks, step_model.cache().block_size(),
           static_cast<double>(budget_bytes) / (int64_t{1} << 30), budget_source,
           model::kv_cache_dtype_name(loaded.kv_element), opts.prefix_caching ? "on" : "off",
           opts.scheduler.max_num_seqs,
           model::activation_precision_summary(loaded), opts.scheduler.max_num_batched_tokens,
           opts.scheduler.max_queue, thread_summary());
  log_info("{}\n", memory_summary("memory after start-up"));

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log_info("\n{}: shutting down (running requests have {} s to finish; a second signal exits at once)\n",
             sig == SIGINT ? "SIGINT" : "SIGTERM", opts.http.shutdown_timeout_seconds);
    // A second SIGINT/SIGTERM during the drain ends the process now, as uvicorn's second Ctrl-C does.
    std::thread([signals] {  // a copy: run_serve may return first
      int again = 0;
      sigwait(&signals, &again);
      std::fprintf(stderr, "second %s: exiting without waiting for the drain\n", again == SIGINT ? "SIGINT" : "SIGTERM");
      std::_Exit(128 + again);
    }).detach();
    http.stop();       // the scheduler keeps stepping while requests drain
    scheduler.stop();
  });
  http.serve();
  // serve() also returns if the listener fails; wake the waiter so it can finish.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  log_info("{}\n", memory_summary("memory at exit"));
}

}  // namespace

void register_serve(CLI::App& root) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_model_options(*cmd, opts->model);
  add_tensor_parallel_options(*cmd, opts->model.load.parallel);
  cmd->add_option("--host", opts->http.host, "address to listen on")->capture_default_str();
  add_number_option(*cmd, "--port", opts->http.port, NumberRange{0, 65535, false, false, "0 = any free port"},
                    "TCP port (0 = any free port)");
  cmd->add_option("--api-key", opts->http.api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--served-model-name", opts->served_model_name, "model id in the API (default: the -m path)");
  cmd->add_option("--max-num-seqs", opts->scheduler.max_num_seqs, "sequences in the running batch")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--max-num-batched-tokens", opts->scheduler.max_num_batched_tokens,
                  "tokens per forward step (decodes first, prompt chunks fill the rest)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-queue", opts->scheduler.max_queue, "waiting requests before 429")
      ->capture_default_str()->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--kv-cache-memory", opts->kv_cache_gib,
                  "GiB of keys and values in the KV block pool (blocks of 16 positions, taken as sequences grow); "
                  "how many sequences run at once depends on how long they are")
      ->capture_default_str()->check(CLI::Range(1.0 / 1024, 1048576.0));
  cmd->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization,
                  "instead of --kv-cache-memory: the fraction (0, 1] of the device's memory (the GPU's, or RAM with "
                  "--device cpu) this process may fill; the KV pool gets what the loaded model leaves of it (vLLM's flag)")
      ->excludes("--kv-cache-memory")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            // Refused before the model loads; server::kv_budget_for_utilization checks it again with the sizes.
            double f = 0;
            try {
              size_t used = 0;
              f = std::stod(value, &used);
              if (used != value.size()) f = -1;
            } catch (const std::exception&) {
              f = -1;
            }
            if (f > 0.0 && f <= 1.0) return {};
            return "expected a fraction of the device's memory in (0, 1], e.g. 0.9; found '" + value + "'";
          },
          "FRACTION in (0, 1]"));
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", opts->prefix_caching,
                "automatic prefix caching: full KV blocks are found again by their tokens and shared (default on)");
  cmd->add_option("--max-body-bytes", opts->http.max_body_bytes, "larger request bodies get 400")->capture_default_str();
  add_chat_template_options(*cmd, opts->chat_template);  // kwargs: defaults that a request's chat_template_kwargs override
  add_parsed_option(*cmd, "--chat-template-content-format", opts->content_format, parse_content_format,
                    "how a message's list of content parts reaches the template: 'string' joins the text parts, "
                    "'openai' passes the list; 'auto' detects what the template iterates (as vLLM)",
                    "auto");
  add_parsed_option(*cmd, "--tool-call-parser", opts->tool_call_parser, parse_tool_call_parser,
                    "how the model writes tool calls (vLLM's names): hermes (Qwen2.5/Qwen3), llama3_json, mistral, "
                    "granite, openai (GPT-OSS); auto detects it from the architecture and chat template; none "
                    "refuses tool_choice auto",
                    "auto");
  add_parsed_option(*cmd, "--reasoning-parser", opts->reasoning_parser, parse_reasoning_parser,
                    "split chat replies into reasoning_content and content: qwen3 (<think>…</think>), openai_gptoss "
                    "(harmony's analysis channel)",
                    "none");
  cmd->add_flag("--structured-outputs-config.disable_any_whitespace", opts->disable_any_whitespace,
                "JSON constraints (json_schema, json_object, forced tool calls) allow no whitespace between tokens, "
                "as vLLM's flag: small models may otherwise write newlines until max_tokens");
  add_number_option(*cmd, "--max-grammar-bytes", opts->grammar_limits.max_source_bytes, NumberRange{1, 1 << 30},
                    "bytes a structured-output constraint may have (a JSON schema, regex, grammar, structural tag, "
                    "or a choice list's strings together); larger ones get 400");
  add_number_option(*cmd, "--max-grammar-nesting", opts->grammar_limits.max_nesting, NumberRange{1, 512},
                    "nesting levels a constraint may have (a JSON schema's objects and arrays; a regex's or grammar's "
                    "brackets); deeper ones get 400");
  add_number_option(*cmd, "--grammar-compile-timeout", opts->grammar_limits.compile_timeout_seconds,
                    NumberRange{0, 3600, false, false, "0 = no deadline"},
                    "seconds a constraint may take to compile; slower ones get 400 (the compile finishes in the "
                    "background and is cached; while 2 such compiles run, new constraints get 503)");
  cmd->add_option("--generation-config", opts->generation_config,
                  "where the defaults of omitted sampling fields come from, as vLLM's flag: auto (the model's "
                  "generation_config.json), vllm (neutral: temperature 1, no top-k/top-p), or a folder holding a "
                  "generation_config.json")
      ->capture_default_str();
  add_number_option(*cmd, "--shutdown-timeout", opts->http.shutdown_timeout_seconds,
                    NumberRange{0, 3600, false, false, "0 = abort at once"},
                    "seconds running requests may take to finish after SIGTERM/SIGINT; then they are aborted "
                    "(streams: an error event + [DONE]; others: 503)");
  cmd->callback([opts] {
    // Every streaming or queued request holds a handler thread; keep a few spare for /health and /metrics.
    opts->http.threads = opts->scheduler.max_num_seqs + opts->scheduler.max_queue + 8;
    run_serve(*opts);
  });
}

}  // namespace fp4serve::app
