"""Plain ``nn.Module`` networks: MLP and a small conv net (no TensorDict logic here)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from tdrl.core.torchrl_names import accept_torchrl_names

__all__ = ["MLP", "ConvNet"]


def _layer_init(layer: nn.Linear | nn.Conv2d, gain: float) -> None:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)


@accept_torchrl_names
class MLP(nn.Sequential):
    """Multi-layer perceptron; several inputs are concatenated along the last dim.

    Args:
        in_features: input size (``None``: inferred on the first call with ``LazyLinear``).
        out_features: output size (an int, or a shape such as ``(n_agents, 2)`` that the
            output is reshaped to).
        num_cells: hidden sizes, e.g. ``(64, 64)``.
        activation: activation class (default ``nn.Tanh``).
        activate_last: apply the activation after the last layer too.
        orthogonal_init: orthogonal weights (gain sqrt(2) hidden, ``last_gain`` output),
            zero biases, as in CleanRL/PPO implementations.
        last_gain: gain of the output layer's orthogonal init.

    Shapes: ``[*B, in_features]`` -> ``[*B, *out_features]``.
    """

    def __init__(
        self,
        in_features: int | None = None,
        out_features: int | Sequence[int] | None = None,
        num_cells: Sequence[int] = (64, 64),
        activation: Callable[[], nn.Module] = nn.Tanh,
        activate_last: bool = False,
        orthogonal_init: bool = False,
        last_gain: float = 1.0,
    ) -> None:
        if out_features is None:
            raise TypeError("MLP needs out_features (an int or an output shape)")
        out_shape = (out_features,) if isinstance(out_features, int) else tuple(out_features)
        out_numel = 1
        for d in out_shape:
            out_numel *= d
        sizes = [*num_cells, out_numel]
        layers: list[nn.Module] = []
        prev = in_features
        for i, size in enumerate(sizes):
            linear = nn.Linear(prev, size) if prev is not None else nn.LazyLinear(size)
            last = i == len(sizes) - 1
            if orthogonal_init and prev is not None:
                _layer_init(linear, last_gain if last else 2**0.5)
            layers.append(linear)
            if not last or activate_last:
                layers.append(activation())
            prev = size
        super().__init__(*layers)
        self.out_shape = out_shape

    def forward(self, *inputs: Tensor) -> Tensor:  # type: ignore[override]
        x = inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=-1)
        out = super().forward(x)
        if len(self.out_shape) > 1:
            out = out.reshape(*out.shape[:-1], *self.out_shape)
        return out


class ConvNet(nn.Module):
    """Conv stack + flatten (Nature-DQN by default) for image observations.

    Args:
        in_channels: input channels.
        channels, kernel_sizes, strides: one entry per conv layer.
        activation: activation class (default ``nn.ReLU``).
        out_features: optional linear layer after flattening (``LazyLinear``).

    Shapes: ``[*B, C, H, W]`` -> ``[*B, F]`` (any number of leading batch dims); uint8
    input is scaled to ``[0, 1]``.
    """

    def __init__(
        self,
        in_channels: int,
        channels: Sequence[int] = (32, 64, 64),
        kernel_sizes: Sequence[int] = (8, 4, 3),
        strides: Sequence[int] = (4, 2, 1),
        activation: Callable[[], nn.Module] = nn.ReLU,
        out_features: int | None = None,
    ) -> None:
        super().__init__()
        if not len(channels) == len(kernel_sizes) == len(strides):
            raise ValueError(
                "channels, kernel_sizes and strides need one entry per layer, got lengths "
                f"{len(channels)}, {len(kernel_sizes)}, {len(strides)}."
            )
        layers: list[nn.Module] = []
        prev = in_channels
        for c, k, s in zip(channels, kernel_sizes, strides):
            layers += [nn.Conv2d(prev, c, k, s), activation()]
            prev = c
        layers.append(nn.Flatten())
        if out_features is not None:
            layers += [nn.LazyLinear(out_features), activation()]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 3:
            raise ValueError(f"ConvNet expects [*B, C, H, W] input, got {tuple(x.shape)}.")
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        batch = x.shape[:-3]
        out = self.net(x.reshape(-1, *x.shape[-3:]))
        return out.reshape(*batch, out.shape[-1])
