"""TorchRL's getting-started tutorials 0-4 (environments, modules, losses, data collection and
storage, logging and videos), the same steps on tdrl, in TorchRL's spelling. Only the import lines differ from a
TorchRL script (the tdrl modules below instead of ``torchrl.*``; ``tensordict`` is the same
package). Tutorial 5, the first training loop, is ``torchrl_first_training_loop.py``.

    python apps/examples/torchrl_getting_started.py
"""

from __future__ import annotations

import tempfile

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.nn.distributions import NormalParamExtractor
from torch.distributions import Normal
from torch.optim import Adam

from tdrl.core.collectors import Collector as SyncDataCollector
from tdrl.core.envs import GymEnv, step_mdp
from tdrl.core.modules import MLP, Actor, EGreedyModule, ProbabilisticActor, QValueModule, RandomPolicy, ValueOperator
from tdrl.core.modules import ExplorationType, set_exploration_type
from tdrl.core.objectives import DDPGLoss, SoftUpdate
from tdrl.core.replay import LazyMemmapStorage, ReplayBuffer
from tdrl.core.train import CSVLogger
from tdrl.core.transforms import StepCounter, TransformedEnv, VideoRecorder


def environments() -> dict:
    """Tutorial 0: reset, a random step, ``step_mdp``, rollouts, a transform."""
    env = GymEnv("Pendulum-v1")
    reset = env.reset()
    reset_with_action = env.rand_action(reset)
    stepped_data = env.step(reset_with_action)
    data = step_mdp(stepped_data)
    rollout = env.rollout(max_steps=10)
    transition = rollout[3]
    transformed_env = TransformedEnv(env, StepCounter(max_steps=10))
    rollout_tr = transformed_env.rollout(max_steps=100)
    return {"data": data, "rollout": rollout, "transition": transition, "step_count": rollout_tr["next", "step_count"]}


def modules() -> dict:
    """Tutorial 1: TensorDict modules, actors, probabilistic actors, exploration, Q-values."""
    env = GymEnv("Pendulum-v1")
    module = torch.nn.LazyLinear(out_features=env.action_spec.shape[-1])
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    rollout = env.rollout(max_steps=10, policy=policy)

    policy = Actor(module)
    rollout = env.rollout(max_steps=10, policy=policy)

    module = MLP(out_features=env.action_spec.shape[-1], num_cells=[32, 64], activation_class=torch.nn.Tanh)
    policy = Actor(module)
    rollout = env.rollout(max_steps=10, policy=policy)

    backbone = MLP(in_features=3, out_features=2)
    extractor = NormalParamExtractor()
    module = torch.nn.Sequential(backbone, extractor)
    td_module = TensorDictModule(module, in_keys=["observation"], out_keys=["loc", "scale"])
    policy = ProbabilisticActor(td_module, in_keys=["loc", "scale"], out_keys=["action"],
                                distribution_class=Normal, return_log_prob=True)
    rollout = env.rollout(max_steps=10, policy=policy)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout_det = env.rollout(max_steps=10, policy=policy)
    with set_exploration_type(ExplorationType.RANDOM):
        rollout = env.rollout(max_steps=10, policy=policy)

    policy = Actor(MLP(3, 1, num_cells=[32, 64]))
    exploration_module = EGreedyModule(spec=env.action_spec, annealing_num_steps=1000, eps_init=0.5)
    exploration_policy = TensorDictSequential(policy, exploration_module)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout_greedy = env.rollout(max_steps=10, policy=exploration_policy)
    with set_exploration_type(ExplorationType.RANDOM):
        rollout = env.rollout(max_steps=10, policy=exploration_policy)

    env = GymEnv("CartPole-v1")
    num_actions = 2
    value_net = TensorDictModule(MLP(out_features=num_actions, num_cells=[32, 32]), in_keys=["observation"],
                                 out_keys=["action_value"])
    policy = TensorDictSequential(value_net, QValueModule(spec=env.action_spec))
    rollout_q = env.rollout(max_steps=3, policy=policy)
    policy_explore = TensorDictSequential(policy, EGreedyModule(env.action_spec))
    with set_exploration_type(ExplorationType.RANDOM):
        rollout_explore = env.rollout(max_steps=3, policy=policy_explore)
    return {"deterministic": rollout_det, "greedy": rollout_greedy, "explore": rollout, "q": rollout_q,
            "q_explore": rollout_explore}


def losses() -> dict:
    """Tutorial 2: a DDPG loss, its optimiser step and the target-network update."""
    env = GymEnv("Pendulum-v1")
    n_obs = env.observation_spec["observation"].shape[-1]
    n_act = env.action_spec.shape[-1]
    actor = Actor(MLP(in_features=n_obs, out_features=n_act, num_cells=[32, 32]))
    value_net = ValueOperator(MLP(in_features=n_obs + n_act, out_features=1, num_cells=[32, 32]),
                              in_keys=["observation", "action"])
    ddpg_loss = DDPGLoss(actor_network=actor, value_network=value_net)
    rollout = env.rollout(max_steps=100, policy=actor)
    loss_vals = ddpg_loss(rollout)
    total_loss = 0
    for key, val in loss_vals.items():
        if key.startswith("loss_"):
            total_loss += val
    optim = Adam(ddpg_loss.parameters())
    total_loss.backward()
    optim.step()
    optim.zero_grad()
    updater = SoftUpdate(ddpg_loss, eps=0.99)
    updater.step()
    return {"loss_vals": loss_vals, "total_loss": total_loss}


def collection() -> dict:
    """Tutorial 3: a collector with a random policy, its trajectory ids, a memory-mapped buffer."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    policy = RandomPolicy(env.action_spec)
    collector = SyncDataCollector(env, policy, frames_per_batch=200, total_frames=-1)
    for data in collector:
        break
    traj_ids = data["collector", "traj_ids"]
    buffer_scratch_dir = tempfile.TemporaryDirectory().name
    buffer = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000, scratch_dir=buffer_scratch_dir))
    indices = buffer.extend(data)
    assert len(buffer) == collector.frames_per_batch
    sample = buffer.sample(batch_size=30)
    collector.shutdown()
    return {"data": data, "traj_ids": traj_ids, "indices": indices, "sample": sample}


def logging_and_videos() -> dict:
    """Tutorial 4: a CSV logger, an env rendering pixels beside its state, a video recorder."""
    logger = CSVLogger(exp_name="my_exp")
    logger.log_scalar("my_scalar", 0.4)
    env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False)
    rollout = env.rollout(max_steps=3)
    recorder = VideoRecorder(logger, tag="my_video")
    record_env = TransformedEnv(env, recorder)
    rollout = record_env.rollout(max_steps=3)
    recorder.dump()
    return {"logger": logger, "rollout": rollout}


def main() -> dict:
    out = {"environments": environments(), "modules": modules(), "losses": losses(), "collection": collection(),
           "logging": logging_and_videos()}
    for part, results in out.items():
        print(part, ", ".join(results))
    return out


if __name__ == "__main__":
    main()
