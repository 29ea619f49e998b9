#!/usr/bin/env bash
# The prepared MARL GPU check (issue #16): tdrl.marl vs BenchMARL 1.5.2, `--device cuda` on both sides.
#
# Device-tool call, the second one after benchmarks/gpu_check.sh while the machine is still warm
# (it stays 30 s), when >= 5 minutes of device time are left (or the first one, when MARL is what
# the session needs); .devwheels is built here first by `bash benchmarks/make_devwheels.sh`:
#
#   run(command="bash benchmarks/gpu_marl.sh", carry=[".devwheels"], timeout_s=300)
#
# Each step runs under its own `timeout`, all inside GPU_MARL_BUDGET_S (default 240 s; a step gets
# min(its cap, what is left) and is skipped under 20 s), with one log per step under $OUT:
#   env.txt                   - pip installs, both sides' imports and versions, the GPU;
#   1. marl_cuda.log          - -m benchmarks.marl --device cuda --iters 2 --repeats 3: MAPPO
#                               navigation frames/s, the CPU table's command and budget (600 envs);
#   2. marl_table_cuda.log    - -m benchmarks.marl_table --device cuda, navigation x MAPPO + QMIX,
#      marl_table_runs.ndjson   seed 0, default budget (frames/s and evaluation returns; the per-seed
#                               runs come back in --runs' format);
#   3. marl_cuda_6000envs.log - marl.py --device cuda at a GPU-sized batch (6,000 envs, 600,000
#                               frames per batch, minibatches of 60,000, 2 iterations, 1 repeat);
#   summary.txt               - one line per step: exit code, seconds, last log line.
# marl_table's step records its rows (named apart: ", device cuda", so they never replace the CPU
# rows) and copies the records file to $OUT/multi_agent.jsonl: on the same commit, copy it over
# benchmarks/results/multi_agent.jsonl and run make_results.py. marl.py's figures are in the logs.
#
# The image has python 3.12 + torch but none of the MARL stack, and the two sides need different
# tensordicts, so two site folders (never on one path):
#   /tmp/tdrl_site           <- .devwheels/*.whl (tensordict 0.15, vmas, gym, pyglet): the tdrl
#                               side, with packages/*/src on PYTHONPATH;
#   /tmp/tdrl_site_benchmarl <- .devwheels/benchmarl/*.whl (benchmarl, torchrl 0.11.1, tensordict
#                               0.11, hydra-core, vmas, ...): the BenchMARL side, which marl.py
#                               launches as TDRL_BENCHMARL_PYTHON=python3 with
#                               TDRL_BENCHMARL_PYTHONPATH=/tmp/tdrl_site_benchmarl (its whole path).
# Without CUDA (e.g. `bash benchmarks/gpu_marl.sh` here or in CI) it installs nothing, says so
# and exits 0.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tdrl_gpu_marl}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${GPU_MARL_BUDGET_S:-240}
TAG=gpu_marl
export PYTHONUNBUFFERED=1
: >"$OUT/summary.txt"
. benchmarks/gpu_steps.sh  # note, step

HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$HAS_CUDA" != 1 ]; then
    note "no CUDA device for $PY: MARL GPU steps SKIPPED"
    exit 0
fi
SITE1=/tmp/tdrl_site SITE2=/tmp/tdrl_site_benchmarl
for pair in "$SITE1:.devwheels" "$SITE2:.devwheels/benchmarl"; do
    site=${pair%%:*} wheels=${pair#*:}
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
        note "no $wheels/*.whl carried (bash benchmarks/make_devwheels.sh, carry .devwheels): stopping"
        exit 0
    fi
    rm -rf "$site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$wheels"/*.whl >>"$OUT/env.txt" 2>&1 || note "pip install into $site FAILED (env.txt)"
done
export PYTHONPATH=packages/kernels/src:packages/core/src:packages/marl/src:packages/llm/src:$SITE1
export TDRL_BENCHMARL_PYTHON=$PY TDRL_BENCHMARL_PYTHONPATH=$SITE2

# ---------------------------------------------------------------- 0. environment, both sides
VERSIONS='
import importlib, sys, torch
out = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}", f"cuda {torch.cuda.get_device_name()}"]
for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        version = getattr(mod, "__version__", "ok")
        out.append(f"{name} {version} ({mod.__file__})")
    except Exception as exc:  # report, do not stop the check
        out.append(f"{name} NOT IMPORTABLE: {type(exc).__name__} {str(exc)[:200]}")
print("; ".join(out))
'
{
    nvidia-smi 2>&1 | head -n 15 || true
    echo "tdrl side: $("$PY" -c "$VERSIONS" tensordict vmas tdrl.core tdrl.marl 2>&1 | tail -n 1)"
    echo "BenchMARL side: $(cd /tmp && PYTHONPATH=$SITE2 "$PY" -c "$VERSIONS" tensordict torchrl vmas benchmarl 2>&1 | tail -n 1)"
} >>"$OUT/env.txt" 2>&1
note "$(grep -E '^(tdrl|BenchMARL) side' "$OUT/env.txt" | tr '\n' ' ' | cut -c1-600)"

# ---------------------------------------------------------------- 1-3. tdrl vs BenchMARL on CUDA
step "marl.py --device cuda" 130 marl_cuda.log "$PY" -m benchmarks.marl --device cuda --iters 2 --repeats 3
step "marl_table.py --device cuda (navigation, mappo + qmix, seed 0)" 110 marl_table_cuda.log \
    "$PY" -m benchmarks.marl_table --device cuda --tasks navigation --algorithms mappo qmix --seeds 0 \
    --runs "$OUT/marl_table_runs.ndjson" --record
cp benchmarks/results/multi_agent.jsonl "$OUT/multi_agent.jsonl" 2>/dev/null || true
step "marl.py --device cuda, 6000 envs" 90 marl_cuda_6000envs.log "$PY" -m benchmarks.marl --device cuda \
    --envs 6000 --frames 600000 --minibatch 60000 --iters 2 --repeats 1
note "done in ${SECONDS}s; logs in $OUT"
exit 0
