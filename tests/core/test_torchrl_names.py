"""TorchRL's keywords on tdrl.core's constructors (issue 40): accepted where the concept is the
same and giving the same object as tdrl's spelling, refused with the tdrl spelling named where
it differs, never ignored; the README's table is the module's."""

from __future__ import annotations

import importlib
from pathlib import Path

import gymnasium  # noqa: F401  (GymEnv needs it)
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from tdrl.core import Bounded
from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.modules import MLP, AdditiveGaussianModule, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.objectives import HardUpdate, PPOLoss, SACLoss, SoftUpdate, TD3Loss
from tdrl.core.torchrl_names import TABLES, torchrl_table_markdown, translate
from tdrl.core.values import GAE, TD0Estimator, TDLambdaEstimator

ROOT = Path(__file__).resolve().parents[2]


def _sac_parts(seed=0):
    torch.manual_seed(seed)
    actor = ProbabilisticActor(
        TensorDictModule(_NormalHead(), in_keys=["observation"], out_keys=["loc", "scale"]),
        distribution_class=TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0})

    class Q(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = MLP(4, 1, (8,))

        def forward(self, obs, act):
            return self.net(torch.cat([obs, act], -1))

    q = ValueOperator(Q(), in_keys=["observation", "action"], out_keys=["state_action_value"])
    return actor, q


class _NormalHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MLP(3, 2, (8,))

    def forward(self, obs):
        loc, log_scale = self.net(obs).chunk(2, -1)
        return loc, log_scale.exp()


def _batch(n=16):
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n, 3, generator=g)
    return TensorDict({"observation": obs, "action": torch.rand(n, 1, generator=g) * 4 - 2,
                       "next": {"observation": torch.randn(n, 3, generator=g), "reward": torch.randn(n, 1, generator=g),
                                "done": torch.zeros(n, 1, dtype=torch.bool),
                                "terminated": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def test_the_readme_holds_the_generated_table():
    readme = (ROOT / "packages" / "core" / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- torchrl-names:begin -->\n", "<!-- torchrl-names:end -->"
    held = readme[readme.index(begin) + len(begin):readme.index(end)]
    assert held == torchrl_table_markdown(), (
        "packages/core/README.md's TorchRL table is stale: python -c \"from tdrl.core.torchrl_names import "
        "write_readme_table as w; w('packages/core/README.md')\"")
    assert held.count("\n| `") >= 60


def test_every_table_is_applied_to_its_class():
    """Each table's class (exported under that name somewhere in tdrl.core) takes its keywords."""
    homes = ["tdrl.core.objectives", "tdrl.core.collectors", "tdrl.core.modules", "tdrl.core.values", "tdrl.core.replay"]
    found = {}
    for home in homes:
        mod = importlib.import_module(home)
        for name in TABLES:
            if hasattr(mod, name):
                found[name] = getattr(mod, name)
    assert set(found) == set(TABLES), f"tables without a class: {set(TABLES) - set(found)}"
    for name, cls in found.items():
        assert hasattr(cls.__init__, "__wrapped__"), f"{name}.__init__ does not translate TorchRL's keywords"


def test_sac_with_torchrl_keywords_equals_tdrls_spelling():
    td = _batch()
    ours = SACLoss(*_sac_parts(), num_qvalue_nets=2)
    actor, q = _sac_parts()
    theirs = SACLoss(actor_network=actor, qvalue_network=q, delay_actor=False,
                     delay_qvalue=True, action_spec=Bounded(-2.0, 2.0, (1,)), num_qvalue_nets=2)
    torch.manual_seed(5)
    a = ours(td.clone())
    torch.manual_seed(5)
    b = theirs(td.clone())
    for key in ("loss_actor", "loss_qvalue", "loss_alpha"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_converted_values():
    loss = SACLoss(*_sac_parts())
    assert SoftUpdate(loss, eps=0.995).tau == pytest.approx(0.005)
    assert HardUpdate(loss, value_network_update_interval=7).update_interval == 7
    theirs = MLP(in_features=3, out_features=2, depth=3, num_cells=16, activation_class=nn.ReLU,
                 activate_last_layer=False)
    ours = MLP(3, 2, (16, 16, 16), activation=nn.ReLU)
    assert [type(m) for m in theirs] == [type(m) for m in ours]
    assert [tuple(p.shape) for p in theirs.parameters()] == [tuple(p.shape) for p in ours.parameters()]
    assert GAE(gamma=0.9, lmbda=0.9, average_gae=True, device="cpu").average_advantage is True
    assert TD0Estimator.__name__ == "TD0" and TDLambdaEstimator.__name__ == "TDLambda"
    actor, q = _sac_parts()
    td3 = TD3Loss(actor_network=actor, qvalue_network=q, action_spec=Bounded(-2.0, 2.0, (1,)))
    assert float(td3.action_low.max()) == -2.0 and float(td3.action_high.min()) == 2.0
    noise = AdditiveGaussianModule(spec=Bounded(-1.0, 1.0, (1,)), sigma_init=0.5)
    out = noise(TensorDict({"action": torch.full((64, 1), 0.9)}, [64]))
    assert float(out["action"].max()) <= 1.0 and float(out["action"].std()) > 0.05


def test_ppo_entropy_bonus_and_critic_coeff():
    torch.manual_seed(0)
    actor, _ = _sac_parts()
    critic = ValueOperator(MLP(3, 1, (8,)), in_keys=["observation"])
    loss = PPOLoss(actor_network=actor, critic_network=critic, entropy_bonus=False, entropy_coef=0.0, critic_coeff=1.0)
    assert loss.entropy_coef == 0.0 and loss.critic_coef == 1.0 and not loss.entropy_bonus


def test_the_collector_takes_create_env_fn():
    env_fn = lambda: GymEnv("Pendulum-v1")  # noqa: E731
    c = Collector(create_env_fn=env_fn, policy=None, frames_per_batch=8, total_frames=8)
    batch = next(iter(c))
    assert batch.numel() == 8 and ("next", "observation") in batch.keys(True)
    c.shutdown()


@pytest.mark.parametrize("call, match", [
    (lambda: SACLoss(*_sac_parts(), delay_qvalue=False), "SoftUpdate / HardUpdate"),
    (lambda: SACLoss(*_sac_parts(), value_network=nn.Linear(3, 1)), "IQLLoss"),
    (lambda: Collector(create_env_fn=lambda: None, frames_per_batch=1, create_env_kwargs={}), "EnvCreator"),
    (lambda: Collector(lambda: None, frames_per_batch=1, policy_device="cuda"), "device"),
    (lambda: MLP(3, 2, num_cells=16), "depth"),
    (lambda: MLP(3, 2, depth=2, num_cells=(4, 4)), "int num_cells"),
    (lambda: MLP(3, 2, (4,), device="cuda"), "to\\(device\\)"),
    (lambda: SoftUpdate(nn.Module(), eps=1.5), "tau = 1 - eps"),
])
def test_refusals_name_the_tdrl_spelling(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_both_spellings_of_one_setting_are_refused():
    with pytest.raises(TypeError, match="actor_network= \\(TorchRL\\) and actor= both set actor"):
        translate("SACLoss", {"actor_network": 1, "actor": 2})
    with pytest.raises(TypeError, match="eps= \\(TorchRL\\) and tau= both set tau"):
        SoftUpdate(nn.Module(), tau=0.1, eps=0.9)


def test_tdrls_own_keywords_pass_unchanged():
    kw = {"actor": 1, "qvalue": 2, "gamma": 0.9}
    assert translate("SACLoss", kw) == kw and translate("NotAClass", {"x": 1}) == {"x": 1}
