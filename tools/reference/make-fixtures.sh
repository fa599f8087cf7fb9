#!/usr/bin/env bash
# Regenerate every reference fixture under tests/data/ref/ (CPU only, ~10 min on 2 cores).
# Extra arguments go to make_fixtures.py (e.g. --only llama-nvfp4, --jobs 2).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
"$here/setup.sh"
cd "$root"
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONHASHSEED=0
"$here/.venv/bin/python" "$here/make_fixtures.py" "$@"
"$here/.venv/bin/python" "$here/write_readme.py"
# Sampler / perplexity references (tests/data/sampling), scored on the fixtures written above.
"$here/.venv/bin/python" "$here/fx_sampling.py"
du -sh "$root/tests/data/ref"
