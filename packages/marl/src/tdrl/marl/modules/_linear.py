"""``linear_io``: ``x @ w + b`` for a weight stored ``[in, out]``, with a faster CPU path.

On this class of CPU (AVX2, one thread) oneDNN's fp32 GEMM runs the tall-skinny products of
an MLP over tens of thousands of agent rows faster than the BLAS that ``torch.addmm`` calls
(see benchmarks/RESULTS.md, "Multi-agent"). The maths is the same
fp32 product; only the GEMM library differs, so results agree to float rounding.

The fast path is a small autograd function: forward and the input gradient go through
``torch.ops.mkldnn._linear_pointwise``, the weight gradient through ``torch.mm``. It is
used only for plain CPU fp32 tensors in eager mode; everything else (CUDA, other dtypes,
``torch.func`` transforms such as ``vmap``, ``torch.compile`` tracing, or a torch build
without oneDNN) takes ``torch.addmm``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_io", "onednn_available"]


def _probe() -> bool:
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.ones(2, 3), torch.ones(4, 3)
        return bool(torch.equal(op(x, w, None, "none", [], ""), torch.full((2, 4), 3.0)))
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _probe()


def onednn_available() -> bool:
    """Whether the oneDNN CPU path of :func:`linear_io` is usable in this torch build."""
    return _ONEDNN


def _onednn(x: Tensor, weight_out_in: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight_out_in, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``x [M, in] @ w [in, out] + b [out]`` with oneDNN forward and input gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _onednn(x, w.t().contiguous(), b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _onednn(grad, w.contiguous(), None)  # grad @ w.T, with w read as [out'=in, in'=out]
        if ctx.needs_input_grad[1]:
            gw = torch.mm(x.t(), grad)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = grad.sum(0)
        return gx, gw, gb


def _plain(*ts: Tensor | None) -> bool:
    for t in ts:
        if t is None:
            continue
        if t.device.type != "cpu" or t.dtype != torch.float32 or t.is_sparse:
            return False
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return False
    return True


def linear_io(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x @ w + b``.

    Args:
        x: ``[M, in]`` input rows.
        w: ``[in, out]`` weight (the transpose of ``nn.Linear``'s layout).
        b: optional ``[out]`` bias.

    Returns:
        ``[M, out]``.
    """
    if _ONEDNN and x.shape[0] > 0 and not torch.compiler.is_compiling() and _plain(x, w, b):
        return _OneDNNLinear.apply(x.contiguous(), w, b)
    return torch.addmm(b, x, w) if b is not None else x @ w
