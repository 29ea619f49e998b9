"""Value normalisation: running statistics of value targets (MAPPO's ``ValueNorm``) and
PopArt (van Hasselt et al., 2016, arXiv:1602.07714).

The critic learns normalised values; targets are normalised before the critic loss and the
critic's outputs are de-normalised before computing advantages (Yu et al., 2021,
arXiv:2103.01955, section 4.1).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ValueNorm", "PopArt"]


class ValueNorm(nn.Module):
    """Running mean and variance of value targets, per output feature.

    Args:
        shape: feature shape (trailing dims of the targets), default ``(1,)``.
        beta: ``None`` for exact statistics over every target seen so far; a float in
            ``(0, 1)`` for exponential moving averages with bias correction (MAPPO uses
            ``0.99999``).
        epsilon: floor of the variance.

    ``update(x)`` reads ``x`` ``[..., *shape]``; ``normalize`` / ``denormalize`` map
    ``[..., *shape]`` tensors.
    """

    def __init__(self, shape: int | tuple = (1,), beta: float | None = None, epsilon: float = 1e-5) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if beta is not None and not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1) or None, got {beta}.")
        self.shape, self.beta, self.epsilon = shape, beta, epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("mean_sq", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("weight", torch.zeros((), dtype=torch.float64))

    def _flat(self, x: Tensor) -> Tensor:
        k = len(self.shape)
        if tuple(x.shape[x.ndim - k :]) != self.shape:
            raise ValueError(f"{type(self).__name__} expects [..., {self.shape}], got {tuple(x.shape)}.")
        return x.detach().reshape(-1, *self.shape).double()

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold a batch of targets ``[..., *shape]`` into the statistics."""
        x = self._flat(x)
        n = x.shape[0]
        if n == 0:
            return
        bm, bsq = x.mean(0), x.pow(2).mean(0)
        if self.beta is None:  # exact running averages weighted by counts
            w = self.weight + n
            self.mean.mul_(self.weight / w).add_(bm * (n / w))
            self.mean_sq.mul_(self.weight / w).add_(bsq * (n / w))
            self.weight.copy_(w)
        else:
            b = self.beta
            self.mean.mul_(b).add_(bm * (1 - b))
            self.mean_sq.mul_(b).add_(bsq * (1 - b))
            self.weight.mul_(b).add_(1 - b)

    def stats(self) -> tuple[Tensor, Tensor]:
        """``(mean, std)`` of the targets seen (bias-corrected for EMAs), float64."""
        if self.beta is None:
            mean, mean_sq = self.mean, self.mean_sq
        else:
            debias = self.weight.clamp_min(self.epsilon)
            mean, mean_sq = self.mean / debias, self.mean_sq / debias
        var = (mean_sq - mean.pow(2)).clamp_min(self.epsilon)
        if float(self.weight) == 0.0:
            return torch.zeros_like(mean), torch.ones_like(mean)
        return mean.clone(), var.sqrt()

    def normalize(self, x: Tensor) -> Tensor:
        mean, std = self.stats()
        return (x - mean.to(x.dtype)) / std.to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        mean, std = self.stats()
        return x * std.to(x.dtype) + mean.to(x.dtype)


class PopArt(ValueNorm):
    """PopArt: a linear value head whose weights are rescaled whenever the statistics change,
    so its de-normalised outputs are Preserved while the targets are Adaptively Rescaled.

    Args:
        in_features: input size of the head.
        out_features: number of values (default 1).
        beta, epsilon: see :class:`ValueNorm`.

    ``forward(h)`` ``[..., in_features]`` -> normalised values ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int = 1, beta: float | None = None,
                 epsilon: float = 1e-5) -> None:
        super().__init__((out_features,), beta, epsilon)
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, h: Tensor) -> Tensor:
        return self.linear(h)

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Update the statistics, then rescale the head to keep de-normalised outputs."""
        old_mean, old_std = self.stats()
        super().update(x)
        new_mean, new_std = self.stats()
        w, b = self.linear.weight, self.linear.bias
        scale = (old_std / new_std).to(w.dtype)
        w.mul_(scale.unsqueeze(-1))
        b.copy_(((old_std * b.double() + old_mean - new_mean) / new_std).to(b.dtype))
