"""Packaging: versions, typing marker, licence, pins between the tdrl packages, and the errors
a missing optional dependency gives.

The absence of a dependency is produced for real, in a fresh process (``fresh_python``, see
tests/conftest.py): ``sys.modules[name] = None`` before anything imports it is Python's
documented way to make ``import name`` raise ``ModuleNotFoundError`` (and
``importlib.util.find_spec(name)`` return ``None``); the library code under test is not patched.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "core", "marl", "llm")


def _pyproject(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("pkg", PACKAGES)
def test_version_equals_installed_metadata_and_pyproject(pkg):
    module = importlib.import_module(f"tdrl.{pkg}")
    declared = _pyproject(pkg)["project"]["version"]
    assert module.__version__ == md.version(f"tdrl-{pkg}") == declared, (
        f"tdrl.{pkg}.__version__={module.__version__!r}, installed metadata "
        f"{md.version(f'tdrl-{pkg}')!r}, pyproject {declared!r}: reinstall with "
        f"`pip install --no-deps -e packages/{pkg}`"
    )
    assert "__version__" in module.__all__


@pytest.mark.parametrize("pkg", PACKAGES)
def test_py_typed_and_license_ship(pkg):
    module = importlib.import_module(f"tdrl.{pkg}")
    assert (Path(module.__file__).parent / "py.typed").is_file(), f"tdrl.{pkg} has no py.typed"
    project = _pyproject(pkg)["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert project["readme"] == "README.md" and (ROOT / "packages" / pkg / "README.md").is_file()
    assert project["authors"] and any(c == "Typing :: Typed" for c in project["classifiers"])
    # the package's LICENSE is a copy of the repository's (PEP 639 forbids paths above the package)
    root_license = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in root_license and "the tdrl authors" in root_license
    assert (ROOT / "packages" / pkg / "LICENSE").read_text(encoding="utf-8") == root_license
    dist = md.distribution(f"tdrl-{pkg}")
    assert dist.metadata["License-Expression"] == "MIT"
    shipped = [f for f in dist.files or () if f.name == "LICENSE"]
    assert shipped, f"the installed tdrl-{pkg} metadata carries no LICENSE file"
    assert Path(dist.locate_file(shipped[0])).read_text(encoding="utf-8") == root_license


def _tdrl_requirements(pkg: str) -> dict[str, str]:
    """{tdrl dependency: its specifier} from a package's pyproject."""
    out = {}
    for req in _pyproject(pkg)["project"]["dependencies"]:
        name, _, spec = req.partition("==")
        if name.startswith("tdrl-"):
            out[name] = spec
    return out


def test_tdrl_packages_pin_each_other_at_their_versions():
    versions = {f"tdrl-{p}": _pyproject(p)["project"]["version"] for p in PACKAGES}
    expected = {"marl": {"tdrl-core"}, "llm": {"tdrl-core", "tdrl-kernels"}, "core": {"tdrl-kernels"},
                "kernels": set()}
    for pkg in PACKAGES:
        pins = _tdrl_requirements(pkg)
        assert set(pins) == expected[pkg], f"tdrl-{pkg} depends on {sorted(pins)}"
        for name, spec in pins.items():
            assert spec == versions[name], f"tdrl-{pkg} pins {name}=={spec!r}, its version is {versions[name]}"


# ------------------------------------------------------------------ missing optional dependencies
def _run_without(fresh_python, blocked: list[str], code: str) -> subprocess.CompletedProcess:
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
    return fresh_python.run(prelude + textwrap.dedent(code), absent=blocked, cwd=ROOT)


_CASES = {
    "gymnasium": (["gymnasium"], """
        from tdrl.core import GymEnv
        GymEnv("Pendulum-v1")
        """, 'pip install "packages/core[gym]"'),
    "mujoco": (["mujoco"], """
        from tdrl.core import GymEnv
        GymEnv("HalfCheetah-v5")
        """, 'pip install "packages/core[mujoco]"'),
    "triton": (["triton"], """
        import torch
        from tdrl.kernels import gae, use_backend
        x = torch.zeros(2, 3, 1)
        with use_backend("triton"):
            gae(x, x, x, x.bool(), x.bool(), 0.9, 0.9)
        """, 'pip install "packages/kernels[triton]"'),
    "peft": (["peft"], """
        from tdrl.llm import apply_lora
        apply_lora(None)
        """, 'pip install "packages/llm[peft]"'),
    "imageio": (["imageio"], """
        from tdrl.marl.loops import render_episode
        render_episode(None, None, "never.gif", 1)
        """, 'pip install "packages/marl[apps]"'),
    "vllm": (["vllm"], """
        from tdrl.llm import VLLMGenerator
        VLLMGenerator("some/model", None)
        """, 'pip install "packages/llm[vllm]"'),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_a_missing_optional_dependency_names_its_extra(fresh_python, name):
    blocked, code, pip_line = _CASES[name]
    proc = _run_without(fresh_python, blocked, code)
    assert proc.returncode != 0, f"ran without {name}: {proc.stdout}"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:") and pip_line in last, proc.stderr[-2000:]


def test_marl_benchmark_without_matplotlib_writes_its_tables_and_warns(fresh_python, tmp_path):
    code = f"""
        import logging
        from tdrl.marl import runner
        from tdrl.marl.runner import BenchConfig, write_results
        logging.basicConfig(level=logging.WARNING)
        cfg = BenchConfig(algorithms=("mappo",), tasks=("navigation",), seeds=(0,), tiny=True,
                          out_dir={str(tmp_path)!r})
        result = {{"summary": [], "evaluations": [dict(algorithm="mappo", task="navigation", seed=0,
                   iter=1, frames=10, time_s=1.0, eval_return=0.0, train_return=0.0)], "speedups": []}}
        runner._markdown = lambda cfg, result: "table\\n"
        write_results(cfg, result)
        """
    proc = _run_without(fresh_python, ["matplotlib"], code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "results.md").is_file() and (tmp_path / "evaluations.csv").is_file()
    assert not list(tmp_path.glob("*.png"))
    assert 'pip install "packages/marl[apps]"' in proc.stderr


def test_the_blocking_is_real(fresh_python):
    """The trick does make the import fail (so the cases above can fail), in a forked case and
    in a fresh interpreter (where the server had already imported the module)."""
    proc = _run_without(fresh_python, ["gymnasium"], "import gymnasium")
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
    proc = _run_without(fresh_python, [], "import gymnasium")
    assert proc.returncode == 0, proc.stderr
    assert "gymnasium" not in fresh_python.preloaded and "numpy" in fresh_python.preloaded
    proc = _run_without(fresh_python, ["numpy"], "import numpy")  # the fresh-interpreter path
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


# ------------------------------------------------------------------ fresh-venv install check
TORCH = "torch==2.13.0"


def _quick_start(pkg: str):
    """(install line, code) of a package README's "## Quick start" section: the ``pip install``
    line of its first ```bash block and its tested ```python blocks, line numbers kept."""
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("_readme_blocks", ROOT / "tests" / "test_readmes.py")
    readmes = sys.modules.get(spec.name) or module_from_spec(spec)
    sys.modules[spec.name] = readmes  # dataclasses look their module up there
    spec.loader.exec_module(readmes)
    text = (ROOT / "packages" / pkg / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Quick start\n")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    section = text[start:end]
    bash = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("#")[0].strip() for ln in bash.splitlines() if ln.strip().startswith("pip install")]
    assert len(lines) == 1, f"packages/{pkg}/README.md: the quick start shows {lines}, expected one pip line"
    offset = text[:start].count("\n")
    code = []
    for block in readmes.python_blocks(section, f"packages/{pkg}/README.md"):
        if block.skip is None:
            code.append("\n" * (offset + block.line - 1 - sum(c.count("\n") for c in code)) + block.code)
    assert code, f"packages/{pkg}/README.md: no tested quick-start block"
    return lines[0], "".join(code) + "\n"


def _pip_sources() -> list[str]:
    """This machine's pip sources (``--find-links`` / ``--extra-index-url`` from pip's own
    config, where the CPU torch wheel lives) as uv flags: uv does not read pip's config."""
    flags = []
    for key, flag in (("find-links", "--find-links"), ("extra-index-url", "--extra-index-url"),
                      ("index-url", "--index-url")):
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", f"global.{key}"],
                              capture_output=True, text=True)
        for value in proc.stdout.split() if proc.returncode == 0 else ():
            if value.startswith("file://") and not Path(value[7:]).is_dir():
                continue  # pip skips a missing local index with a warning; uv would fail
            flags += [flag, value]
    return flags


@pytest.mark.slow
@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_installs_alone_and_its_quick_start_runs(pkg, tmp_path):
    """Each package in a fresh venv with exactly the pip line its README's quick start prints
    (plus a constraint that keeps torch at 2.13.0), then the quick start's Python blocks.

    The install runs through ``uv pip install`` (pip's command line, same resolution from the
    same sources; uv links wheels from its cache instead of unpacking each one again: the
    four took 2 min 46 s with pip and a shared torch venv).
    """
    try:
        _install_and_run(pkg, tmp_path)
    finally:
        shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def _install_and_run(pkg: str, tmp_path: Path) -> None:
    import shlex

    line, code = _quick_start(pkg)
    args = shlex.split(line)
    assert args[:2] == ["pip", "install"], line
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"{TORCH}\n")
    # uv runs from this interpreter but installs into (and resolves against) the venv only
    # --no-config: the root pyproject's [tool.uv] settings are the workspace lock's, not pip's
    proc = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--no-config", "--python", python, *args[2:], "-q",
                           "-c", str(constraints), *_pip_sources()], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"`{line}` failed in a fresh venv:\n{proc.stderr[-3000:]}"
    script = tmp_path / "quick_start.py"
    script.write_text(code)
    others = [p for p in PACKAGES if f"packages/{p}" not in line]
    check = (
        "import importlib.util as u, torch\n"
        "assert torch.__version__.startswith('2.13.0'), torch.__version__\n"
        f"extra = [p for p in {others!r} if u.find_spec('tdrl.' + p) is not None]\n"
        "assert not extra, f'installed without being asked: {extra}'\n"
    )
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg", "TMPDIR": str(tmp_path)}
    proc = subprocess.run([python, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    work = tmp_path / "work"  # the snippets write runs/ here
    work.mkdir()
    proc = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, cwd=work,
                          timeout=900)
    assert proc.returncode == 0, f"packages/{pkg}/README.md quick start failed after `{line}`:\n{proc.stderr[-3000:]}"


def test_no_script_or_test_folder_shadows_an_installed_module():
    """``python benchmarks/x.py`` puts benchmarks/ first on sys.path (and pytest registers a
    test folder with an ``__init__.py`` as a top-level module): a benchmark named like an
    installed package is imported instead of it (``benchmarks/kernels.py`` hid Hugging Face's
    ``kernels``, which transformers 5.25 imports)."""
    installed = set(md.packages_distributions())
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} | {p.stem for p in (ROOT / "apps").glob("*/*.py")}
    names |= {p.parent.name for p in (ROOT / "tests").glob("*/__init__.py")}
    assert "records" in names and "train" in names  # the globs found the scripts
    clashes = sorted(names & installed)
    assert not clashes, f"rename these: they shadow installed modules of the same name: {clashes}"
