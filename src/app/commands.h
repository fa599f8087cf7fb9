// SPDX-License-Identifier: Apache-2.0
// Each CLI subcommand lives in its own cmd_<name>.cpp and registers itself on the root CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace fp4serve::app {

/// `fp4serve inspect PATH [--json]`: tensor table, per-dtype totals and the detected producer (headers only).
void register_inspect(CLI::App& root);

/// `fp4serve explain -m DIR [--device D] [--activation-quant auto|weight-only|emulate] [--json] [--check-scales]`:
/// the per-layer scheme plan (table grouped by identical decisions, notices, byte totals). Exits 1 when a layer
/// has no scheme on the device.
void register_explain(CLI::App& root);

/// `fp4serve quantize -m IN -o OUT --scheme nvfp4|nvfp4a16|mxfp4|mxfp4a16|w4a16 [--group-size G] [--ignore P,...]
/// [--calibration FILE] [--calibration-tokens N]`: writes a compressed-tensors checkpoint (quant/quantize_checkpoint.h).
void register_quantize(CLI::App& root);

/// `fp4serve generate -m DIR -p TEXT …`: stream a completion to stdout; load time and tokens/s on stderr.
void register_generate(CLI::App& root);

/// `fp4serve chat -m DIR`: interactive chat over the model's chat template (/reset, /exit).
void register_chat(CLI::App& root);

/// `fp4serve perplexity -m DIR -f FILE [--ctx N] [--stride N] [--kld-base DIR]`.
void register_perplexity(CLI::App& root);

/// `fp4serve serve -m DIR [--host H] [--port P] [--max-num-seqs N] [--max-model-len L] [--api-key KEY] …`:
/// OpenAI-compatible server with continuous batching (src/server); stops cleanly on SIGINT/SIGTERM.
void register_serve(CLI::App& root);

/// `fp4serve bench serve --base-url URL --num-prompts N --max-concurrency C --input-len I --output-len O
/// [--seed S] [--json]`: vllm-bench-serve-style load test of a running server (src/server/bench_client.h).
void register_bench(CLI::App& root);

/// `fp4serve template -m DIR --messages FILE.json`: prints the rendered chat prompt.
void register_template(CLI::App& root);

}  // namespace fp4serve::app
