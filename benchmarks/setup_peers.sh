#!/usr/bin/env bash
# Builds .venv-bench: our packages beside the peers users would pick instead (TorchRL 0.14.1, TRL),
# so that one benchmark run measures both and prints the ratio. BenchMARL 1.5.2 pins torchrl<0.12 and
# torchvision, so it cannot share this venv: benchmarks/marl.py sets up its own.
# TorchRL 0.14.1 pins tensordict<0.15, so this venv holds tensordict 0.14.x; tdrl supports it.
# Peers are benchmark-only: they are never runtime dependencies of a tdrl package.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-bench}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q torch==2.13.0
"$PIP" install -q "torchrl==0.14.1" "tensordict>=0.14.3,<0.15" \
    "gymnasium[mujoco,classic-control]==1.4.0" "vmas==1.5.2" "trl" "peft" \
    -e packages/kernels -e "packages/core[apps]" -e packages/marl -e packages/llm \
    matplotlib tqdm psutil
"$VENV/bin/python" -c "import torchrl, tensordict, tdrl.core; print('torchrl', torchrl.__version__, 'tensordict', tensordict.__version__)"

# mctx (JAX on CPU) for benchmarks/mcts.py --mctx: its own plain venv (no torch, no tdrl);
# benchmarks/mcts.py runs benchmarks/mcts_mctx.py in it as a subprocess on the same weights.
MCTX_VENV=${MCTX_VENV:-/work/venvs/mctx}
[ -x "$MCTX_VENV/bin/python" ] || python3 -m venv "$MCTX_VENV"
"$MCTX_VENV/bin/pip" install -q jax jaxlib mctx numpy
"$MCTX_VENV/bin/python" -c "import mctx, jax; print('mctx', mctx.__version__, 'jax', jax.__version__)"
