"""apps/examples: TorchRL's getting-started training loop (DQN on CartPole) in TorchRL's
spelling runs on tdrl and learns (issue 40: a TorchRL user's script runs with its imports
changed), and the two seams it crossed: a lazy ``MLP`` materialised when the collector is built,
and ``DQNLoss``'s ``loss`` output."""

from __future__ import annotations

import ast
import importlib.util
import sys

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

from _load import REPO

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.modules import MLP, QValueModule
from tdrl.core.objectives import DQNLoss, SoftUpdate


def _example(name: str):
    path = REPO / "apps" / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tdrl_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_port_imports_tdrl_where_torchrl_was_imported():
    tree = ast.parse((REPO / "apps" / "examples" / "torchrl_first_training_loop.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("torchrl") for m in modules)
    assert {"tdrl.core.collectors", "tdrl.core.objectives", "tdrl.core.replay", "tdrl.core.modules"} <= modules


def test_the_first_training_loop_solves_cartpole(tmp_path):
    """The tutorial's stopping rule: an episode longer than 200 steps (CartPole's random policy
    lasts ~22); seed 0, within the tutorial's own loop."""
    out = _example("torchrl_first_training_loop").main(str(tmp_path), max_seconds=240)
    assert out["max_length"] > 200, out
    assert list(tmp_path.rglob("*.csv")), "the CSVLogger wrote nothing"


def test_a_lazy_policy_is_materialised_by_the_collector_before_the_loss_copies_it():
    env = GymEnv("CartPole-v1")
    net = MLP(out_features=2, num_cells=[8])
    policy = TensorDictSequential(TensorDictModule(net, in_keys=["observation"], out_keys=["action_value"]),
                                  QValueModule(spec=env.action_spec))
    with pytest.raises(ValueError, match="lazy parameters"):
        DQNLoss(value_network=policy)
    rng = torch.get_rng_state()
    Collector(env, policy, frames_per_batch=4, total_frames=4)
    assert torch.equal(rng, torch.get_rng_state())  # the probe ran under a forked RNG
    loss = DQNLoss(value_network=policy, delay_value=True)
    online = dict(loss.value_network.named_parameters())
    for name, p in loss.target_value_network.named_parameters():
        torch.testing.assert_close(p, online[name])  # the target starts equal to the online net
    td = TensorDict({"observation": torch.randn(5, 4), "action": torch.nn.functional.one_hot(torch.randint(2, (5,)), 2),
                     "next": {"observation": torch.randn(5, 4), "reward": torch.ones(5, 1),
                              "done": torch.zeros(5, 1, dtype=torch.bool),
                              "terminated": torch.zeros(5, 1, dtype=torch.bool)}}, [5])
    out = loss(td)
    assert out["loss"].requires_grad and torch.equal(out["loss"], out["loss_qvalue"])
    SoftUpdate(loss, eps=0.99).step()
