"""Core's scans through the kernels' blocked torch scan (``backend="torch"``): hand-computed
values, every block layout against a Python loop, gradients, dtypes."""

from __future__ import annotations

import pytest
import torch

from tdrl.core.values import discounted_cumsum, gae
from tdrl.core.values.functional import _scan_loop
from tdrl.kernels.scan.reference import _chunk_len as _block_len
from tdrl.kernels.scan.reference import reverse_scan_rows


def test_block_len_is_ceil_sqrt():
    assert [_block_len(t) for t in (0, 1, 2, 4, 5, 9, 10, 1024, 1025)] == [1, 1, 2, 2, 3, 3, 4, 32, 33]


def test_rows_hand_computed_across_blocks():
    # T = 5: blocks of 3 steps, [0, 1, 2] and the tail [3, 4]; the done at t = 3 cuts the
    # carry from t = 4; coefficients 0.5 elsewhere.
    d = torch.tensor([[1.0, 2.0, 3.0, 4.0, 8.0]])
    c = torch.tensor([[0.5, 0.5, 0.5, 0.0, 0.5]])
    # y4 = 8; y3 = 4 + 0 * 8 = 4; y2 = 3 + 0.5 * 4 = 5; y1 = 2 + 2.5 = 4.5; y0 = 1 + 2.25 = 3.25
    out = reverse_scan_rows(d.clone(), c.clone())
    torch.testing.assert_close(out, torch.tensor([[3.25, 4.5, 5.0, 4.0, 8.0]]))


def test_gae_hand_computed_with_truncation_and_termination_over_blocks():
    # T = 5, gamma = lmbda = 1 (coef 1) to keep the arithmetic exact: step 1 truncated
    # (bootstraps from next_value, trace stops), step 4 terminated (no bootstrap).
    col = lambda *x: torch.tensor(x).reshape(1, -1, 1)  # noqa: E731
    r, v, nv = col(1.0, 1.0, 1.0, 1.0, 1.0), col(0.0, 0.0, 0.0, 0.0, 0.0), col(2.0, 3.0, 4.0, 5.0, 6.0)
    done = col(False, True, False, False, True).bool()
    term = col(False, False, False, False, True).bool()
    # deltas: 1 + nv (not terminated) - 0 -> [3, 4, 5, 6, 1]
    # adv4 = 1; adv3 = 6 + 1 = 7; adv2 = 5 + 7 = 12; adv1 = 4 (done); adv0 = 3 + 4 = 7
    adv, target = gae(r, v, nv, done, term, 1.0, 1.0, backend="torch")
    torch.testing.assert_close(adv, col(7.0, 4.0, 12.0, 7.0, 1.0))
    torch.testing.assert_close(target, adv)


@pytest.mark.parametrize("t_len", [1, 2, 3, 4, 5, 8, 9, 10, 17, 100, 257])
@pytest.mark.parametrize("coef", [0.0, 0.3, 0.99 * 0.95, 1.0])
def test_every_block_layout_matches_loop(t_len, coef):
    g = torch.Generator().manual_seed(t_len)
    x = torch.randn(3, 2, t_len, 1, generator=g, dtype=torch.float64)
    done = torch.rand(3, 2, t_len, 1, generator=g) < 0.1
    done[0, 0, _block_len(t_len) - 1 :: _block_len(t_len)] = True  # dones at block ends
    torch.testing.assert_close(discounted_cumsum(x, coef, done, backend="torch"), _scan_loop(x, coef, done))
    torch.testing.assert_close(discounted_cumsum(x, coef, backend="torch"), _scan_loop(x, coef, None))


def test_gradients_match_autograd_through_the_loop():
    g = torch.Generator().manual_seed(0)
    shape = (4, 37, 1)
    r = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    nv = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    done = torch.rand(shape, generator=g) < 0.1
    term = done & (torch.rand(shape, generator=g) < 0.5)
    w = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    adv, target = gae(r, v, nv, done, term, 0.9, 0.8, backend="torch")
    grads = torch.autograd.grad((adv * w[0] + target * w[1]).sum(), (r, v, nv))
    delta = r + 0.9 * nv * (~term) - v
    adv_l = _scan_loop(delta, 0.72, done)
    grads_l = torch.autograd.grad((adv_l * w[0] + (adv_l + v) * w[1]).sum(), (r, v, nv))
    torch.testing.assert_close(adv, adv_l)
    for a, b in zip(grads, grads_l, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(
        lambda x: discounted_cumsum(x, 0.7, done[:1, :9], backend="torch"), (r[:1, :9].detach().requires_grad_(),)
    )


def test_low_precision_computed_in_float32_and_empty_time():
    g = torch.Generator().manual_seed(1)
    shape = (2, 50, 1)
    r, v, nv = (torch.randn(shape, generator=g) for _ in range(3))
    done = torch.rand(shape, generator=g) < 0.05
    adv16, tgt16 = gae(r.bfloat16(), v.bfloat16(), nv.bfloat16(), done, done, 0.99, 0.95, backend="torch")
    adv32, _ = gae(r.bfloat16().float(), v.bfloat16().float(), nv.bfloat16().float(), done, done, 0.99, 0.95,
                   backend="torch")
    assert adv16.dtype == tgt16.dtype == torch.bfloat16
    torch.testing.assert_close(adv16.float(), adv32, atol=0.05, rtol=0.01)
    empty = torch.zeros(2, 0, 1)
    adv, tgt = gae(empty, empty, empty, empty.bool(), empty.bool(), 0.9, 0.9, backend="torch")
    assert adv.shape == tgt.shape == (2, 0, 1)
