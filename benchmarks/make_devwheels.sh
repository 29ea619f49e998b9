#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.sh and benchmarks/gpu_marl.sh install on the device
# machine (its image has python 3.12, torch, triton, transformers, numpy, six, pyyaml, tqdm,
# cloudpickle, packaging, zipp, but not tensordict / vmas / torchrl / BenchMARL, and no internet).
# Run here, before the device-tool calls that carry .devwheels:
#   bash benchmarks/make_devwheels.sh && run(command="bash benchmarks/gpu_check.sh", carry=[".devwheels"], timeout_s=540)
# Two sets that never meet (tdrl and BenchMARL 1.5.2 need different tensordicts):
#   .devwheels/*.whl            tdrl's side: tensordict, gymnasium, ... and vmas + what it imports
#                               (gym, gym-notices, pyglet); versions from this machine's python;
#   .devwheels/benchmarl/*.whl  BenchMARL's side for benchmarks/gpu_marl.sh: benchmarl, torchrl,
#                               tensordict 0.11, hydra-core, omegaconf, antlr4, vmas, ...; versions
#                               from .venv-benchmarl (BENCHMARL_VENV, default ./.venv-benchmarl,
#                               else /work/main's; built by benchmarks/setup_benchmarl.sh).
# cp312 / manylinux x86_64 / any, --no-deps, never torch. BenchMARL 1.5.2, vmas 1.5.2, gym 0.26.2 and
# antlr4-python3-runtime 4.9.3 exist only as sdists: they are pure Python, so `pip wheel` builds py3-none-any wheels here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BENCHMARL_VENV:-.venv-benchmarl}
[ -x "$VENV/bin/python" ] || VENV=/work/main/.venv-benchmarl
[ -x "$VENV/bin/python" ] || { echo "no .venv-benchmarl: run benchmarks/setup_benchmarl.sh first" >&2; exit 1; }
# ver PYTHON DIST: the version of DIST installed for PYTHON.
ver() { "$1" -c "import importlib.metadata as m; print(m.version('$2'))"; }
here() { echo "$1==$(ver python "$1")"; }
theirs() { echo "$1==$(ver "$VENV/bin/python" "$1")"; }
get() {  # get DIR SPEC...: binary cp312 wheels, no dependencies
    local dir=$1
    shift
    pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d "$dir" "$@"
}
sdist() { pip wheel -q --no-deps -w "$1" "${@:2}"; }  # sdist DIR SPEC...: pure-Python sdists -> wheels

rm -rf .devwheels && mkdir -p .devwheels/benchmarl
# tdrl side (gpu_check.sh and gpu_marl.sh): tensordict 0.15 and the MARL envs.
get .devwheels "$(here tensordict)" "$(here pyvers)" orjson importlib_metadata lazy-importer zipp cloudpickle \
    "$(here gymnasium)" farama-notifications "$(here pyglet)" "$(here gym-notices)"
sdist .devwheels "$(here vmas)" "$(here gym)"
# BenchMARL side (gpu_marl.sh only), exactly .venv-benchmarl's versions.
get .devwheels/benchmarl "$(theirs torchrl)" "$(theirs tensordict)" "$(theirs pyvers)" \
    "$(theirs orjson)" "$(theirs importlib_metadata)" "$(theirs lazy-importer)" "$(theirs hydra-core)" \
    "$(theirs omegaconf)" "$(theirs pyglet)" "$(theirs gym-notices)"
sdist .devwheels/benchmarl "$(theirs benchmarl)" "$(theirs vmas)" "$(theirs gym)" "$(theirs antlr4-python3-runtime)"
ls .devwheels .devwheels/benchmarl
echo "tdrl side $(du -ch .devwheels/*.whl | tail -n 1 | cut -f1), BenchMARL side $(du -ch .devwheels/benchmarl/*.whl | tail -n 1 | cut -f1), all $(du -sh .devwheels | cut -f1)"
