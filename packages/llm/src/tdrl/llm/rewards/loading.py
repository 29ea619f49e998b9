"""Reward functions named on a command line: ``module:function`` or ``path/to/file.py:function``.

TRL's ``trl grpo --reward_funcs my_module.my_reward`` imports reward functions by name; the
GRPO app does the same with ``reward=my_module:my_reward`` (several as a list, with
``reward_weights``; a local folder is a reward model), and ``tool=my_module:my_tool`` with tools. A name that does not import is refused before any work, saying what was
wrong and how to name the function. The functions keep TRL's signature
``(completions, **kwargs) -> list[float]`` (tdrl's ``(prompts, completions, **columns)`` works
too): the dataset's extra columns arrive as keyword arguments.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence

from tdrl.llm.rewards.compute import RewardFn, compute_rewards
from tdrl.llm.rewards.reward_model import RewardModel

__all__ = ["load_function", "load_reward", "load_rewards", "weighted_reward"]

_HOW = ("name it as module:function (the module importable from the current folder or PYTHONPATH, e.g. "
        "my_rewards:correctness) or path/to/file.py:function")


def _module(name: str, spec: str, what: str = "reward"):
    if name.endswith(".py"):
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise ValueError(f"{what}={spec!r}: no file {path}; {_HOW}")
        mod_name = f"tdrl_user_{what}_" + os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(mod_name)
        if loaded is not None and getattr(loaded, "__file__", None) == path:
            return loaded  # named again (the app checks its config, then builds): one module, one function
        loader = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[mod_name] = module  # a module defining dataclasses or pickled functions needs itself there
        try:
            loader.loader.exec_module(module)
        except Exception as err:
            del sys.modules[mod_name]
            raise ValueError(f"{what}={spec!r}: importing {path} failed: {type(err).__name__}: {err}") from err
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's module beside them
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise ValueError(f"{what}={spec!r}: cannot import module {name!r} ({err}); {_HOW}") from err
    except Exception as err:
        raise ValueError(f"{what}={spec!r}: importing module {name!r} failed: {type(err).__name__}: {err}") from err


def load_function(spec: str, what: str = "reward"):
    """The function ``spec`` names (``"module:function"``, dots allowed in both:
    ``pkg.mod:Class.method``, or ``"path/to/file.py:function"``); ``what`` is the setting named in
    the errors (``reward``, ``tool``).

    Raises:
        ValueError: a malformed name, a module that does not import, a missing or non-callable
            attribute; the message says which and how to name it.
    """
    if not isinstance(spec, str) or ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise ValueError(f"{what}={spec!r} is not a function name: {_HOW}")
    name, attr = spec.rsplit(":", 1)
    obj = _module(name, spec, what)
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(k for k, v in vars(_module(name, spec, what)).items() if callable(v) and not k.startswith("_"))
            raise ValueError(f"{what}={spec!r}: {name!r} has no attribute {attr!r}; its callables are {public}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what}={spec!r}: {attr!r} is a {type(obj).__name__}, not a function")
    return obj


def load_reward(spec: str) -> RewardFn:
    """The reward function ``spec`` names (:func:`load_function`), or a reward model when ``spec``
    is a local folder (:class:`tdrl.llm.rewards.RewardModel`: a sequence-classification model
    saved with ``save_pretrained``, scoring prompt + completion).

    Raises:
        ValueError: as :func:`load_function`, or a folder that is not a sequence-classification model.
    """
    if isinstance(spec, str) and os.path.isdir(spec):
        return RewardModel(spec)
    return load_function(spec, "reward")


def load_rewards(specs: str | Sequence[str]) -> list[RewardFn]:
    """:func:`load_reward` of each name (one string or a list)."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    return [load_reward(s) for s in specs]


def weighted_reward(fns: Sequence[RewardFn], weights: Sequence[float] | None = None) -> Callable[..., list[float]]:
    """One reward function: the weighted sum of ``fns``, each called as the GRPO trainer calls
    it (:func:`tdrl.llm.rewards.compute_rewards`: the dataset's columns as keywords, TRL's
    message lists for chat prompts, coroutine functions awaited), for held-out evaluation
    (:func:`tdrl.llm.evaluate`, which runs the sum under ``reward_timeout``). A function that
    raises makes the sum raise (the caller's ``on_reward_error`` decides)."""
    weights = [1.0] * len(fns) if weights is None else list(weights)
    if len(weights) != len(fns):
        raise ValueError(f"weighted_reward: {len(fns)} functions but {len(weights)} weights")

    def total(prompts, completions, **columns) -> list[float]:
        summed, _, _ = compute_rewards(fns, prompts, completions, columns, weights, timeout=None, on_error="raise")
        return summed.tolist()

    return total
