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
The time loop is ``tdrl.kernels.gru_sequence`` / ``lstm_sequence`` (one layer at a time;
the kernels are a dependency of core): Triton on CUDA, a fused torch path with hand-written
BPTT on the CPU, its step-by-step reference under ``TDRL_KERNELS=torch``. A kernels release
without the op falls back to ``torch.nn``'s own GRU / LSTM stepped one step at a time.
In step mode a missing state is taken as zeros and written at the root, so that all steps
of a collected batch carry the same keys (no ``TensorDictPrimer`` transform is needed).

:func:`rnn_layers` is the layer loop on plain tensors, given the parameters by name: the modules
here call it with their ``nn.GRU`` / ``nn.LSTM`` parameters, and stacked copies (seeds trained
as one model, ``tdrl.marl``'s ``MultiAgentGRU.seed_stacked_forward``) with every parameter
``[n_seeds, *shape]``, which the kernels run as one batched GEMM over the seeds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn

from tdrl.core import keys as K
from tdrl.core.values._utils import NestedKey, require
from tdrl.core.values.functional import kernel_op
from tdrl.core.keys import next_key

__all__ = ["GRUModule", "LSTMModule", "rnn_layers"]


def rnn_layers(cell: str, params: Mapping[str, Tensor], xs: Tensor, states: Sequence[Tensor],
               init: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Every layer of a GRU / LSTM over time with episode resets, through ``tdrl.kernels``'
    ``gru_sequence`` / ``lstm_sequence``: layer ``l`` reads layer ``l - 1``'s outputs, and every
    layer's state is zeroed at the same steps.

    Args:
        cell: ``"gru"`` or ``"lstm"``.
        params: the parameters under ``nn.GRU`` / ``nn.LSTM``'s names (``weight_ih_l0``,
            ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ... for each layer; biases optional),
            each optionally with a leading stack dim ``S`` (copies of one network: block ``s`` of
            every input runs through copy ``s``).
        xs: ``[*S, N, T, F]`` inputs.
        states: one tensor per state (GRU: ``h``; LSTM: ``h``, ``c``), each ``[*S, L, N, H]``:
            the state before ``t = 0`` of every layer.
        init: ``[*S, N, T]`` bool, True where a new episode starts (the state is zeroed first).

    Returns:
        ``(out [*S, N, T, H], [state after every step [*S, N, T, L, H]] per state)``.
    """
    op = kernel_op("gru_sequence" if cell == "gru" else "lstm_sequence")
    if op is None:  # pragma: no cover - a kernels release without the op
        raise ImportError(f"tdrl.kernels has no {cell}_sequence: reinstall packages/kernels with packages/core.")
    layer_in, n_layers = xs, sum(1 for n in params if n.startswith("weight_ih_l"))
    per_layer: list[list[Tensor]] = [[] for _ in states]
    for layer in range(n_layers):
        w = [params[f"{n}_l{layer}"] for n in ("weight_ih", "weight_hh")]
        b = [params.get(f"{n}_l{layer}") for n in ("bias_ih", "bias_hh")]
        seqs = op(layer_in, *(s[..., layer, :, :] for s in states), init, *w, *b)
        seqs = (seqs,) if cell == "gru" else seqs
        for lst, seq in zip(per_layer, seqs):
            lst.append(seq)
        layer_in = seqs[0]
    return layer_in, [torch.stack(lst, -2) for lst in per_layer]


class _RecurrentModule(TensorDictModuleBase):
    rnn: nn.GRU | nn.LSTM
    state_keys: tuple[NestedKey, ...]

    def __init__(self, in_key: NestedKey, out_key: NestedKey, is_init_key: NestedKey) -> None:
        super().__init__()
        self.in_key, self.out_key, self.is_init_key = in_key, out_key, is_init_key
        self.recurrent_mode = False

    def _set_keys(self) -> None:
        self.in_keys = [self.in_key, self.is_init_key, *self.state_keys]
        self.out_keys = [self.out_key, *(next_key(k) for k in self.state_keys)]

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

    def _run_layers(self, xs: Tensor, states: list[Tensor], init: Tensor):
        """All layers over time (:func:`rnn_layers` on this module's ``nn.GRU`` / ``nn.LSTM``
        parameters). States ``[L, N, H]`` in, ``[N, T, L, H]`` out."""
        rnn = self.rnn
        cell = "gru" if isinstance(rnn, nn.GRU) else "lstm"
        if kernel_op(f"{cell}_sequence") is None:
            return self._step_loop(xs, states, init)
        return rnn_layers(cell, dict(rnn.named_parameters()), xs, states, init)

    def _step_loop(self, xs: Tensor, states: list[Tensor], init: Tensor):
        """Without the kernels' op: ``self.rnn`` one step at a time, state zeroed at resets."""
        outs, per_step = [], [[] for _ in states]
        hidden = tuple(states)
        for t in range(xs.shape[1]):
            keep = (~init[:, t]).view(1, -1, 1).to(xs.dtype)
            hidden = tuple(h * keep for h in hidden)
            o, new = self.rnn(xs[:, t : t + 1], hidden[0] if len(hidden) == 1 else hidden)
            hidden = (new,) if isinstance(new, Tensor) else tuple(new)
            outs.append(o)
            for lst, h in zip(per_step, hidden):
                lst.append(h.transpose(0, 1))  # [N, L, H]
        return torch.cat(outs, 1), [torch.stack(lst, 1) for lst in per_step]

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
        out, per_step = self._run_layers(xs, states, init)  # [N, T, H], [[N, T, L, H]]
        if self.recurrent_mode:
            td.set(self.out_key, out.reshape(*batch, n_time, H))
            for key, s in zip(self.state_keys, per_step):
                td.set(next_key(key), s.reshape(*batch, n_time, L, H))
        else:
            td.set(self.out_key, out.reshape(*batch, H))
            for key, s in zip(self.state_keys, per_step):
                td.set(next_key(key), s.reshape(*batch, L, H))
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
