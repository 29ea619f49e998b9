"""A decoding KV cache with the completion's room allocated once.

``transformers``' ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every
new token: each decode step copies the whole cache of every layer (two copies per layer) and
allocates it afresh. :func:`preallocate_cache` turns a prefilled ``DynamicCache`` into one whose
layers hold a ``[N, H, S + room, D]`` buffer: a new token's keys and values are written into their
slot and the layer hands the attention a view of the filled part (the same values ``cat`` would
give, so the attention computes the same numbers). The rows of a shared prefill can be
selected or repeated while copying (a GRPO group's prompt, prefilled once).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["preallocate_cache"]


def preallocate_cache(cache, room: int, rows: torch.Tensor | None = None) -> bool:
    """Give every layer of a prefilled ``DynamicCache`` room for ``room`` more positions, in place.

    Args:
        cache: the cache a prefill forward returned.
        room: positions to reserve after the prefilled ones (the completion length cap).
        rows: ``[N]`` batch rows to keep (e.g. the ``inverse`` of
            :func:`tdrl.llm.generation.unique_prompts`), ``None`` for all.

    Returns:
        Whether the cache was converted. ``False`` (left untouched, rows not selected) for a
        cache that is not a plain ``DynamicCache`` of ``[N, H, S, D]`` layers (sliding-window,
        quantised, offloaded or legacy tuple caches).
    """
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # a transformers release without per-layer caches
        return False
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not layers or getattr(cache, "offloading", False):
        return False
    if any(type(layer) is not DynamicLayer or not layer.is_initialized or layer.keys.dim() != 4 for layer in layers):
        return False
    cls = _layer_class(DynamicLayer)
    for i, layer in enumerate(layers):
        keys, values = layer.keys, layer.values
        if rows is not None:
            keys, values = keys.index_select(0, rows), values.index_select(0, rows)
        layers[i] = cls(keys, values, room)
    return True


@functools.cache
def _layer_class(dynamic_layer: type) -> type:
    class PreallocatedLayer(dynamic_layer):
        """A ``DynamicLayer`` whose keys / values are views of a buffer with room to grow."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
            super().__init__()
            self.device, self.is_initialized = keys.device, True
            self._fill(keys, values, room)

        def _fill(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
            n, h, s, _ = keys.shape
            self._kbuf = keys.new_empty(n, h, s + room, keys.shape[-1])
            self._vbuf = values.new_empty(n, values.shape[1], s + room, values.shape[-1])
            self._kbuf[:, :, :s].copy_(keys)
            self._vbuf[:, :, :s].copy_(values)
            self._len = s
            self.keys, self.values = self._kbuf[:, :, :s], self._vbuf[:, :, :s]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            end = self._len + key_states.shape[-2]
            if end > self._kbuf.shape[-2]:  # past the room: grow (twice what is needed now)
                self._fill(self.keys, self.values, max(end - self._len, self._kbuf.shape[-2]))
            self._kbuf[:, :, self._len : end].copy_(key_states)
            self._vbuf[:, :, self._len : end].copy_(value_states)
            self._len = end
            self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]
            return self.keys, self.values

        def reset(self) -> None:
            self._len = 0
            self.keys, self.values = self._kbuf[:, :, :0], self._vbuf[:, :, :0]

        def _refill(self) -> None:  # after an op of DynamicLayer replaced keys / values
            self._fill(self.keys, self.values, self._kbuf.shape[-2] - self.keys.shape[-2])

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)
            self._refill()

        def batch_repeat_interleave(self, repeats: int) -> None:
            super().batch_repeat_interleave(repeats)
            self._refill()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            super().batch_select_indices(indices)
            self._refill()

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            super().reorder_cache(beam_idx)
            self._refill()

    return PreallocatedLayer
