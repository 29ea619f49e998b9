"""Value estimators as pure functions over ``[..., T, 1]`` tensors.

Shape contract (as in TorchRL's ``objectives/value/functional.py``): every tensor is
``[*B, T, 1]``, time is dim ``-2``, done flags are ``torch.bool``. ``value[t]`` is
``V(s_t)`` and ``next_value[t]`` is ``V(s_{t+1})`` (the value of the observation under
``"next"``), so a trajectory cut by the end of a batch or by a truncation still
bootstraps correctly.

Done semantics:

* ``terminated[t]`` -- ``s_{t+1}`` is terminal: its value is zero (no bootstrap);
* ``done[t]`` -- the episode ended at ``t`` (terminated *or* truncated): the recursion
  does not look past ``t``; on truncation it bootstraps from ``next_value[t]``.

The reverse scans ``y_t = x_t + c * (1 - done_t) * y_{t+1}`` are the hot path; they are
``tdrl.kernels``' (a dependency of core; torch-only, Triton optional): ``gae`` and
``discounted_cumsum`` call its ops, which dispatch to Triton on CUDA and to a blocked
pure-torch scan (``~2 sqrt(T)`` vectorised steps instead of ``T``) elsewhere;
``backend="torch"`` forces that torch scan.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache
from typing import Callable

import torch
from torch import Tensor

import tdrl.kernels as _kernels

__all__ = [
    "discounted_cumsum",
    "gae",
    "td0_return",
    "td0_advantage",
    "td_lambda_return",
    "vtrace",
    "kernels_available",
]

_BACKENDS = ("auto", "torch", "kernels")


@lru_cache(maxsize=None)
def kernel_op(name: str) -> Callable | None:
    """``tdrl.kernels.<name>``, or ``None`` if this version of the kernels lacks it."""
    return getattr(_kernels, name, None)


def kernels_available(op: str = "gae") -> bool:
    """Whether ``tdrl.kernels`` (a dependency of core) provides ``op``."""
    return kernel_op(op) is not None


def _select(name: str, backend: str) -> tuple[Callable, object]:
    """The kernels op and the context to call it in.

    ``auto`` / ``kernels``: the op's own dispatch (Triton on CUDA, its torch scan elsewhere);
    ``torch``: the torch scan, on any device.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}.")
    op = kernel_op(name)
    if op is None:  # pragma: no cover - a kernels release without the op
        raise ImportError(f"tdrl.kernels has no {name}: reinstall packages/kernels with packages/core.")
    return op, (_kernels.use_backend("torch") if backend == "torch" else nullcontext())


def _check_unit(name: str, value: float | Tensor) -> None:
    """Refuse a discount or trace decay outside ``[0, 1]`` (NaN included); tensors are
    checked on the CPU only (elsewhere the check would synchronise the device)."""
    if isinstance(value, Tensor):
        if value.device.type != "cpu" or value.numel() == 0:
            return
        lo, hi = float(value.min()), float(value.max())
    else:
        lo = hi = float(value)
    if not (0.0 <= lo and hi <= 1.0):
        shown = value if not isinstance(value, Tensor) else f"values in [{lo}, {hi}]"
        raise ValueError(f"{name} must lie in [0, 1], got {shown}.")


def _check_time_shape(name: str, x: Tensor, ref: Tensor | None = None) -> None:
    if x.dim() < 2 or x.shape[-1] != 1:
        raise ValueError(
            f"{name} must have shape [..., T, 1] (time at dim -2, trailing dim 1), "
            f"got {tuple(x.shape)}."
        )
    if ref is not None and x.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but must match {tuple(ref.shape)}."
        )


# --------------------------------------------------------------------------------------
# The scan: y_t = x_t + coef * (1 - done_t) * y_{t+1}, y_T = 0
# --------------------------------------------------------------------------------------
def _scan_loop(x: Tensor, coef: Tensor | float, done: Tensor | None) -> Tensor:
    """Reference reverse scan, one python step per time step (any ``coef`` tensor)."""
    T = x.shape[-2]
    c = torch.as_tensor(coef, dtype=x.dtype, device=x.device).expand_as(x)
    if done is not None:
        c = c * (~done).to(x.dtype)
    out = torch.empty_like(x)
    acc = torch.zeros_like(x[..., 0, :])
    for t in range(T - 1, -1, -1):
        acc = x[..., t, :] + c[..., t, :] * acc
        out[..., t, :] = acc
    return out


# --------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------
def discounted_cumsum(
    x: Tensor, gamma: float, done: Tensor | None = None, *, backend: str = "auto"
) -> Tensor:
    """Reverse discounted sum over time: ``y_t = x_t + gamma * (1 - done_t) * y_{t+1}``.

    Args:
        x: ``[..., T, 1]`` values (e.g. rewards).
        gamma: discount, a python float.
        done: optional ``[..., T, 1]`` bool; the sum does not run past a done step.
        backend: ``"auto"`` or ``"kernels"`` (the kernels op's own dispatch) or
            ``"torch"`` (its torch scan).

    Returns:
        ``[..., T, 1]`` tensor, same dtype as ``x``.
    """
    _check_time_shape("x", x)
    if done is not None:
        _check_time_shape("done", done, x)
    op, context = _select("discounted_cumsum", backend)
    if x.shape[-2] == 0:
        return x.clone()
    with context:
        return op(x, float(gamma), done=done)


def td0_return(
    reward: Tensor, next_value: Tensor, terminated: Tensor, gamma: float
) -> Tensor:
    """One-step TD target ``r_t + gamma * (1 - terminated_t) * V(s_{t+1})``.

    Args:
        reward, next_value: ``[..., T, 1]`` float.
        terminated: ``[..., T, 1]`` bool.
        gamma: discount.

    Returns:
        ``[..., T, 1]`` value target.
    """
    _check_time_shape("reward", reward)
    _check_time_shape("next_value", next_value, reward)
    _check_time_shape("terminated", terminated, reward)
    # where, not a product with 0: a NaN next value after a terminal step (compact batches)
    # must not reach the target
    return reward + gamma * torch.where(terminated.bool(), torch.zeros_like(next_value), next_value)


def td0_advantage(
    reward: Tensor, value: Tensor, next_value: Tensor, terminated: Tensor, gamma: float
) -> Tensor:
    """TD error ``r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)``, ``[..., T, 1]``."""
    return td0_return(reward, next_value, terminated, gamma) - value


def gae(
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float,
    lmbda: float,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al., 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)`` and
    ``A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}``.

    Args:
        reward, value, next_value: ``[..., T, 1]`` float.
        done, terminated: ``[..., T, 1]`` bool. ``terminated`` stops bootstrapping,
            ``done`` (terminated or truncated) stops the lambda trace.
        gamma: discount in ``[0, 1]``. lmbda: GAE lambda in ``[0, 1]``.
        backend: ``"auto"``, ``"torch"`` or ``"kernels"`` (see :func:`discounted_cumsum`).

    Returns:
        ``(advantage, value_target)``, both ``[..., T, 1]``, with
        ``value_target = advantage + value`` (empty for ``T = 0``).

    Raises:
        ValueError: a shape is not ``[..., T, 1]`` or ``gamma`` / ``lmbda`` is outside ``[0, 1]``.
    """
    _check_time_shape("reward", reward)
    for name, t in (
        ("value", value),
        ("next_value", next_value),
        ("done", done),
        ("terminated", terminated),
    ):
        _check_time_shape(name, t, reward)
    _check_unit("gamma", gamma)
    _check_unit("lmbda", lmbda)
    op, context = _select("gae", backend)
    if reward.shape[-2] == 0:  # no time steps, whatever the backend
        return reward.clone(), value.clone()
    with context:
        return op(reward, value, next_value, done.bool(), terminated.bool(), gamma, lmbda)


def td_lambda_return(
    reward: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    gamma: float,
    lmbda: float,
    *,
    backend: str = "auto",
) -> Tensor:
    """TD(lambda) return (Sutton & Barto, 2018, ch. 12).

    ``G_t = r_t + gamma * (1 - terminated_t) * ((1 - l_t) V(s_{t+1}) + l_t G_{t+1})``
    with ``l_t = lmbda * (1 - done_t)``, and ``l_{T-1} = 0`` (the last step bootstraps
    from ``next_value``). It only uses ``next_value``, so it equals ``value + GAE`` when
    ``next_value[t] == value[t + 1]``.

    Args:
        reward, next_value: ``[..., T, 1]`` float.
        done, terminated: ``[..., T, 1]`` bool.
        gamma, lmbda: discount and trace decay.
        backend: see :func:`discounted_cumsum`.

    Returns:
        ``[..., T, 1]`` lambda-returns.
    """
    _check_time_shape("reward", reward)
    for name, t in (("next_value", next_value), ("done", done), ("terminated", terminated)):
        _check_time_shape(name, t, reward)
    done = done.bool().clone()
    done[..., -1, :] = True
    not_term = (~terminated.bool()).to(reward.dtype)
    not_done = (~done).to(reward.dtype)
    # G_t = x_t + gamma * lmbda * (1 - done_t) * G_{t+1}   (terminated implies done)
    x = reward + gamma * not_term * (1.0 - lmbda * not_done) * next_value
    return discounted_cumsum(x, gamma * lmbda, done, backend=backend)


def vtrace(
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    done: Tensor,
    terminated: Tensor,
    log_rho: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lmbda: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace off-policy targets (Espeholt et al., 2018, IMPALA, arXiv:1802.01561).

    With ``rho_t = min(rho_bar, pi/mu)``, ``c_t = lmbda * min(c_bar, pi/mu)``:
    ``v_t - V_t = rho_t delta_t + gamma (1 - done_t) c_t (v_{t+1} - V_{t+1})`` and
    the policy-gradient advantage ``rho_t (r_t + gamma (1 - terminated_t) v_{t+1} - V_t)``
    where ``v_{t+1}`` is replaced by ``V(s_{t+1})`` after a done step or at the end.

    Args:
        reward, value, next_value: ``[..., T, 1]`` float.
        done, terminated: ``[..., T, 1]`` bool.
        log_rho: ``[..., T, 1]`` ``log pi(a_t|s_t) - log mu(a_t|s_t)`` (target minus
            behaviour log-probability); treated as a constant (detached).
        gamma: discount. rho_bar, c_bar: truncation levels. lmbda: trace decay.

    Returns:
        ``(advantage, value_target)``, both ``[..., T, 1]``; ``value_target`` is ``v_s``.
    """
    _check_time_shape("reward", reward)
    for name, t in (
        ("value", value),
        ("next_value", next_value),
        ("done", done),
        ("terminated", terminated),
        ("log_rho", log_rho),
    ):
        _check_time_shape(name, t, reward)
    ratio = log_rho.detach().exp()
    rho = ratio.clamp(max=rho_bar)
    c = lmbda * ratio.clamp(max=c_bar)
    delta = rho * td0_advantage(reward, value, next_value, terminated, gamma)
    err = _scan_loop(delta, gamma * c, done.bool())  # v_s - V, coefficient varies
    vs = value + err
    # v_{t+1}: the next step's v_s inside an episode, V(s_{t+1}) after done / at the end.
    next_err = torch.zeros_like(err)
    next_err[..., :-1, :] = err[..., 1:, :]
    next_err = next_err * (~done.bool()).to(err.dtype)
    vs_next = next_value + next_err
    not_term = (~terminated.bool()).to(reward.dtype)
    advantage = rho * (reward + gamma * not_term * vs_next - value)
    return advantage, vs
