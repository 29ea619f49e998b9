"""apps/sac with n_seeds: several seeds as one vectorised model. Gradient steps of the stacked
loss equal each seed's single-seed steps (same batch, same noise), a seed's run does not
depend on the other seeds, per-seed metrics are written, and impossible configs are refused."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributions.normal as normal_mod
from tensordict import TensorDict

from _load import load_app, read_rows  # noqa: E402
from tdrl.core.objectives import SoftUpdate
from tdrl.core.train import SeedAxis, SeedStackedModule, from_seed_items, to_seed_items

SEEDS, B = [3, 7], 16


@pytest.fixture(scope="module")
def sac():
    return load_app("sac")


class _Noise:
    """Gaussian noise of the stacked batch, call by call; ``block=k`` hands out only seed
    ``k``'s rows (what a single-seed run of seed ``k`` draws if the noise were per seed)."""

    def __init__(self, block: int | None = None) -> None:
        self.block, self.calls = block, 0

    def __call__(self, shape, dtype=None, device=None):
        g = torch.Generator().manual_seed(1000 + self.calls)
        self.calls += 1
        rows = shape[0] if self.block is None else shape[0] * len(SEEDS)
        full = torch.randn((rows, *shape[1:]), generator=g, dtype=dtype)
        return full if self.block is None else full[self.block * B:(self.block + 1) * B]


def _batch(step: int) -> TensorDict:
    g = torch.Generator().manual_seed(step)
    n = len(SEEDS) * B
    return TensorDict({
        "observation": torch.randn(n, 3, generator=g), "action": torch.rand(n, 1, generator=g) * 4 - 2,
        "next": {"observation": torch.randn(n, 3, generator=g), "reward": -torch.rand(n, 1, generator=g) * 5,
                 "terminated": torch.rand(n, 1, generator=g) < 0.2},
    }, [n])


def _assert_seed_equal(vec, single, k: int, tol: float = 2e-5) -> None:
    """Seed ``k``'s slice of every stacked network (online and target) and its temperature
    equal the single-seed loss's."""
    found = 0
    for name, mod in vec.named_modules():
        if isinstance(mod, SeedStackedModule):
            ref = single.get_submodule(name)
            per = mod.n_seeds // len(SEEDS)  # REDQ's ensemble: seed k's critics are members k * N .. k * N + N - 1
            for i in range(per):
                want = ref.state_dict() if per == 1 else ref.seed_state(i)
                for n, v in mod.seed_state(k * per + i).items():
                    torch.testing.assert_close(v, want[n], rtol=tol, atol=tol, msg=f"{name}.{n} seed {SEEDS[k]}")
                    found += 1
    assert found >= 6 * 2  # actor + 2 critics + 2 target critics, weights and biases
    torch.testing.assert_close(vec.temperature.log_alpha.detach()[k], single.temperature.log_alpha.detach())


@pytest.mark.parametrize("algorithm", ["sac", "redq"])
def test_stacked_update_equals_single_seed_updates(sac, monkeypatch, algorithm):
    """Three gradient steps + target updates of the stacked SAC / REDQ loss on seed-major
    batches give each seed the parameters of its own single-seed steps on its block (the
    noise of the stacked call's rows handed to the single run; REDQ's subsets from one
    generator state)."""
    cfg = sac.Config(env_id="Pendulum-v1", hidden=(16, 16), algorithm=algorithm, num_critics=3, critic_subset=2,
                     alpha_init=0.5)
    env = sac.env_for(cfg, 1)
    vec = sac.build_loss(env, cfg, SeedAxis(SEEDS))

    def optimiser(loss):
        return torch.optim.Adam([{"params": list(loss.actor.parameters()), "lr": 1e-2},
                                 {"params": list(loss.qvalue.parameters()), "lr": 1e-2},
                                 {"params": list(loss.temperature.parameters()), "lr": 1e-2}])

    def steps(loss, noise, rows=None, seed=None):
        opt, upd = optimiser(loss), SoftUpdate(loss, tau=0.1)
        monkeypatch.setattr(normal_mod, "_standard_normal", noise)
        torch.manual_seed(11)  # REDQ's subset draws
        for step in range(3):
            batch = _batch(step)
            axis = SeedAxis(SEEDS if seed is None else [seed])
            sac.sac_update(loss, opt, batch if rows is None else batch[rows], axis)
            upd.step()

    singles = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        singles.append(sac.make_loss(env, cfg))
    for k in range(len(SEEDS)):  # the stacked initial weights are each seed's own
        _assert_seed_equal(vec, singles[k], k, tol=0)
    steps(vec, _Noise())
    for k, single in enumerate(singles):
        steps(single, _Noise(block=k), rows=slice(k * B, (k + 1) * B), seed=SEEDS[k])
        _assert_seed_equal(vec, single, k)
    assert not torch.equal(vec.temperature.log_alpha[0], vec.temperature.log_alpha[1])  # alpha per seed
    env.close()


def test_seed_items_keep_each_seeds_transitions_apart():
    """The replay layout: item i holds every seed's i-th transition; a sample gives each seed's
    block only its own transitions, the same slots for every seed."""
    n_seeds, n = 3, 4
    td = TensorDict({"x": torch.arange(12.0).reshape(12, 1), "next": {"r": torch.arange(12.0).reshape(12, 1)}}, [12])
    items = to_seed_items(td, n_seeds)
    assert items.shape == (n,) and items["x"].shape == (n, n_seeds, 1)
    sample = items[torch.tensor([2, 0])]
    sample.set("index", torch.tensor([2, 0]))
    rows = from_seed_items(sample, n_seeds)
    assert rows["x"].squeeze(-1).tolist() == [2, 0, 6, 4, 10, 8] == rows["next", "r"].squeeze(-1).tolist()
    with pytest.raises(ValueError, match="n_seeds=2"):
        from_seed_items(sample, 2)


def test_a_seed_does_not_depend_on_the_other_seeds(sac, tmp_path):
    """Seeds [0, 1] and [0, 5] in one process: seed 0's training returns, evaluation, temperature
    and final weights are the same in both runs, while the second seed's differ; per-seed
    entries are logged beside the means."""
    runs = {}
    for other in (1, 5):
        out = tmp_path / f"with{other}"
        cfg = sac.main.load(["env_id=Pendulum-v1", f"out={out}", "n_seeds=2", "total_frames=400", "log_every=100",
                             "hidden=[16,16]"], recipe="tiny")
        summary = sac.train(cfg, seeds=[0, other])
        assert summary["seeds"] == [0, other] and summary["frames"] == 400
        runs[other] = (summary, read_rows(out / "metrics.csv"), torch.load(out / "model.pt", weights_only=True), out)
    (s1, rows1, m1, out1), (s5, rows5, m5, _) = runs[1], runs[5]
    for col in ("train_return/seed_0", "alpha/seed_0"):
        assert [r[col] for r in rows1 if r.get(col)] == [r[col] for r in rows5 if r.get(col)], col
    assert any(r.get("train_return/seed_0") for r in rows1)  # Pendulum's 200-step episodes ended
    assert s1["eval_return_seeds"][0] == s5["eval_return_seeds"][0]
    assert s1["eval_return_seeds"][1] != s5["eval_return_seeds"][1]
    for net in ("actor", "qvalue"):
        for name, v in m1[net].items():
            torch.testing.assert_close(v[0], m5[net][name][0], rtol=0, atol=1e-6, msg=f"{net}.{name}")
    assert any(not torch.allclose(v[1], m5["qvalue"][k][1]) for k, v in m1["qvalue"].items())
    saved = json.loads((out1 / "summary.json").read_text())
    assert saved["eval_return"] == pytest.approx(sum(saved["eval_return_seeds"]) / 2)
    assert any(r["eval_return/seed_1"] and float(r["step"]) == 400 for r in rows1)  # the final evaluation


def test_impossible_seed_configs_are_refused(sac):
    with pytest.raises(ValueError, match="n_seeds=0"):
        sac.main.load(["n_seeds=0"])
    with pytest.raises(ValueError, match="one generator for every sub-env would be shared by the 2 seeds"):
        sac.main.load(["n_seeds=2", "env_id=tdrl/Pendulum"])
    assert sac.run_seeds(sac.main.load(["seed=4", "n_seeds=3"], recipe="tiny")) == [4, 5, 6]
