"""GRU / LSTM TensorDict modules with episode resets (``is_init``).

Two modes, as in TorchRL:

* step mode (default, collection): the input is one step ``[*B, F]``; the hidden state is
  read from the root (``"recurrent_state"`` for the GRU, ``"recurrent_state_h"`` /
  ``"recurrent_state_c"`` for the LSTM, each ``[*B, num_layers, H]``; zeros if absent) and
  the new state is written under ``"next"`` so that the collector carries it to the next
  step (the env must keep the entries a policy wrote under ``"next"``, as TorchRL's does).
* recurrent mode (``set_recurrent_mode(True)``, training): the input is a rollout
  ``[*B, T, F]``; the state stored at ``t = 0`` starts the sequence and the state is reset
  to zero wherever ``is_init[..., t]`` is True, so several episodes can share a row.

In both modes the state is zeroed where ``is_init`` is True before the step is taken.
In step mode a missing state is taken as zeros and written at the root, so that all steps
of a collected batch carry the same keys (no ``TensorDictPrimer`` transform is needed).
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.values._utils import NestedKey, require

__all__ = ["GRUModule", "LSTMModule"]


def _next(key: NestedKey) -> tuple:
    return (K.NEXT, *((key,) if isinstance(key, str) else tuple(key)))


class _RecurrentModule(TensorDictModuleBase):
    rnn: nn.GRU | nn.LSTM
    state_keys: tuple[NestedKey, ...]

    def __init__(self, in_key: NestedKey, out_key: NestedKey, is_init_key: NestedKey) -> None:
        super().__init__()
        self.in_key, self.out_key, self.is_init_key = in_key, out_key, is_init_key
        self.recurrent_mode = False

    def _set_keys(self) -> None:
        self.in_keys = [self.in_key, self.is_init_key, *self.state_keys]
        self.out_keys = [self.out_key, *(_next(k) for k in self.state_keys)]

    def set_recurrent_mode(self, mode: bool = True) -> "_RecurrentModule":
        """A copy (sharing parameters) that expects ``[*B, T, F]`` rollouts when ``mode``."""
        other = copy.copy(self)
        other._modules = dict(self._modules)
        other.recurrent_mode = mode
        return other

    def initial_state(self, batch_shape: tuple[int, ...], device=None) -> dict[str, Tensor]:
        """Zero states ``{key: [*batch_shape, num_layers, hidden]}`` to seed a rollout."""
        shape = (*batch_shape, self.rnn.num_layers, self.rnn.hidden_size)
        return {k: torch.zeros(shape, device=device) for k in self.state_keys}

    # state helpers: tuple of tensors [L, N, H] ----------------------------------------
    def _pack(self, states: tuple[Tensor, ...]):
        return states[0] if len(states) == 1 else states

    def _unpack(self, hidden) -> tuple[Tensor, ...]:
        return (hidden,) if isinstance(hidden, Tensor) else tuple(hidden)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        name = type(self).__name__
        x = require(td, self.in_key, name)
        n_time = 1 if not self.recurrent_mode else td.shape[-1] if td.batch_dims else 0
        if self.recurrent_mode and td.batch_dims < 1:
            raise ValueError(f"{name} in recurrent mode needs a [*B, T] TensorDict.")
        batch = x.shape[:-1] if not self.recurrent_mode else x.shape[:-2]
        N = batch.numel()
        xs = x.reshape(N, n_time, x.shape[-1])
        L, H = self.rnn.num_layers, self.rnn.hidden_size
        states = []
        for key in self.state_keys:
            s = td.get(key, None)
            if s is None:
                s0 = torch.zeros(N, L, H, dtype=x.dtype, device=x.device)
                if not self.recurrent_mode:
                    # the first step of a rollout: record the (zero) state at the root so
                    # that every step of a batch has the same keys (no primer needed)
                    td.set(key, s0.reshape(*batch, L, H))
            else:
                s0 = (s[..., 0, :, :] if self.recurrent_mode else s).reshape(N, L, H)
            states.append(s0.transpose(0, 1).contiguous())  # [L, N, H]
        is_init = td.get(self.is_init_key, None)
        if is_init is None:
            init = torch.zeros(N, n_time, dtype=torch.bool, device=x.device)
        else:
            init = is_init.bool().reshape(N, n_time)
        # fast path: GRU with one layer and no reset after t=0 -> one cuDNN-style call
        if (
            isinstance(self.rnn, nn.GRU)
            and L == 1
            and not bool(init[:, 1:].any())
        ):
            h0 = states[0].masked_fill(init[:, 0].view(1, N, 1), 0.0)
            out, _ = self.rnn(xs, h0)
            per_step = [out.unsqueeze(2)]  # [N, T, 1, H]
        else:
            outs, per_step_lists = [], [[] for _ in states]
            hidden = tuple(states)
            for t in range(n_time):
                keep = (~init[:, t]).view(1, N, 1).to(x.dtype)
                hidden = tuple(h * keep for h in hidden)
                o, new = self.rnn(xs[:, t : t + 1], self._pack(hidden))
                hidden = self._unpack(new)
                outs.append(o)
                for lst, h in zip(per_step_lists, hidden):
                    lst.append(h.transpose(0, 1))  # [N, L, H]
            out = torch.cat(outs, dim=1)
            per_step = [torch.stack(lst, dim=1) for lst in per_step_lists]  # [N, T, L, H]
        if self.recurrent_mode:
            td.set(self.out_key, out.reshape(*batch, n_time, H))
            for key, s in zip(self.state_keys, per_step):
                td.set(_next(key), s.reshape(*batch, n_time, L, H))
        else:
            td.set(self.out_key, out.reshape(*batch, H))
            for key, s in zip(self.state_keys, per_step):
                td.set(_next(key), s.reshape(*batch, L, H))
        return td


class GRUModule(_RecurrentModule):
    """GRU over a TensorDict with ``is_init`` resets; state key ``"recurrent_state"``.

    Args:
        input_size, hidden_size, num_layers: as ``nn.GRU``.
        in_key: input features (default ``"embed"``). out_key: output (``"features"``).
        is_init_key: default ``"is_init"``. state_key: default ``"recurrent_state"``.

    Shapes: step mode ``[*B, F] -> [*B, H]``; recurrent mode ``[*B, T, F] -> [*B, T, H]``;
    state ``[*B(, T), num_layers, H]``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        in_key: NestedKey = "embed",
        out_key: NestedKey = "features",
        is_init_key: NestedKey = K.IS_INIT,
        state_key: NestedKey = "recurrent_state",
    ) -> None:
        super().__init__(in_key, out_key, is_init_key)
        self.rnn = nn.GRU(input_size, hidden_size, num_layers, batch_first=True)
        self.state_keys = (state_key,)
        self._set_keys()


class LSTMModule(_RecurrentModule):
    """LSTM over a TensorDict with ``is_init`` resets; state keys ``"recurrent_state_h"``
    and ``"recurrent_state_c"`` (same arguments and shapes as :class:`GRUModule`)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        in_key: NestedKey = "embed",
        out_key: NestedKey = "features",
        is_init_key: NestedKey = K.IS_INIT,
        state_keys: tuple[NestedKey, NestedKey] = ("recurrent_state_h", "recurrent_state_c"),
    ) -> None:
        super().__init__(in_key, out_key, is_init_key)
        self.rnn = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.state_keys = tuple(state_keys)
        self._set_keys()
