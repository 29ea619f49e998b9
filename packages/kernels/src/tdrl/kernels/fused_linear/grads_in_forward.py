"""The chunk loop shared by the fused LM-head losses that compute their gradients in the forward.

A loss ``L = f(logp)`` whose per-token derivative ``d L / d logp`` is known as soon as a
chunk's log-probs are (the PPO / GRPO token loss, the masked cross-entropy) needs no second
pass over the logits: each chunk runs, in the forward,

    logits = hidden[c] @ W.T + b                          (matmul 1)
    logp, lse = rows_forward(logits)                      (softmax statistics)
    g = d L / d logp                                      (the loss's own code, [chunk])
    d logits = rows_backward(logits, g)                   (in place)
    d hidden[c] = d logits @ W                            (matmul 2)
    d W += d logits.T @ hidden[c];  d b += sum(d logits)  (matmul 3)

and the backward only scales the stored gradients by the scalar upstream gradient: three
matmuls (two with a frozen head) and ``O(chunk x V)`` extra memory, as Liger-Kernel's fused
linear losses do. The losses also share the row selection: tokens whose weight is zero add
nothing, so only the others go through the LM head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..logprobs.reference import torch_workspace


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``hidden @ weight.T + bias`` for one chunk of rows."""
    if bias is None:
        return hidden @ weight.t()
    return torch.addmm(bias, hidden, weight.t())

#: ``token_fn(start, end, logp, entropy) -> d loss / d logp`` of the rows ``start:end``
#: (``[end - start]``, compute dtype), or ``None`` when nothing is backpropagated.
TokenFn = Callable[[int, int, torch.Tensor, torch.Tensor | None], torch.Tensor | None]


def head_grads_in_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    needs: tuple[bool, bool, bool],
    need_entropy: bool,
    rows_fwd,
    rows_bwd,
    token_fn: TokenFn,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Run the LM head chunk by chunk, hand each chunk's log-probs to ``token_fn`` and
    accumulate the gradients of the loss it differentiates.

    Args:
        hidden: ``[N, H]`` rows; weight ``[V, H]``; bias ``[V]`` or ``None``; targets ``[N]``.
        temperature: logits are divided by it.
        chunk: rows per chunk.
        needs: whether ``hidden``, ``weight`` and ``bias`` need their gradient.
        need_entropy: compute each row's entropy for ``token_fn``.
        rows_fwd, rows_bwd: the softmax row functions (torch or Triton).
        token_fn: see :data:`TokenFn`.

    Returns:
        ``(grad_hidden, grad_weight, grad_bias)`` for a unit upstream gradient (``None``
        where not needed).
    """
    n = hidden.shape[0]
    need_h, need_w, need_b = needs
    need_b = need_b and bias is not None
    grad_hidden = torch.empty_like(hidden) if need_h else None
    # the first chunk writes the [V, H] weight gradient, later ones add to it: no zero fill
    grad_weight, w_written = (torch.empty_like(weight) if need_w else None), False
    grad_bias = torch.zeros_like(bias) if need_b else None
    # One pair of [chunk, V] buffers for the torch rows (None for Triton's): the backward rows
    # reuse the forward's, whose temporaries are dead once the chunk's lse is known.
    ws = torch_workspace(rows_fwd, min(chunk, n), weight.shape[0], weight)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        h, tgt = hidden[s:e], targets[s:e]
        logits = head_logits(h, weight, bias)
        lp, lse, ent = rows_fwd(logits, tgt, temperature, need_entropy, workspace=ws)
        dloss = token_fn(s, e, lp, ent)
        if dloss is not None and (need_h or need_w or need_b):
            g = rows_bwd(logits, tgt, temperature, lse, None, dloss.contiguous(), None, logits, workspace=ws)
            if need_h:
                torch.mm(g, weight, out=grad_hidden[s:e])
            if need_w:
                if w_written:
                    grad_weight.addmm_(g.t(), h)
                else:
                    torch.mm(g.t(), h, out=grad_weight)
                    w_written = True
            if need_b:
                grad_bias += g.sum(0).to(grad_bias.dtype)
            del g
        del logits
    if need_w and not w_written:  # no rows (or no chunk had a gradient)
        grad_weight.zero_()
    return grad_hidden, grad_weight, grad_bias


def scaled_stored_grads(ctx, grad_loss: torch.Tensor, op: str) -> tuple:
    """The gradients stored on ``ctx.grads`` by the forward, scaled in place by the upstream
    scalar gradient (they are handed to autograd as they are: the ``[V, H]`` weight gradient
    is never copied). A second backward through the same loss is refused."""
    grads = ctx.grads
    if grads is None:
        raise RuntimeError(
            f"{op} computes its gradients once, in the forward: backward through the same loss "
            "twice (retain_graph=True) is not supported; recompute the loss."
        )
    ctx.grads = None
    return tuple(None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in grads)


def kept_rows(weights: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Indices of the rows with a positive weight (one host sync) and whether that is a
    strict subset of the rows."""
    kept = (weights > 0).nonzero().squeeze(1)
    return kept, kept.numel() < weights.shape[0]
