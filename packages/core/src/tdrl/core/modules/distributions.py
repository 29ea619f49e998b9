"""Action distributions with a ``deterministic_sample`` (read by tensordict's
``InteractionType.DETERMINISTIC``): independent Normal, TanhNormal, masked categorical and
one-hot categorical.
"""

from __future__ import annotations

import math

import torch
import torch.distributions as D
from torch import Tensor
from torch.nn import functional as F
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["IndependentNormal", "TanhNormal", "MaskedCategorical", "OneHotCategorical"]


class IndependentNormal(D.Independent):
    """Diagonal Gaussian over the last ``event_dims`` dims; deterministic sample = ``loc``.

    Args:
        loc, scale: ``[*B, *event]`` tensors.
        event_dims: number of trailing dims summed in ``log_prob`` (default 1).
    """

    def __init__(
        self, loc: Tensor, scale: Tensor, event_dims: int = 1, validate_args: bool | None = False
    ) -> None:
        # no argument validation by default: it costs a device sync per call
        super().__init__(
            D.Normal(loc, scale, validate_args=validate_args), event_dims,
            validate_args=validate_args,
        )

    @property
    def deterministic_sample(self) -> Tensor:
        return self.base_dist.loc


def _log1m_tanh_sq(u: Tensor) -> Tensor:
    """``log(1 - tanh(u)^2)`` computed stably as ``2 * (log 2 - u - softplus(-2u))``."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


@accept_torchrl_names
class TanhNormal(D.Distribution):
    """``a = low + (high - low) * (tanh(u) + 1) / 2`` with ``u ~ Normal(loc, scale)``.

    ``log_prob`` uses the stable ``log(1 - tanh(u)^2)``; for the sample most recently drawn
    it reuses the pre-tanh ``u`` instead of ``atanh(a)`` (which saturates near the
    bounds). ``rsample_with_log_prob`` returns both at once. The deterministic sample (the
    mode of the pre-tanh Gaussian, squashed) is ``tanh(loc)`` scaled to the bounds.

    Args:
        loc, scale: ``[*B, *event]``.
        low, high: action bounds (floats or tensors broadcastable to the event shape).
        event_dims: number of trailing dims that form one action (default 1).
    """

    arg_constraints = {"loc": D.constraints.real, "scale": D.constraints.positive}
    has_rsample = True

    def __init__(
        self,
        loc: Tensor,
        scale: Tensor,
        low: float | Tensor = -1.0,
        high: float | Tensor = 1.0,
        event_dims: int = 1,
        validate_args: bool | None = False,
    ) -> None:
        self.base = D.Normal(loc, scale, validate_args=validate_args)
        self.loc, self.scale = loc, scale
        low = torch.as_tensor(low, dtype=loc.dtype, device=loc.device)
        high = torch.as_tensor(high, dtype=loc.dtype, device=loc.device)
        if bool((high <= low).any()):
            raise ValueError(f"TanhNormal needs high > low, got low={low}, high={high}.")
        self.low, self.high = low, high
        self._half = (high - low) / 2.0
        self._mid = (high + low) / 2.0
        self.event_dims = event_dims
        shape = loc.shape
        batch_shape = shape[: len(shape) - event_dims]
        event_shape = shape[len(shape) - event_dims :]
        self._cache: tuple[Tensor, Tensor] | None = None
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def _squash(self, u: Tensor) -> Tensor:
        return self._mid + self._half * torch.tanh(u)

    def _sum_event(self, x: Tensor) -> Tensor:
        return x.sum(tuple(range(-self.event_dims, 0))) if self.event_dims else x

    def _log_prob_u(self, u: Tensor) -> Tensor:
        lp = self.base.log_prob(u) - _log1m_tanh_sq(u) - torch.log(self._half)
        return self._sum_event(lp)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        u = self.base.rsample(sample_shape)
        a = self._squash(u)
        self._cache = (a, u)
        return a

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample_with_log_prob(
        self, sample_shape: torch.Size = torch.Size()
    ) -> tuple[Tensor, Tensor]:
        """A reparameterised sample ``[*S, *B, *E]`` and its log-prob ``[*S, *B]``."""
        u = self.base.rsample(sample_shape)
        return self._squash(u), self._log_prob_u(u)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._cache is not None and value is self._cache[0]:
            return self._log_prob_u(self._cache[1])
        y = ((value - self._mid) / self._half).clamp(-1.0, 1.0)
        eps = torch.finfo(y.dtype).eps
        u = torch.atanh(y.clamp(-1.0 + eps, 1.0 - eps))
        return self._log_prob_u(u)

    @property
    def deterministic_sample(self) -> Tensor:
        return self._squash(self.loc)

    @property
    def mode(self) -> Tensor:
        return self.deterministic_sample

    @property
    def mean(self) -> Tensor:  # no closed form; tanh of the mean is what users expect
        return self.deterministic_sample

    @property
    def support(self) -> D.constraints.Constraint:
        return D.constraints.interval(self.low, self.high)

    def entropy(self) -> Tensor:
        raise NotImplementedError(
            "TanhNormal has no closed-form entropy; use -log_prob of a sample "
            "(the losses do this automatically)."
        )


def _mask_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return logits
    if mask.shape != logits.shape:
        raise ValueError(
            f"action_mask has shape {tuple(mask.shape)}, expected the logits' shape "
            f"{tuple(logits.shape)} ([*B, n_actions], True = allowed)."
        )
    if not bool(mask.any(-1).all()):
        raise ValueError("action_mask has a row with no allowed action.")
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)


def _masked_logits(who: str, logits: Tensor | None, probs: Tensor | None,
                   mask: Tensor | None) -> Tensor:
    """The logits of a categorical given ``logits`` or ``probs`` (``log`` of probs clamped
    at the dtype's smallest normal), with ``mask``'s disallowed actions set to the minimum."""
    if logits is None:
        if probs is None:
            raise ValueError(f"{who} needs logits or probs.")
        logits = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return _mask_logits(logits, mask)


class _MaskedInit:
    """The constructor of both masked categoricals (before torch's in the MRO): ``logits`` or
    ``probs`` and an optional ``mask``, kept as ``self.mask``."""

    def __init__(
        self,
        logits: Tensor | None = None,
        probs: Tensor | None = None,
        mask: Tensor | None = None,
        validate_args: bool | None = False,
    ) -> None:
        self.mask = mask
        super().__init__(logits=_masked_logits(type(self).__name__, logits, probs, mask),
                         validate_args=validate_args)


class MaskedCategorical(_MaskedInit, D.Categorical):
    """Categorical over ``n`` actions where ``mask == False`` actions have zero probability.

    Args:
        logits: ``[*B, n]`` (or ``probs``).
        mask: optional ``[*B, n]`` bool, True where the action is allowed.

    Samples are int64 ``[*B]``; ``deterministic_sample`` is the most likely allowed action.
    """

    @property
    def deterministic_sample(self) -> Tensor:
        return self.logits.argmax(-1)


class OneHotCategorical(_MaskedInit, D.OneHotCategorical):
    """One-hot categorical with an optional action mask; samples are float one-hot ``[*B, n]``.

    Args:
        logits: ``[*B, n]`` (or ``probs``). mask: optional ``[*B, n]`` bool.
    """

    @property
    def deterministic_sample(self) -> Tensor:
        probs = self.logits
        return F.one_hot(probs.argmax(-1), probs.shape[-1]).to(probs.dtype)
