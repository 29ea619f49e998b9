"""Helpers shared by the single-agent apps (ppo, dqn, sac): command-line overrides of a
config dataclass, greedy evaluation episodes, a metrics CSV and a learning-curve PNG. Apps import it as
``ppo.app_utils`` with ``apps/`` on ``sys.path``."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os

import torch
from tensordict.nn import InteractionType, set_interaction_type

from tdrl.core import step_mdp

__all__ = ["parse_config", "evaluate_episodes", "MetricsCSV", "plot_curve"]


@torch.no_grad()
def evaluate_episodes(env, policy, episodes: int, seed: int) -> float:
    """Mean return of one deterministic-policy episode per sub-env of ``env``.

    Args:
        env: a batched env of batch size ``(episodes,)`` with a ``RewardSum`` transform
            (``("next", "episode_reward")``); it is closed at the end.
        policy: a TensorDict policy.
        episodes: number of sub-envs (= episodes).
        seed: seed of the evaluation envs.

    Returns:
        The mean of the first finished episode's return of each sub-env.
    """
    env.set_seed(seed)
    td = env.reset()
    finished = torch.zeros(episodes, dtype=torch.bool)
    returns = torch.zeros(episodes)
    with set_interaction_type(InteractionType.DETERMINISTIC):
        while not bool(finished.all()):
            td = env.step(policy(td))
            done = td["next", "done"].squeeze(-1)
            first = done & ~finished
            returns[first] = td["next", "episode_reward"].squeeze(-1)[first]
            finished |= done
            td = step_mdp(td)
            if bool(done.any()):
                td["_reset"] = done.unsqueeze(-1)
                td = env.reset(td).exclude("_reset")
    env.close()
    return float(returns.mean())


def parse_config(cls, argv: list[str] | None = None):
    """Build a config dataclass from ``--field value`` command-line overrides.

    Booleans take ``--flag`` / ``--no-flag``; tuples take several values (``--hidden 256 256``).
    """
    parser = argparse.ArgumentParser(description=(cls.__doc__ or "").split("\n")[0])
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = f"--{f.name}"
        if isinstance(default, bool) or (default is None and "bool" in str(f.type)):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, tuple):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=default)
        elif default is None:  # optional field: the type named in the annotation
            kind = next((t for t in (int, float) if t.__name__ in str(f.type)), str)
            parser.add_argument(flag, type=kind, default=None)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = vars(parser.parse_args(argv))
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    return cls(**args)


class MetricsCSV:
    """Append dict rows to a CSV; columns are fixed by the first row (later keys are added
    by rewriting the file, which is small)."""

    def __init__(self, path: str) -> None:
        self.path, self.rows, self.columns = path, [], []

    def log(self, row: dict) -> None:
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new or not os.path.exists(self.path):
            self.columns += new
            with open(self.path, "w", newline="") as fh:
                writer = csv.DictWriter(fh, self.columns)
                writer.writeheader()
                writer.writerows(self.rows)
        else:
            with open(self.path, "a", newline="") as fh:
                csv.DictWriter(fh, self.columns).writerow(row)


def plot_curve(rows: list[dict], path: str, title: str, x: str = "frames") -> None:
    """Learning curve: training episode return (and evaluation return) against frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("train_return", "-"), ("eval_return", "o--")):
        pts = [(r[x], r[key]) for r in rows if r.get(key) not in (None, "") and not math.isnan(r[key])]
        if pts:
            ax.plot(*zip(*pts), style, label=key)
    ax.set_xlabel(x)
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
