"""The uv workspace and its lock (issue 38, step 7): uv.lock resolves the four packages of
packages/* together; requirements/lock.txt, which constrains the README's pip lines, is its
export; every package declares the same ``requires-python``; and one package installs from the
lock alone (``uv sync --package``).

Regenerate after changing a dependency (the messages below print the commands):
``uv lock`` then the export line at the top of requirements/lock.txt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "core", "marl", "llm")
LOCK_TXT = ROOT / "requirements" / "lock.txt"


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        pytest.skip("needs uv (pip install -r requirements/test.txt installs it)")
    return uv


def _lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))


def _pyproject(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text(encoding="utf-8"))


def _norm(req: str) -> tuple[str, str, str, frozenset]:
    r = Requirement(req)
    return (re.sub(r"[-_.]+", "-", r.name).lower(), str(r.specifier), str(r.marker or ""), frozenset(r.extras))


def test_the_workspace_is_the_four_packages_with_one_python_range():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert root["tool"]["uv"]["workspace"]["members"] == ["packages/*"]
    ranges = {pkg: _pyproject(pkg)["project"]["requires-python"] for pkg in PACKAGES}
    assert set(ranges.values()) == {">=3.11"}, f"one requires-python for every package: {ranges}"
    members = {p["name"] for p in _lock()["package"] if p.get("source", {}).get("editable") or
               p.get("source", {}).get("virtual")}
    assert {f"tdrl-{pkg}" for pkg in PACKAGES} <= members, members


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_lock_was_made_from_todays_dependencies(pkg):
    """What uv recorded of each package's dependencies and extras equals its pyproject.toml
    (``uv lock --check`` without the network)."""
    project = _pyproject(pkg)["project"]
    entry = next(p for p in _lock()["package"] if p["name"] == f"tdrl-{pkg}")
    declared = {_norm(r) for r in project["dependencies"]}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        declared |= {_norm(f"{r.split(';')[0]} ; {'(' + r.split(';', 1)[1] + ') and ' if ';' in r else ''}extra == '{extra}'")
                     for r in reqs}
    recorded = set()
    for r in entry["metadata"]["requires-dist"]:
        spec = r["name"] + (f"[{','.join(r['extras'])}]" if r.get("extras") else "") + r.get("specifier", "")
        recorded.add(_norm(spec + (f" ; {r['marker']}" if r.get("marker") else "")))
    def strip(reqs):  # uv writes python_full_version, and a workspace member without its pin
        return {(n, "" if n.startswith("tdrl-") else sp, re.sub(r"[\s()]", "", m).replace("python_full_version", "python_version"), e)
                for n, sp, m, e in reqs}

    assert strip(declared) == strip(recorded), (
        f"packages/{pkg}/pyproject.toml changed since uv.lock was made: run `uv lock` and re-export "
        f"requirements/lock.txt (its first line)\n  only in pyproject: {sorted(strip(declared) - strip(recorded))}"
        f"\n  only in uv.lock: {sorted(strip(recorded) - strip(declared))}")


def test_requirements_lock_txt_is_the_export_of_uv_lock(tmp_path):
    header = LOCK_TXT.read_text(encoding="utf-8").splitlines()[0]
    cmd = header.split(": ", 1)[1].split()
    assert cmd[:2] == ["uv", "export"] and "--frozen" in cmd
    out = tmp_path / "lock.txt"
    cmd = [_uv(), *cmd[1:cmd.index("-o")], "-o", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    body = [line for line in LOCK_TXT.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    assert body == out.read_text(encoding="utf-8").splitlines(), (
        "requirements/lock.txt is not the export of uv.lock: rerun the command on its first line")
    assert not any(line.startswith(("torch==", "tdrl-")) for line in body)
    for name in ("main.txt", "test.txt"):
        lines = (ROOT / "requirements" / name).read_text(encoding="utf-8").splitlines()
        assert "-c lock.txt" in lines, f"requirements/{name} does not install from the lock"


def test_the_installed_versions_are_the_locked_ones():
    """The environment the README's test command made has the lock's versions."""
    import importlib.metadata as md

    pinned = {}
    for line in LOCK_TXT.read_text(encoding="utf-8").splitlines():
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^ ;]+)", line)
        if m:
            pinned[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    checked, wrong = 0, []
    for name in ("numpy", "tensordict", "transformers", "gymnasium", "vmas", "triton", "hydra-core"):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            continue
        checked += 1
        if have != pinned[name]:
            wrong.append(f"{name} {have} (locked {pinned[name]})")
    assert checked >= 4
    assert not wrong, f"installed versions differ from requirements/lock.txt: {wrong}"


@pytest.mark.slow
def test_one_package_installs_alone_from_the_lock(tmp_path):
    """``uv sync --frozen --package tdrl-marl --extra vmas``: marl, core and kernels and their
    dependencies from the lock, not llm."""
    uv = _uv()
    work = tmp_path / "ws"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", ".venv*", "runs", "outputs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "UV_"))}
    proc = subprocess.run([uv, "sync", "--frozen", "--package", "tdrl-marl", "--extra", "vmas"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    py = work / ".venv" / "bin" / "python"
    check = ("import importlib.util as u, tdrl.marl, vmas; "
             "assert u.find_spec('tdrl.llm') is None and u.find_spec('transformers') is None; print('ok')")
    out = subprocess.run([str(py), "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
