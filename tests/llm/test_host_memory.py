"""AdamW's moments in huge-page buffers: the same steps as AdamW's own state, and the cases
left alone."""

from __future__ import annotations

import sys

import pytest
import torch

from tdrl.llm.trainers.common import make_optimizer
from tdrl.llm.trainers.host_memory import adamw_state_in_huge_pages, huge_page_zeros

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_HUGEPAGE) is Linux's")


def _model(seed=0):
    torch.manual_seed(seed)
    # > 2 MiB of parameters (the smallest buffer given huge pages), two of them tied
    m = torch.nn.Sequential(torch.nn.Embedding(2000, 320), torch.nn.Linear(320, 320), torch.nn.Linear(320, 2000))
    m[2].weight = m[0].weight  # tied, as an LM head is to its input embedding
    return m


def _steps(model, opt, n=3):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randint(0, 2000, (8, 5), generator=g)
        opt.zero_grad(set_to_none=True)
        model(x).logsumexp(-1).mean().backward()
        opt.step()


@linux
@pytest.mark.parametrize("fused", [True, False])
def test_huge_page_moments_take_the_same_steps(fused):
    ref, ours = _model(), _model()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, fused=fused or None,
                                foreach=None if fused else True)
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, fused=fused or None,
                            foreach=None if fused else True)
    assert adamw_state_in_huge_pages(opt)
    buf = opt.state[next(ours.parameters())]["exp_avg"]
    _steps(ref, opt_ref)
    _steps(ours, opt)
    for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)
    for p_ref, p in zip(ref.parameters(), ours.parameters(), strict=True):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_ref.state[p_ref][k], opt.state[p][k])
    # AdamW kept the moments it was given (views of one buffer), in the order of the parameters
    first, second = (opt.state[p]["exp_avg"] for p in list(ours.parameters())[:2])
    assert opt.state[next(ours.parameters())]["exp_avg"] is buf
    assert second.data_ptr() == first.data_ptr() + first.numel() * first.element_size()
    # a checkpoint round trip restores the same state
    fresh = torch.optim.AdamW(_model().parameters(), lr=1e-2, fused=fused or None, foreach=None if fused else True)
    fresh.load_state_dict(opt.state_dict())
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_cases_left_alone():
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), amsgrad=True)
    assert not adamw_state_in_huge_pages(opt) and not opt.state
    opt = torch.optim.AdamW(m.parameters())
    _steps(m, opt, 1)  # a state already exists
    assert not adamw_state_in_huge_pages(opt)
    small = torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())  # under 2 MiB: ordinary pages
    assert not adamw_state_in_huge_pages(small) and not small.state
    mixed = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(600_000)), torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    assert not adamw_state_in_huge_pages(mixed)
    z, _ = huge_page_zeros(1_000_000)
    assert z.shape == (1_000_000,) and not z.any()


@linux
def test_make_optimizer_places_the_state():
    opt = make_optimizer(_model(), lr=1e-3)
    assert len(opt.state) == 4 and all(s["exp_avg"].abs().sum() == 0 for s in opt.state.values())
