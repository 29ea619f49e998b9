"""Pure-torch token log-probs and entropy from logits, chunked over rows.

For logits ``z = logits / temperature`` of one row and its target id ``y``::

    logp = z[y] - logsumexp(z)             entropy = logsumexp(z) - sum_j p_j z_j

Only ``[chunk, V]`` float32 temporaries exist at once (never a second ``[N, V]``), and the
backward recomputes the softmax per chunk from the saved ``logsumexp`` instead of storing
it::

    d logp / d z_j    = 1[j = y] - p_j
    d entropy / d z_j = -p_j (log p_j + entropy)

Targets below zero (e.g. the ``-100`` of Hugging Face labels) give ``logp = 0`` and no
gradient through ``logp``; their entropy is still computed.

The row functions :func:`rows_forward` and :func:`rows_backward` are shared with
:mod:`tdrl.kernels.fused_linear`; :mod:`.triton` implements the same two functions.
"""

from __future__ import annotations

import torch

#: float32 elements per chunk of logits processed at once (CPU / CUDA).
CHUNK_ELEMENTS_CPU = 1 << 22
CHUNK_ELEMENTS_CUDA = 1 << 26


def default_chunk_rows(n_rows: int, vocab: int, device: torch.device, budget: int | None = None) -> int:
    """Rows per chunk (a power of two) so that a ``[rows, vocab]`` buffer holds ~``budget`` elements."""
    if budget is None:
        budget = CHUNK_ELEMENTS_CUDA if device.type == "cuda" else CHUNK_ELEMENTS_CPU
    rows = max(1, budget // max(vocab, 1))
    rows = 1 << (rows.bit_length() - 1)  # a power of two
    return max(1, min(rows, n_rows))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def make_workspace(chunk: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Two ``[chunk, vocab]`` compute-dtype buffers reused by every chunk of the torch rows
    (fresh multi-MB allocations page-fault on every chunk otherwise)."""
    return torch.empty(2, chunk, vocab, dtype=compute_dtype(dtype), device=device)


def _buffers(
    workspace: torch.Tensor | None, rows: int, vocab: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``[rows, vocab]`` views of the two workspace buffers (none if it is too small)."""
    if workspace is None or workspace.shape[1] < rows or workspace.shape[2] < vocab:
        return None, None
    return workspace[0, :rows, :vocab], workspace[1, :rows, :vocab]


def _scaled(logits: torch.Tensor, temperature: float, buf: torch.Tensor | None = None) -> torch.Tensor:
    """``logits / temperature`` in the compute dtype (``logits`` itself when nothing changes)."""
    cdt = compute_dtype(logits.dtype)
    if logits.dtype == cdt and temperature == 1.0:
        return logits
    if buf is None:
        z = logits.to(cdt)
        return z / temperature if temperature != 1.0 else z
    buf.copy_(logits)  # upcast first: dividing in bfloat16 would lose precision
    return buf.div_(temperature) if temperature != 1.0 else buf


def rows_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    need_entropy: bool,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-prob of the target, logsumexp and (optionally) entropy of each row.

    Args:
        logits: ``[C, V]`` logits of any floating dtype.
        targets: ``[C]`` int64 target ids (negative = ignored: log-prob 0).
        temperature: logits are divided by it.
        need_entropy: also return the entropy.
        workspace: optional :func:`make_workspace` buffers with at least ``C`` rows.

    Returns:
        ``(logp, lse, entropy)``, each ``[C]`` float32 (float64 for float64 logits);
        ``entropy`` is ``None`` unless requested. ``lse`` is of the scaled logits.
    """
    buf_z, buf_e = _buffers(workspace, *logits.shape)
    z = _scaled(logits, temperature, buf_z)
    m = z.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)  # a row of -inf: shift by 0
    e = torch.sub(z, m, out=buf_e).exp_() if buf_e is not None else (z - m).exp_()
    total = e.sum(-1)
    lse = m.squeeze(1) + total.log()
    valid = targets >= 0
    picked = z.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    logp = torch.where(valid, picked - lse, torch.zeros_like(lse))
    entropy = None
    if need_entropy:
        ez = e.mul_(z).nan_to_num_(nan=0.0)  # exp(z - m) * z, 0 where the probability is 0
        entropy = lse - ez.sum(-1) / total
    return logp, lse, entropy


def rows_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    grad_logp: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    out: torch.Tensor,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient with respect to the raw logits of one chunk of rows, written into ``out``.

    Args:
        logits: ``[C, V]`` the logits of the forward pass (``out`` may alias them).
        targets: ``[C]`` target ids (negative = ignored).
        temperature: as in the forward pass.
        lse: ``[C]`` logsumexp saved by :func:`rows_forward`.
        entropy: ``[C]`` entropy saved by the forward pass (needed with ``grad_entropy``).
        grad_logp: ``[C]`` upstream gradient of the log-probs, or ``None``.
        grad_entropy: ``[C]`` upstream gradient of the entropy, or ``None``.
        out: ``[C, V]`` buffer that receives the gradient (its dtype is kept).
        workspace: optional :func:`make_workspace` buffers with at least ``C`` rows.

    Returns:
        ``out``.
    """
    buf_z, buf_g = _buffers(workspace, *logits.shape)
    z = _scaled(logits, temperature, buf_z)
    cdt = z.dtype
    lse = lse.to(cdt).unsqueeze(1)
    gl = torch.zeros_like(lse)
    if grad_logp is not None:
        gl = torch.where(targets.unsqueeze(1) >= 0, grad_logp.to(cdt).unsqueeze(1), gl)
    # coeff = g_logp + g_ent * (log p + H); grad = 1[y] g_logp - p * coeff
    if grad_entropy is not None:
        coeff = torch.sub(z, lse - entropy.to(cdt).unsqueeze(1))
        coeff.mul_(grad_entropy.to(cdt).unsqueeze(1)).add_(gl)
    else:
        coeff = gl
    if out.dtype == cdt:
        grad = out
    else:
        grad = buf_g if buf_g is not None else torch.empty_like(z)
    torch.sub(z, lse, out=grad).exp_().mul_(coeff.neg())
    if grad_entropy is not None:
        grad.nan_to_num_(nan=0.0)  # p = 0 where a logit is -inf
    if grad_logp is not None:
        grad.scatter_add_(1, targets.clamp(min=0).unsqueeze(1), gl)
    if temperature != 1.0:
        grad.div_(temperature)
    if grad is not out:
        out.copy_(grad)
    return out


def torch_workspace(row_fn, rows: int, vocab: int, like: torch.Tensor) -> torch.Tensor | None:
    """Workspace for the torch row functions (the Triton ones need none)."""
    if row_fn not in (rows_forward, rows_backward) or rows == 0:
        return None
    return make_workspace(rows, vocab, like.dtype, like.device)


def forward_in_chunks(rows_fwd, chunk_logits, targets, chunk: int, temperature: float, need_entropy: bool,
                      ws, logp: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None) -> None:
    """Fill ``logp`` and ``lse`` ``[N]`` (and ``entropy`` with ``need_entropy``) ``chunk`` rows at
    a time: ``chunk_logits(s, e)`` gives rows ``s:e``'s logits, dropped before the next chunk's."""
    n = logp.shape[0]
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        logits = chunk_logits(s, e)
        lp, ls, en = rows_fwd(logits, targets[s:e], temperature, need_entropy, workspace=ws)
        logp[s:e], lse[s:e] = lp, ls
        if need_entropy:
            entropy[s:e] = en
        del logits


def backward_rows(rows_bwd, s: int, e: int, logits: torch.Tensor, out: torch.Tensor, targets, temperature: float,
                  lse, entropy, grad_logp, grad_entropy, ws) -> torch.Tensor:
    """``rows_bwd`` on rows ``s:e``: their ``logits`` ``[e - s, V]`` and the slices of the saved
    ``[N]`` statistics and upstream gradients (either may be None); the logits' gradient goes
    into ``out`` (which may alias ``logits``), which is returned. The backward of
    :func:`forward_in_chunks`'s chunks."""
    return rows_bwd(
        logits, targets[s:e], temperature, lse[s:e],
        None if entropy is None else entropy[s:e],
        None if grad_logp is None else grad_logp[s:e].contiguous(),
        None if grad_entropy is None else grad_entropy[s:e].contiguous(),
        out,
        workspace=ws,
    )


class TokenLogprobsFunction(torch.autograd.Function):
    """Chunked token log-probs (and entropy) with a recomputing backward.

    ``rows_fwd`` / ``rows_bwd`` are the row functions (torch or Triton); ``chunk`` rows of
    logits are processed at a time.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, need_entropy, chunk, rows_fwd, rows_bwd):
        n = logits.shape[0]
        dtype = compute_dtype(logits.dtype)
        logp = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if need_entropy else None
        ws = torch_workspace(rows_fwd, min(chunk, n), logits.shape[-1], logits)
        forward_in_chunks(rows_fwd, lambda s, e: logits[s:e], targets, chunk, temperature, need_entropy, ws,
                          logp, lse, entropy)
        ctx.save_for_backward(logits, targets, lse, entropy if need_entropy else None)
        ctx.config = (temperature, chunk, rows_bwd)
        if need_entropy:
            return logp, entropy
        return logp

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy=None):
        logits, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk, rows_bwd = ctx.config
        grad_logits = torch.empty_like(logits)
        n = logits.shape[0]
        ws = torch_workspace(rows_bwd, min(chunk, n), logits.shape[-1], logits)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            backward_rows(rows_bwd, s, e, logits[s:e], grad_logits[s:e], targets, temperature, lse, entropy,
                          grad_logp, grad_entropy, ws)
        return grad_logits, None, None, None, None, None, None


def check_logprob_inputs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> None:
    """Validate shapes of ``token_logprobs`` inputs with messages for the user."""
    if logits.dim() < 2 or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"token_logprobs expects logits [B, T, V] and targets [B, T]; got logits "
            f"{tuple(logits.shape)} and targets {tuple(targets.shape)}."
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}.")
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"targets must hold integer token ids, got {targets.dtype}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    check_target_range(targets, logits.shape[-1], "token_logprobs")


def check_target_range(targets: torch.Tensor, vocab: int, op: str) -> None:
    """Token ids must be below the vocabulary size (negative ids are the ignored ones): an id
    out of range would read another row's logits in a kernel. One host sync."""
    if targets.numel() and int(targets.max()) >= vocab:
        bad = int(targets.max())
        raise ValueError(
            f"{op}: target id {bad} is out of range for a vocabulary of {vocab} (ids must be < {vocab}; "
            f"negative ids such as -100 are ignored). Do the tokenizer and the LM head match?"
        )


def in_lead_shape(out, lead: torch.Size, return_entropy: bool):
    """The flat ``[N]`` log-probs (and entropies, with ``return_entropy``) back in the
    targets' shape ``lead``."""
    if return_entropy:
        return out[0].reshape(lead), out[1].reshape(lead)
    return out.reshape(lead)


def token_logprobs_impl(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    return_entropy: bool,
    rows_fwd,
    rows_bwd,
    chunk: int | None,
):
    """Shared body of :func:`token_logprobs` for a pair of row functions."""
    check_logprob_inputs(logits, targets, temperature)
    lead = targets.shape
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    tgt = targets.reshape(-1).long()
    chunk = chunk or default_chunk_rows(flat.shape[0], vocab, logits.device)
    chunk = max(1, chunk)
    out = TokenLogprobsFunction.apply(
        flat, tgt, float(temperature), bool(return_entropy), chunk, rows_fwd, rows_bwd
    )
    return in_lead_shape(out, lead, return_entropy)
