// SPDX-License-Identifier: Apache-2.0
// Each CLI subcommand lives in its own cmd_<name>.cpp and registers itself on the root CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace fp4serve::app {

/// `fp4serve inspect MODEL [--json]` (MODEL positional or -m): tensor table, per-dtype totals and the detected producer (headers only).
void register_inspect(CLI::App& root);

/// `fp4serve explain MODEL [--device D] [--activation-quant auto|weight-only|emulate] [--json] [--check-scales]`:
/// the per-layer scheme plan (table grouped by identical decisions, notices, byte totals). Exits 1 when a layer
/// has no scheme on the device.
void register_explain(CLI::App& root);

/// `fp4serve quantize IN -o OUT --scheme nvfp4|nvfp4a16|mxfp4|mxfp4a16|w4a16 (any case) [--group-size G] [--ignore P,...]
/// [--calibration FILE] [--calibration-tokens N]`: writes a compressed-tensors checkpoint (quant/quantize_checkpoint.h)
/// into OUT.tmp and renames it to OUT when complete; every failure removes OUT.tmp.
void register_quantize(CLI::App& root);

/// `fp4serve generate MODEL -p TEXT|-p -|-f FILE [--json] …`: stream a completion to stdout; load time, tokens/s and
/// the thread choice on stderr. Prompt + max tokens above the context length is refused before generating.
void register_generate(CLI::App& root);

/// `fp4serve chat MODEL`: interactive chat over the model's chat template (/help, /reset, /exit, /quit; libedit line
/// editing and history on a terminal; Ctrl-C stops a reply).
void register_chat(CLI::App& root);

/// `fp4serve perplexity MODEL -f FILE [-c/--ctx N] [--stride N] [--kld-base DIR] [--json]`.
void register_perplexity(CLI::App& root);

/// `fp4serve serve MODEL [--host H] [--port P] [--max-num-seqs N] [--max-model-len L] [--api-key KEY] …`:
/// OpenAI-compatible server with continuous batching (src/server); stops cleanly on SIGINT/SIGTERM.
void register_serve(CLI::App& root);

/// `fp4serve bench serve --base-url URL --num-prompts N --max-concurrency C --input-len I --output-len O
/// [--seed S] [--json]`: vllm-bench-serve-style load test of a running server (src/server/bench_client.h).
void register_bench(CLI::App& root);

/// `fp4serve template -m DIR --messages FILE.json`: prints the rendered chat prompt.
void register_template(CLI::App& root);

}  // namespace fp4serve::app
