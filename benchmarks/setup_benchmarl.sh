#!/usr/bin/env bash
# Builds .venv-benchmarl for benchmarks/marl.py: BenchMARL 1.5.2 beside the CPU torch.
# BenchMARL 1.5.2 pins torchrl>=0.10,<0.12 (hence tensordict 0.11.x) and torchvision; PyPI's
# torchvision is a GPU build that fails to load beside the CPU torch (PITFALLS), and BenchMARL
# only needs it for video logging, so BenchMARL is installed with --no-deps and its real
# dependencies (minus torchvision / av) are listed here. Run it under the CPU lock:
#   flock /tmp/tdrl-cpu.lock bash benchmarks/setup_benchmarl.sh
# On a GPU machine the same torch==2.13.0 resolves to PyPI's CUDA build, which
# `benchmarks/marl.py --device cuda` needs on the BenchMARL side too (pass TORCH_SPEC to pin
# another build, e.g. TORCH_SPEC="torch==2.13.0 --index-url <wheel index>").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-benchmarl}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q ${TORCH_SPEC:-torch==2.13.0}
"$PIP" install -q "torchrl==0.11.1" "tensordict>=0.11,<0.12" "vmas==1.5.2" \
    pyvers cloudpickle packaging numpy tqdm hydra-core psutil
"$PIP" install -q --no-deps "benchmarl==1.5.2"
"$VENV/bin/python" -c "import benchmarl, torchrl, tensordict, vmas; print('benchmarl', benchmarl.__version__, 'torchrl', torchrl.__version__, 'tensordict', tensordict.__version__)"
