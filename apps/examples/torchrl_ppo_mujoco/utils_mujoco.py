"""The helpers of TorchRL's PPO MuJoCo script (its ``utils_mujoco.py``: the env, the models,
evaluation), the same steps on tdrl; only the import lines differ."""

from __future__ import annotations

import torch
import torch.nn
from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule

from tdrl.core.envs import GymEnv
from tdrl.core.modules import MLP, ExplorationType, ProbabilisticActor, TanhNormal, ValueOperator
from tdrl.core.transforms import ClipTransform, DoubleToFloat, RewardSum, StepCounter, TransformedEnv, VecNorm
from tdrl.core.transforms import VideoRecorder


def make_env(env_name="HalfCheetah-v4", device="cpu", from_pixels: bool = False):
    env = GymEnv(env_name, device=device, from_pixels=from_pixels, pixels_only=False)
    env = TransformedEnv(env)
    env.append_transform(VecNorm(in_keys=["observation"], decay=0.99999, eps=1e-2))
    env.append_transform(ClipTransform(in_keys=["observation"], low=-10, high=10))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    env.append_transform(DoubleToFloat(in_keys=["observation"]))
    return env


def make_ppo_models_state(proof_environment, device):
    input_shape = proof_environment.observation_spec["observation"].shape
    num_outputs = proof_environment.action_spec_unbatched.shape[-1]
    distribution_class = TanhNormal
    distribution_kwargs = {
        "low": proof_environment.action_spec_unbatched.space.low.to(device),
        "high": proof_environment.action_spec_unbatched.space.high.to(device),
        "tanh_loc": False,
    }

    policy_mlp = MLP(in_features=input_shape[-1], activation_class=torch.nn.Tanh, out_features=num_outputs,
                     num_cells=[64, 64], device=device)
    for layer in policy_mlp.modules():
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.orthogonal_(layer.weight, 1.0)
            layer.bias.data.zero_()
    policy_mlp = torch.nn.Sequential(
        policy_mlp,
        AddStateIndependentNormalScale(proof_environment.action_spec_unbatched.shape[-1], scale_lb=1e-8).to(device),
    )
    policy_module = ProbabilisticActor(
        TensorDictModule(module=policy_mlp, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=proof_environment.full_action_spec_unbatched.to(device),
        distribution_class=distribution_class,
        distribution_kwargs=distribution_kwargs,
        return_log_prob=True,
        default_interaction_type=ExplorationType.RANDOM,
    )

    value_mlp = MLP(in_features=input_shape[-1], activation_class=torch.nn.Tanh, out_features=1,
                    num_cells=[64, 64], device=device)
    for layer in value_mlp.modules():
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.orthogonal_(layer.weight, 0.01)
            layer.bias.data.zero_()
    value_module = ValueOperator(value_mlp, in_keys=["observation"])
    return policy_module, value_module


def make_ppo_models(env_name, device):
    proof_environment = make_env(env_name, device=device)
    actor, critic = make_ppo_models_state(proof_environment, device=device)
    return actor, critic


def dump_video(module):
    if isinstance(module, VideoRecorder):
        module.dump()


def eval_model(actor, test_env, num_episodes=3):
    test_rewards = []
    for _ in range(num_episodes):
        td_test = test_env.rollout(policy=actor, auto_reset=True, auto_cast_to_device=True,
                                   break_when_any_done=True, max_steps=10_000_000)
        reward = td_test["next", "episode_reward"][td_test["next", "done"]]
        test_rewards.append(reward.cpu())
        test_env.apply(dump_video)
    del td_test
    return torch.cat(test_rewards, 0).mean()
