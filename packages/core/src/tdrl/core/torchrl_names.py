"""TorchRL's keyword spellings of tdrl.core's constructors: the one place they are accepted.

A TorchRL user writes ``SACLoss(actor_network=actor, qvalue_network=qnet, delay_qvalue=True)``,
``SoftUpdate(loss, eps=0.995)``, ``MLP(depth=2, num_cells=256, activation_class=nn.ReLU)`` or
``Collector(create_env_fn=make_env, ...)``. Each such keyword is one :class:`TorchRLName` row of
the table of its class, with one of four kinds:

- ``"map"``: renamed to tdrl's keyword, the value converted where TorchRL's differs
  (``eps`` -> ``tau = 1 - eps``; an ``action_spec`` -> the bounds tdrl takes);
- ``"noop"``: accepted where its value is what tdrl always does (``delay_qvalue=True``: tdrl's
  losses always keep target networks), refused for the other values, naming what to do;
- ``"refuse"``: a concept tdrl spells differently or lacks: refused, naming what to use;
- ``"same"``: the same keyword and meaning (listed for the README table only).

No TorchRL keyword is ignored silently. :func:`accept_torchrl_names` wraps a class's
``__init__`` (the class's name selects its table); tdrl's own keywords keep working, and giving
both spellings of one setting is an error. :func:`torchrl_table_markdown` renders the table
of ``packages/core/README.md`` (``tests/core/test_torchrl_names.py`` checks that the README
holds exactly that text). Deliberate differences of *behaviour* (defaults, loss conventions)
are listed in :data:`DIFFERENCES`, rendered below the keyword table.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DIFFERENCES",
    "TABLES",
    "TorchRLName",
    "accept_torchrl_names",
    "torchrl_table_markdown",
    "translate",
    "write_readme_table",
]


@dataclass(frozen=True)
class TorchRLName:
    """One TorchRL keyword of one class and what it becomes in tdrl.

    Attributes:
        torchrl: TorchRL's keyword.
        kind: ``"map"``, ``"noop"``, ``"refuse"`` or ``"same"`` (see the module docstring).
        tdrl: tdrl's keyword (``"map"``, ``"same"``); for ``"refuse"`` / ``"noop"``, what to use.
        convert: ``value -> {tdrl keyword: value}`` for a ``"map"`` that changes the value or
            fills several keywords (``None``: ``{tdrl: value}``).
        accepts: for ``"noop"``: whether a value is the one with no effect here.
        note: one line for the README table.
    """

    torchrl: str
    kind: str
    tdrl: str = ""
    convert: Callable[[Any], dict[str, Any]] | None = None
    accepts: Callable[[Any], bool] | None = None
    note: str = ""


# ------------------------------------------------------------------ value converters


def _bounds(spec: Any) -> dict[str, Any]:
    """An action spec (TorchRL's or tdrl's ``Bounded``) -> ``action_low`` / ``action_high``."""
    low, high = getattr(spec, "low", None), getattr(spec, "high", None)
    if low is None or high is None:
        raise ValueError(f"action_spec={spec!r} has no low / high bounds: pass a Bounded spec, or "
                         "action_low= and action_high= directly")
    return {"action_low": low, "action_high": high}


def _noise_bounds(spec: Any) -> dict[str, Any]:
    return {"low": _bounds(spec)["action_low"], "high": _bounds(spec)["action_high"]}


def _eps_to_tau(eps: float) -> dict[str, Any]:
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps={eps} (TorchRL's SoftUpdate decay) must be in [0, 1): tdrl's tau = 1 - eps")
    return {"tau": 1.0 - eps}


def _is(value: Any) -> Callable[[Any], bool]:
    return lambda v: v == value


def _cpu_or_none(v: Any) -> bool:
    return v is None or str(v) == "cpu"


# ------------------------------------------------------------------ the tables

_ACTOR = TorchRLName("actor_network", "map", "actor")
_CRITIC = TorchRLName("critic_network", "map", "critic")
_QVALUE = TorchRLName("qvalue_network", "map", "qvalue")
_DELAY = "tdrl's losses always keep target networks: update them with SoftUpdate / HardUpdate"
_DELAYS = tuple(TorchRLName(k, "noop", "(always)", accepts=_is(True), note=_DELAY)
                for k in ("delay_actor", "delay_qvalue", "delay_value"))
_SAC_DELAY_ACTOR = TorchRLName("delay_actor", "noop", "(False: no target actor)", accepts=_is(False),
                               note="SAC's next action comes from the online actor (TorchRL's default)")
_FUNCTIONAL = TorchRLName("functional", "noop", "(always)", accepts=_is(True),
                          note="tdrl's losses call the networks as given (no functional copy)")
_REDUCTION = TorchRLName("reduction", "noop", "(mean)", accepts=_is("mean"),
                         note="losses are means over the batch; sum a per-sample loss yourself")
_ACTION_SPEC_BOUNDS = TorchRLName("action_spec", "map", "action_low, action_high", convert=_bounds,
                                  note="the spec's low / high bounds")
_SPEC_NOOP = TorchRLName("action_spec", "noop", "(shape from the actor)", accepts=lambda v: True,
                         note="read from the actor's output; accepted and unused")
_PG = (_ACTOR, _CRITIC, TorchRLName("entropy_coeff", "map", "entropy_coef"),
       TorchRLName("critic_coeff", "map", "critic_coef"),
       TorchRLName("entropy_bonus", "same", "entropy_bonus", note="True (default): loss_entropy exists, zero at coefficient 0"),
       TorchRLName("separate_losses", "noop", "(never shared)", accepts=_is(False),
                   note="an actor and critic sharing layers: detach the shared trunk in your critic"),
       _FUNCTIONAL, _REDUCTION,
       TorchRLName("normalize_advantage", "same", "normalize_advantage"),
       TorchRLName("loss_critic_type", "same", "loss_critic_type", note="default 'l2' (TorchRL: 'smooth_l1')"))

TABLES: dict[str, tuple[TorchRLName, ...]] = {
    "PPOLoss": (*_PG, TorchRLName("clip_epsilon", "same", "clip_epsilon"),
                TorchRLName("dtarg", "map", "kl_target", note="KLPENPPOLoss's target KL"),
                TorchRLName("beta", "map", "kl_coef", note="KLPENPPOLoss's initial coefficient")),
    "A2CLoss": _PG,
    "DQNLoss": (TorchRLName("value_network", "same", "value_network"), _DELAYS[2], _FUNCTIONAL, _REDUCTION,
                TorchRLName("action_space", "noop", "(from the value net's spec)", accepts=lambda v: True,
                            note="the action form comes from the QValueModule's spec")),
    "DDPGLoss": (_ACTOR, TorchRLName("value_network", "map", "qvalue"),
                 TorchRLName("delay_actor", "same", "delay_actor", note="False: the online actor picks the next action"),
                 _DELAYS[2], _FUNCTIONAL, _REDUCTION),
    "TD3Loss": (_ACTOR, _QVALUE, _ACTION_SPEC_BOUNDS,
                TorchRLName("bounds", "map", "action_low, action_high",
                            convert=lambda b: {"action_low": b[0], "action_high": b[1]}),
                *_DELAYS[:2], _FUNCTIONAL, _REDUCTION, TorchRLName("num_qvalue_nets", "same", "num_qvalue_nets")),
    "SACLoss": (_ACTOR, _QVALUE, _SPEC_NOOP, _SAC_DELAY_ACTOR, _DELAYS[1], _FUNCTIONAL, _REDUCTION,
                TorchRLName("value_network", "noop", "(SAC v2: no value net)", accepts=_is(None),
                            note="tdrl's SACLoss is SAC v2; a state-value network is IQLLoss's"),
                TorchRLName("delay_value", "noop", "(always)", accepts=_is(True), note=_DELAY),
                TorchRLName("alpha_init", "same", "alpha_init"), TorchRLName("fixed_alpha", "same", "fixed_alpha"),
                TorchRLName("min_alpha", "same", "min_alpha"), TorchRLName("max_alpha", "same", "max_alpha"),
                TorchRLName("target_entropy", "same", "target_entropy")),
    "DiscreteSACLoss": (_ACTOR, _QVALUE, _SPEC_NOOP, *_DELAYS[:2], _FUNCTIONAL, _REDUCTION,
                        TorchRLName("num_actions", "same", "num_actions")),
    "IQLLoss": (_ACTOR, _QVALUE, TorchRLName("value_network", "map", "value"), *_DELAYS, _FUNCTIONAL, _REDUCTION),
    "CQLLoss": (_ACTOR, _QVALUE, _ACTION_SPEC_BOUNDS, *_DELAYS[:2], _FUNCTIONAL, _REDUCTION),
    "TD3BCLoss": (_ACTOR, _QVALUE, _ACTION_SPEC_BOUNDS, *_DELAYS[:2], _FUNCTIONAL, _REDUCTION),
    "REDQLoss": (_ACTOR, _QVALUE, _SPEC_NOOP, *_DELAYS[:2], _FUNCTIONAL, _REDUCTION,
                 TorchRLName("sub_sample_len", "map", "subset_size")),
    "SoftUpdate": (TorchRLName("eps", "map", "tau", convert=_eps_to_tau, note="tau = 1 - eps"),),
    "HardUpdate": (TorchRLName("value_network_update_interval", "map", "update_interval"),),
    "Collector": (TorchRLName("create_env_fn", "map", "env"),
                  TorchRLName("create_env_kwargs", "refuse", "EnvCreator(fn, kwargs)",
                              note="pass env=EnvCreator(create_env_fn, create_env_kwargs)"),
                  TorchRLName("policy_device", "refuse", "device", note="one device for the policy and its outputs"),
                  TorchRLName("env_device", "refuse", "device", note="the env steps where it was built"),
                  TorchRLName("frames_per_batch", "same", "frames_per_batch"),
                  TorchRLName("total_frames", "same", "total_frames"),
                  TorchRLName("compile_policy", "noop", "(not compiled)", accepts=lambda v: not v,
                              note="False accepted; compile the policy yourself: torch.compile(policy)"),
                  TorchRLName("cudagraph_policy", "noop", "(no CUDA graph)", accepts=lambda v: not v,
                              note="False accepted; no CUDA-graph capture of the policy")),
    "ReplayBuffer": (TorchRLName("prefetch", "noop", "(sampled when asked)", accepts=lambda v: True,
                                 note="no background prefetch threads; sample() draws on call"),
                     TorchRLName("shared", "noop", "(one process)", accepts=_is(False),
                                 note="a buffer shared between processes: use MultiSyncCollector's batches"),
                     TorchRLName("pin_memory", "same", "pin_memory")),
    "MLP": (TorchRLName("activation_class", "map", "activation"),
            TorchRLName("activate_last_layer", "map", "activate_last"),
            TorchRLName("depth", "map", "num_cells", note="with an int num_cells: num_cells=(n,) * depth"),
            TorchRLName("device", "noop", "mlp.to(device)", accepts=_cpu_or_none,
                        note="build, then .to(device)")),
    "GAE": (TorchRLName("average_gae", "map", "average_advantage"),
            TorchRLName("device", "noop", "(the data's device)", accepts=lambda v: True,
                        note="computed where the batch lives"),
            TorchRLName("value_network", "same", "value_network")),
    "TD0": (TorchRLName("average_rewards", "refuse", "RewardScaling / VecNorm on the env",
                        note="normalise rewards with a transform"),
            TorchRLName("device", "noop", "(the data's device)", accepts=lambda v: True)),
    "TDLambda": (TorchRLName("device", "noop", "(the data's device)", accepts=lambda v: True),
                 TorchRLName("vectorized", "noop", "(always)", accepts=lambda v: True,
                             note="the scan is always vectorised")),
    "AdditiveGaussianModule": (TorchRLName("spec", "map", "low, high", convert=_noise_bounds,
                                           note="the action spec's bounds clip the noisy action"),
                               TorchRLName("mean", "noop", "(0)", accepts=_is(0.0)),
                               TorchRLName("std", "noop", "(1: scaled by sigma)", accepts=_is(1.0))),
    "OrnsteinUhlenbeckModule": (TorchRLName("spec", "map", "low, high", convert=_noise_bounds),),
    "EGreedyModule": (TorchRLName("spec", "map", "n_actions", note="an action spec (a Composite: its action entry) or a count"),
                      TorchRLName("device", "noop", "(the data's device)", accepts=lambda v: True,
                                  note="random actions are drawn where the action lives")),
    "ProbabilisticActor": (TorchRLName("module", "map", "params_module"),
                           TorchRLName("spec", "noop", "(the env checks actions)", accepts=lambda v: True,
                                       note="the env's action spec refuses out-of-spec actions"),
                           TorchRLName("safe", "noop", "(never projects)", accepts=_is(False),
                                       note="use a bounded distribution (TanhNormal) instead")),
    "TanhNormal": (TorchRLName("tanh_loc", "noop", "(False)", accepts=_is(False),
                               note="loc is used as given; squash it in the network if wanted"),
                   TorchRLName("upscale", "noop", "(none)", accepts=_is(5.0)),
                   TorchRLName("safe_tanh", "noop", "(always)", accepts=_is(True))),
}

DIFFERENCES: tuple[tuple[str, str], ...] = (
    ("`ClipPPOLoss` / `A2CLoss` default `loss_critic_type='smooth_l1'`",
     "`PPOLoss` / `A2CLoss` default `'l2'` (`0.5 * (v - target)**2`): pass `loss_critic_type='smooth_l1'` for TorchRL's"),
    ("`loss_function='l2'` / `loss_critic_type='l2'`: `(x - y)**2`",
     "`'l2'` is `0.5 * (x - y)**2` in every loss (the gradient is the TD error): the same Adam update, half the logged "
     "loss and gradient norm; pass `'mse'` for TorchRL's scale (e.g. under a grad-norm clip)"),
    ("`DQNLoss` default `loss_function='l2'`",
     "`DQNLoss` default `'smooth_l1'` (Huber: Nature DQN's clipped error); pass `loss_function='mse'` for TorchRL's default"),
    ("`REDQLoss`: the critic loss averaged over the N critics",
     "`REDQLoss`: `loss_qvalue` sums the N critics' mean losses (each critic's gradient as in SAC)"),
    ("`SoftUpdate(loss, eps=0.995)`", "`SoftUpdate(loss, tau=0.005)`; `eps=` is accepted and converted"),
    ("`KLPENPPOLoss(actor, critic, dtarg=..., beta=...)`", "`PPOLoss(actor, critic, clip_epsilon=None, kl_coef=..., kl_target=...)`"),
    ("`SACLoss(..., value_network=...)` (SAC v1)", "SAC v2 only; a state-value network is `IQLLoss`'s"),
    ("target networks made by `delay_*=True`", "always made; `delay_*=True` is accepted, `False` refused"),
    ("`Logger.log_metrics` with a tensor of several values writes them as a list",
     "their mean (a CSV column of numbers; TorchRL's SAC script logs each finished episode's return)"),
    ("`TimeMaxPool`: the window starts as zeros after a reset (a negative observation reads 0 "
     "until T steps are seen)", "the max over the observations seen since the reset; equal once the window is full"),
    ("`ActionDiscretizer` on one action dim: a `MultiCategorical` spec of shape `(1,)`",
     "a `Categorical` of shape `()` (the index a `QValueModule` writes); the values are TorchRL's "
     "(`sampling=` MEDIAN by default, LOW, HIGH; tdrl adds `'endpoints'`)"),
    ("`MultiStepTransform`: `(\"next\", done / terminated / truncated)` stay step t's, so a window "
     "that reaches a terminal step bootstraps from the terminal observation",
     "the done flags of the window's last step (`t + steps_to_next_obs - 1`), shifted with the "
     "observation: no bootstrap past a termination; `mask_key` accepted, unused (no padding here)"),
    ("`NextObservationDelta`: a delta beyond `delta_dtype`'s range is stored as inf; on a replay "
     "buffer without `in_keys`, or on a batch with neither the delta nor the next observation, it does nothing",
     "the same stored delta and rebuilt observation (tested); those cases are refused, naming the "
     "fix, as are integer `in_keys` (their difference would wrap)"),
)


# ------------------------------------------------------------------ translation


def translate(cls_name: str, kwargs: dict[str, Any], params: set[str] | None = None) -> dict[str, Any]:
    """``kwargs`` with TorchRL's keywords of ``cls_name`` turned into tdrl's (a new dict).

    ``params``: the class's own keywords; a TorchRL keyword that is also one of them is left
    alone. Raises ``TypeError`` naming both spellings when one setting is given twice, and
    ``ValueError`` for a refused keyword or a no-op keyword with a value that would matter."""
    rows = {r.torchrl: r for r in TABLES.get(cls_name, ())}
    out = dict(kwargs)
    given = {}
    for key in list(kwargs):
        row = rows.get(key)
        if row is None or row.kind == "same" or (params is not None and key in params and row.kind != "map"):
            continue
        value = out.pop(key)
        if row.kind == "refuse":
            raise ValueError(f"{cls_name}({key}=...) is TorchRL's spelling; tdrl: {row.tdrl}"
                             + (f" ({row.note})" if row.note else ""))
        if row.kind == "noop":
            if row.accepts is not None and not row.accepts(value):
                raise ValueError(f"{cls_name}({key}={value!r}) is not supported: {row.note or row.tdrl}")
            continue
        if key == "depth" and cls_name == "MLP":
            cells = out.get("num_cells", kwargs.get("num_cells"))
            if not isinstance(cells, int):
                raise ValueError(f"MLP(depth={value}) needs an int num_cells (TorchRL's pairing), got {cells!r}: "
                                 "pass num_cells=(n, n, ...) instead")
            out["num_cells"] = (cells,) * int(value)
            given["num_cells"] = key
            continue
        new = row.convert(value) if row.convert else {row.tdrl: value}
        for name, v in new.items():
            if name in kwargs or name in given:
                raise TypeError(f"{cls_name}: {key}= (TorchRL) and {given.get(name, name)}= both set {name}; pass one")
            out[name] = v
            given[name] = key
    if cls_name == "MLP" and isinstance(out.get("num_cells"), int) and "depth" not in kwargs:
        raise ValueError(f"MLP(num_cells={out['num_cells']}) without depth=: pass depth= (TorchRL) or a "
                         "sequence of hidden sizes, num_cells=(n, n)")
    return out


def accept_torchrl_names(cls: type) -> type:
    """Class decorator: ``cls.__init__`` also takes TorchRL's keywords from ``TABLES[cls.__name__]``."""
    name = cls.__name__
    if name not in TABLES:
        raise KeyError(f"no TorchRL table for {name}")
    init = cls.__init__
    params = set(inspect.signature(init).parameters) - {"self"}
    # the keywords that need translating (a TanhNormal is built at every policy step: the
    # common call, tdrl's own keywords only, costs one set test)
    peer = frozenset(r.torchrl for r in TABLES[name] if r.kind != "same") | ({"num_cells"} if name == "MLP" else set())

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if kwargs and not peer.isdisjoint(kwargs):
            kwargs = translate(name, kwargs, params)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def torchrl_table_markdown() -> str:
    """The README's tables: every TorchRL keyword accepted or refused, then the differences."""
    lines = ["| class | TorchRL keyword | tdrl | note |", "| --- | --- | --- | --- |"]
    for cls_name, rows in TABLES.items():
        for r in rows:
            what = {"map": f"`{r.tdrl}`", "same": "the same", "noop": f"accepted: {r.tdrl}",
                    "refuse": f"refused: use `{r.tdrl}`"}[r.kind]
            lines.append(f"| `{cls_name}` | `{r.torchrl}` | {what} | {r.note} |")
    lines += ["", "| TorchRL | tdrl (a deliberate difference) |", "| --- | --- |"]
    lines += [f"| {a} | {b} |" for a, b in DIFFERENCES]
    return "\n".join(lines) + "\n"


_MARKERS = ("<!-- torchrl-names:begin -->\n", "<!-- torchrl-names:end -->")


def write_readme_table(path: str) -> None:
    """Replace the text between the ``torchrl-names`` markers of ``path`` with
    :func:`torchrl_table_markdown` (``python -c "from tdrl.core.torchrl_names import
    write_readme_table as w; w('packages/core/README.md')"``)."""
    with open(path) as fh:
        text = fh.read()
    begin, end = text.index(_MARKERS[0]) + len(_MARKERS[0]), text.index(_MARKERS[1])
    with open(path, "w") as fh:
        fh.write(text[:begin] + torchrl_table_markdown() + text[end:])
