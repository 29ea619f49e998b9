"""Pure-torch GRU / LSTM over ``[N, T]`` with ``is_init`` resets: the reference semantics.

One layer, PyTorch's gate layout (``nn.GRU``: r, z, n; ``nn.LSTM``: i, f, g, o), batch first.
Before step ``t`` the state is zeroed on the rows where ``is_init[:, t]`` is True (a new
episode starts there), so several episodes can share a row; ``h0`` (``c0``) is the state
before ``t = 0``. This is the obvious loop, one cell step at a time, differentiated by
autograd: every other backend is tested against it. Stacked networks (one leading dim ``S``
on every tensor, as ``fused.py`` takes them) run through the same loop, network ``s`` on block ``s``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gru_reference", "lstm_reference"]


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    y = x @ w.transpose(-1, -2)
    return y if b is None else y + b.unsqueeze(-2) if b.dim() == 2 else y + b


def gru_reference(
    x: Tensor,
    h0: Tensor,
    is_init: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
) -> Tensor:
    """GRU over time with resets (see the module docstring): arguments and result as
    :func:`tdrl.kernels.gru_sequence`, with ``h0`` and a bool ``is_init`` required."""
    keep = (~is_init).to(x.dtype).unsqueeze(-1)
    h, outs = h0, []
    for t in range(x.shape[-2]):
        h = h * keep[..., t, :]
        ir, iz, in_ = _linear(x[..., t, :], weight_ih, bias_ih).chunk(3, -1)
        hr, hz, hn = _linear(h, weight_hh, bias_hh).chunk(3, -1)
        r = torch.sigmoid(ir + hr)
        z = torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        h = (1 - z) * n + z * h
        outs.append(h)
    return torch.stack(outs, -2) if outs else x.new_zeros(*x.shape[:-2], 0, h0.shape[-1])


def lstm_reference(
    x: Tensor,
    h0: Tensor,
    c0: Tensor,
    is_init: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """LSTM over time with resets (both ``h`` and ``c`` are zeroed where ``is_init``):
    arguments and result as :func:`tdrl.kernels.lstm_sequence`, with ``h0``, ``c0`` and a bool
    ``is_init`` required."""
    keep = (~is_init).to(x.dtype).unsqueeze(-1)
    h, c, hs, cs = h0, c0, [], []
    for t in range(x.shape[-2]):
        h, c = h * keep[..., t, :], c * keep[..., t, :]
        gates = _linear(x[..., t, :], weight_ih, bias_ih) + _linear(h, weight_hh, bias_hh)
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
        cs.append(c)
    if not hs:
        empty = x.new_zeros(*x.shape[:-2], 0, h0.shape[-1])
        return empty, empty.clone()
    return torch.stack(hs, -2), torch.stack(cs, -2)
