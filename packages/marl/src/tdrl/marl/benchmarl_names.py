"""BenchMARL's command-line spellings, mapped onto the benchmark's settings in one place.

A BenchMARL user types ``python benchmarl/run.py algorithm=mappo task=vmas/balance
experiment.lr=0.0003 algorithm.share_param_critic=False seed=0``. ``apps/marl_bench`` accepts
the same line: :func:`translate_overrides` rewrites each BenchMARL key that means what a tdrl
setting means (:data:`RENAMED`) and refuses, naming the tdrl setting to use, each one that
does not carry over as it is (:data:`REFUSED`: a budget in frames where tdrl counts
iterations) or has no counterpart here. ``algorithm=`` / ``task=`` / ``seed=`` are tdrl's own
spellings (``task=vmas/<name>``, ``pettingzoo/<name>``: :func:`tdrl.marl.tasks.resolve_task`).

Key names are BenchMARL's ``benchmarl/conf/experiment/base_experiment.yaml`` and
``benchmarl/conf/algorithm/<name>.yaml`` at the commit of :data:`tdrl.marl.tasks.BENCHMARL_COMMIT`.
:func:`markdown_table` prints the mapping for the README.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MODELS", "RENAMED", "REFUSED", "BenchmarlNameError", "markdown_table", "translate_overrides"]

RENAMED: dict[str, str] = {
    "experiment.gamma": "gamma",
    "experiment.lr": "lr",
    "experiment.clip_grad_val": "max_grad_norm",
    "experiment.max_n_iters": "n_iters",
    "experiment.on_policy_collected_frames_per_batch": "frames_per_batch",
    "experiment.on_policy_n_minibatch_iters": "num_epochs",
    "experiment.on_policy_minibatch_size": "minibatch_size",
    "experiment.on_policy_n_envs_per_worker": "num_envs",
    "experiment.off_policy_collected_frames_per_batch": "off_policy_frames_per_batch",
    "experiment.off_policy_n_optimizer_steps": "n_optimizer_steps",
    "experiment.off_policy_train_batch_size": "off_policy_batch_size",
    "experiment.off_policy_memory_size": "buffer_size",
    "experiment.evaluation_episodes": "eval_envs",
    "experiment.train_device": "device",
    "experiment.save_folder": "out",
    "algorithm.share_param_critic": "share_param_critic",
    "model.hidden_size": "rnn_hidden",
}
"""BenchMARL key -> the tdrl setting of the same meaning (the value passes unchanged)."""

REFUSED: dict[str, str] = {
    "experiment.max_n_frames": "n_iters (tdrl counts iterations of frames_per_batch frames: "
                               "BenchMARL's 3_000_000 frames at 6000 per batch is n_iters=500)",
    "experiment.evaluation_interval": "eval_interval (in iterations: BenchMARL's 120_000 frames at 6000 per "
                                      "batch is eval_interval=20)",
    "experiment.sampling_device": "device (one device for the simulator and the training)",
    "experiment.off_policy_n_envs_per_worker": "num_envs (shared by both kinds of algorithm)",
    "experiment.clip_grad_norm": "max_grad_norm (always a norm clip here)",
}
"""BenchMARL key -> why it does not carry over and the tdrl setting to use instead."""

MODELS: dict[str, tuple[str, ...]] = {
    "layers/mlp": (),
    "layers/gru": ("recurrent=true", "rnn=gru"),
    "layers/lstm": ("recurrent=true", "rnn=lstm"),
}
"""BenchMARL's ``model=`` / ``critic_model=`` choice -> the tdrl settings that build it
(``layers/mlp`` is the default). tdrl's recurrent networks come in pairs (actor and critic),
so a recurrent ``model=`` needs the same ``critic_model=`` (BenchMARL's critic stays an MLP
unless told); a mismatch is refused naming ``recurrent=true rnn=...``."""

_BENCHMARL_GROUPS = ("experiment.", "algorithm.", "task.", "model.", "critic_model.")


class BenchmarlNameError(ValueError):
    """A BenchMARL override with no tdrl setting of the same meaning (the message names the one to use)."""


def _split(arg: str) -> tuple[str, str, str] | None:
    """``(prefix, key, value)`` of a ``[+~]key=value`` override; ``None`` for a flag."""
    if arg.startswith("-") or "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    return prefix, key[len(prefix):], value


def translate_overrides(argv: Sequence[str]) -> list[str]:
    """``argv`` with BenchMARL's keys in tdrl's spelling.

    Args:
        argv: command-line arguments (``key=value`` overrides and flags; a flag's argument,
            as in ``-cn tiny``, passes through).

    Returns:
        The arguments, each key of :data:`RENAMED` replaced by its tdrl setting.

    Raises:
        BenchmarlNameError: a key of :data:`REFUSED`, or another ``experiment.`` /
            ``algorithm.`` / ``task.`` / ``model.`` key; the message says what to use.
    """
    out = []
    chosen = {"model": "layers/mlp", "critic_model": "layers/mlp"}
    for parts in filter(None, map(_split, argv)):
        if parts[1] in chosen:
            if parts[2] not in MODELS:
                raise BenchmarlNameError(f"BenchMARL's {parts[1]}={parts[2]} has no tdrl counterpart (GNN / DeepSets "
                                         f"/ CNN models are not built here); models accepted: {', '.join(MODELS)}.")
            chosen[parts[1]] = parts[2]
    if chosen["model"] != chosen["critic_model"]:
        cell = next(m for m in chosen.values() if m != "layers/mlp").split("/")[1]
        raise BenchmarlNameError(f"model={chosen['model']} with critic_model={chosen['critic_model']}: tdrl's recurrent "
                                 f"networks come in pairs; use recurrent=true rnn={cell} (actor and critic both) "
                                 f"or give BenchMARL's model= and critic_model= the same value.")
    for arg in argv:
        parts = _split(arg)
        if parts is None or parts[1].startswith("hydra"):
            out.append(arg)
            continue
        prefix, key, value = parts
        if key in chosen:
            out.extend(MODELS[value] if key == "model" else ())
        elif key in RENAMED:
            out.append(f"{prefix.replace('+', '')}{RENAMED[key]}={value}")
        elif key in REFUSED:
            raise BenchmarlNameError(f"BenchMARL's {key} is not a setting here: use {REFUSED[key]}.")
        elif key.startswith(_BENCHMARL_GROUPS):
            what = ("task parameters are BenchMARL's YAML values (tdrl.marl.tasks)" if key.startswith("task.")
                    else "see --help for the settings")
            raise BenchmarlNameError(f"BenchMARL's {key} has no tdrl setting of the same meaning ({what}); "
                                     f"BenchMARL keys accepted: {', '.join(sorted(RENAMED))}.")
        else:
            out.append(arg)
    return out


def markdown_table() -> str:
    """The mapping as a Markdown table (BenchMARL key | tdrl setting), for the README."""
    rows = ["| BenchMARL | tdrl |", "| --- | --- |"]
    rows += [f"| `{k}` | `{v}` |" for k, v in RENAMED.items()]
    rows += [f"| `model={k}` (and `critic_model={k}`) | {' '.join(f'`{x}`' for x in v) or '(the default)'} |"
             for k, v in MODELS.items()]
    rows += [f"| `{k}` | refused: use {v} |" for k, v in REFUSED.items()]
    return "\n".join(rows) + "\n"
