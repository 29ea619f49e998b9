#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.sh installs on the device machine into .devwheels/
# (its image has torch, triton and transformers but not tensordict, and no internet).
# Run here, before the device-tool call that carries .devwheels:
#   bash benchmarks/make_devwheels.sh && run(command="bash benchmarks/gpu_check.sh", carry=[".devwheels"], timeout_s=540)
# Versions follow this machine's install (tensordict, gymnasium); the device image's python is 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
ver() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .devwheels && mkdir -p .devwheels
pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .devwheels \
    "tensordict==$(ver tensordict)" "pyvers==$(ver pyvers)" orjson importlib_metadata zipp cloudpickle \
    "gymnasium==$(ver gymnasium)" farama-notifications
ls .devwheels
