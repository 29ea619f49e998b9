"""TorchRL's getting-started tutorial 5 ("your own first training loop": DQN on CartPole), the
same steps on tdrl, in TorchRL's spelling.

Steps, as the tutorial takes them: a ``TransformedEnv(GymEnv("CartPole-v1"), StepCounter())``;
an ``MLP`` Q-network, ``QValueModule(spec=...)`` and ``EGreedyModule`` in a
``TensorDictSequential``; a collector with random warm-up frames; a ``ReplayBuffer`` over a
``LazyTensorStorage``; ``DQNLoss(value_network=..., action_space=..., delay_value=True)``,
``Adam`` and ``SoftUpdate(loss, eps=0.99)``; a ``CSVLogger``; the loop extends the buffer,
reads the longest episode with ``rb[:]``, trains on samples and stops when an episode lasts
more than 200 steps. Only the import lines differ from a TorchRL script (the tdrl modules
below instead of ``torchrl.*``; ``tensordict.nn`` is the same package).

    python apps/examples/torchrl_first_training_loop.py [log_dir]
"""

from __future__ import annotations

import sys
import tempfile
import time

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch.optim import Adam

from tdrl.core.collectors import Collector as SyncDataCollector
from tdrl.core.envs import GymEnv
from tdrl.core.modules import MLP, EGreedyModule, QValueModule
from tdrl.core.objectives import DQNLoss, SoftUpdate
from tdrl.core.replay import LazyTensorStorage, ReplayBuffer
from tdrl.core.train import CSVLogger
from tdrl.core.transforms import StepCounter, TransformedEnv


def main(log_dir: str, max_seconds: float = 300.0) -> dict:
    torch.manual_seed(0)
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.set_seed(0)

    value_mlp = MLP(out_features=env.action_spec.shape[-1], num_cells=[64, 64])
    value_net = Mod(value_mlp, in_keys=["observation"], out_keys=["action_value"])
    policy = Seq(value_net, QValueModule(spec=env.action_spec))
    exploration_module = EGreedyModule(env.action_spec, annealing_num_steps=100_000, eps_init=0.5)
    policy_explore = Seq(policy, exploration_module)

    init_rand_steps = 5000
    frames_per_batch = 100
    optim_steps = 10
    collector = SyncDataCollector(env, policy_explore, frames_per_batch=frames_per_batch, total_frames=-1,
                                  init_random_frames=init_rand_steps)
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))

    loss = DQNLoss(value_network=policy, action_space=env.action_spec, delay_value=True)
    optim = Adam(loss.parameters(), lr=0.02)
    updater = SoftUpdate(loss, eps=0.99)

    logger = CSVLogger(exp_name="dqn", log_dir=log_dir)

    total_count = 0
    total_episodes = 0
    t0 = time.time()
    max_length = 0
    for i, data in enumerate(collector):
        rb.extend(data)
        max_length = rb[:]["next", "step_count"].max()
        if len(rb) > init_rand_steps:
            for _ in range(optim_steps):
                sample = rb.sample(128)
                loss_vals = loss(sample)
                loss_vals["loss"].backward()
                optim.step()
                optim.zero_grad()
                exploration_module.step(data.numel())
                updater.step()
                if i % 10 == 0:
                    logger.log_scalar("max_length", max_length, step=total_count)
                total_count += data.numel()
                total_episodes += data["next", "done"].sum()
        if max_length > 200 or time.time() - t0 > max_seconds:
            break
    collector.shutdown()
    t1 = time.time()
    print(f"solved after {total_count} steps, {total_episodes} episodes and in {t1 - t0:.1f}s: "
          f"longest episode {int(max_length)} steps")
    return {"max_length": int(max_length), "steps": total_count, "seconds": t1 - t0}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="tdrl-dqn-"))
