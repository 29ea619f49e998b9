"""TorchRL's PPO MuJoCo script (sota-implementations/ppo/ppo_mujoco.py, Schulman et al. 2017's
settings), the same steps on tdrl; only the import lines differ. Run from this folder's
parent or anywhere, with Hydra's overrides:

    python apps/examples/torchrl_ppo_mujoco/ppo_mujoco.py env.env_name=InvertedPendulum-v5 \\
        collector.total_frames=20_000 hydra.run.dir=/tmp/ppo

The logger writes ``ppo/<exp_name>/metrics.csv`` in Hydra's run folder.
"""

from __future__ import annotations

import logging

import hydra

torchrl_logger = logging.getLogger("ppo_mujoco")


@hydra.main(config_path="", config_name="config_mujoco", version_base="1.1")
def main(cfg: "DictConfig"):  # noqa: F821
    import time

    import torch.optim
    import tqdm
    from tensordict import TensorDict

    from tdrl.core.collectors import Collector as SyncDataCollector
    from tdrl.core.modules import ExplorationType, set_exploration_type
    from tdrl.core.objectives import ClipPPOLoss
    from tdrl.core.replay import LazyMemmapStorage, TensorDictReplayBuffer
    from tdrl.core.replay import SamplerWithoutReplacement
    from tdrl.core.train import generate_exp_name, get_logger
    from tdrl.core.transforms import VideoRecorder
    from tdrl.core.values import GAE
    from utils_mujoco import eval_model, make_env, make_ppo_models

    device = "cpu" if not torch.cuda.device_count() else "cuda"
    num_mini_batches = cfg.collector.frames_per_batch // cfg.loss.mini_batch_size
    total_network_updates = (
        (cfg.collector.total_frames // cfg.collector.frames_per_batch) * cfg.loss.ppo_epochs * num_mini_batches
    )

    actor, critic = make_ppo_models(cfg.env.env_name, device=device)
    actor, critic = actor.to(device), critic.to(device)

    collector = SyncDataCollector(
        create_env_fn=make_env(cfg.env.env_name, device),
        policy=actor,
        frames_per_batch=cfg.collector.frames_per_batch,
        total_frames=cfg.collector.total_frames,
        device=device,
        storing_device=device,
        max_frames_per_traj=-1,
    )

    sampler = SamplerWithoutReplacement()
    data_buffer = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(cfg.collector.frames_per_batch),
        sampler=sampler,
        batch_size=cfg.loss.mini_batch_size,
    )

    adv_module = GAE(gamma=cfg.loss.gamma, lmbda=cfg.loss.gae_lambda, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(
        actor_network=actor,
        critic_network=critic,
        clip_epsilon=cfg.loss.clip_epsilon,
        loss_critic_type=cfg.loss.loss_critic_type,
        entropy_coef=cfg.loss.entropy_coef,
        critic_coef=cfg.loss.critic_coef,
        normalize_advantage=True,
    )

    actor_optim = torch.optim.Adam(actor.parameters(), lr=cfg.optim.lr, eps=1e-5)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=cfg.optim.lr, eps=1e-5)

    logger = None
    if cfg.logger.backend:
        exp_name = generate_exp_name("PPO", f"{cfg.logger.exp_name}_{cfg.env.env_name}")
        logger = get_logger(cfg.logger.backend, logger_name="ppo", experiment_name=exp_name)
        logger_video = cfg.logger.video
    else:
        logger_video = False

    test_env = make_env(cfg.env.env_name, device, from_pixels=logger_video)
    if logger_video:
        test_env = test_env.append_transform(VideoRecorder(logger, tag="rendering/test", in_keys=["pixels"]))
    test_env.eval()

    collected_frames = 0
    num_network_updates = 0
    start_time = time.time()
    pbar = tqdm.tqdm(total=cfg.collector.total_frames)
    sampling_start = time.time()

    cfg_loss_ppo_epochs = cfg.loss.ppo_epochs
    cfg_optim_anneal_lr = cfg.optim.anneal_lr
    cfg_optim_lr = cfg.optim.lr
    cfg_loss_anneal_clip_eps = cfg.loss.anneal_clip_epsilon
    cfg_loss_clip_epsilon = cfg.loss.clip_epsilon
    cfg_logger_test_interval = cfg.logger.test_interval
    cfg_logger_num_test_episodes = cfg.logger.num_test_episodes
    losses = TensorDict({}, batch_size=[cfg_loss_ppo_epochs, num_mini_batches])
    test_rewards = None

    for i, data in enumerate(collector):
        log_info = {}
        sampling_time = time.time() - sampling_start
        frames_in_batch = data.numel()
        collected_frames += frames_in_batch
        pbar.update(data.numel())

        episode_rewards = data["next", "episode_reward"][data["next", "done"]]
        if len(episode_rewards) > 0:
            episode_length = data["next", "step_count"][data["next", "done"]]
            log_info.update(
                {
                    "train/reward": episode_rewards.mean().item(),
                    "train/episode_length": episode_length.sum().item() / len(episode_length),
                }
            )

        training_start = time.time()
        for j in range(cfg_loss_ppo_epochs):
            with torch.no_grad():
                data = adv_module(data)
            data_reshape = data.reshape(-1)
            data_buffer.extend(data_reshape)

            for k, batch in enumerate(data_buffer):
                batch = batch.to(device)
                alpha = 1.0
                if cfg_optim_anneal_lr:
                    alpha = 1 - (num_network_updates / total_network_updates)
                    for group in actor_optim.param_groups:
                        group["lr"] = cfg_optim_lr * alpha
                    for group in critic_optim.param_groups:
                        group["lr"] = cfg_optim_lr * alpha
                if cfg_loss_anneal_clip_eps:
                    loss_module.clip_epsilon.copy_(cfg_loss_clip_epsilon * alpha)
                num_network_updates += 1

                loss = loss_module(batch)
                losses[j, k] = loss.select("loss_critic", "loss_entropy", "loss_objective").detach()
                critic_loss = loss["loss_critic"]
                actor_loss = loss["loss_objective"] + loss["loss_entropy"]

                actor_loss.backward()
                critic_loss.backward()

                actor_optim.step()
                critic_optim.step()
                actor_optim.zero_grad()
                critic_optim.zero_grad()

        training_time = time.time() - training_start
        losses_mean = losses.apply(lambda x: x.float().mean(), batch_size=[])
        for key, value in losses_mean.items():
            log_info.update({f"train/{key}": value.item()})
        log_info.update(
            {
                "train/lr": alpha * cfg_optim_lr,
                "train/sampling_time": sampling_time,
                "train/training_time": training_time,
                "train/clip_epsilon": alpha * cfg_loss_clip_epsilon
                if cfg_loss_anneal_clip_eps
                else cfg_loss_clip_epsilon,
            }
        )

        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            if ((i - 1) * frames_in_batch) // cfg_logger_test_interval < (i * frames_in_batch) // cfg_logger_test_interval:
                actor.eval()
                eval_start = time.time()
                test_rewards = eval_model(actor, test_env, num_episodes=cfg_logger_num_test_episodes)
                eval_time = time.time() - eval_start
                log_info.update({"eval/reward": test_rewards.mean(), "eval/time": eval_time})
                actor.train()

        if logger:
            for key, value in log_info.items():
                logger.log_scalar(key, value, collected_frames)

        collector.update_policy_weights_()
        sampling_start = time.time()

    collector.shutdown()
    if not test_env.is_closed:
        test_env.close()
    end_time = time.time()
    execution_time = end_time - start_time
    torchrl_logger.info(f"Training took {execution_time:.2f} seconds to finish")
    return test_rewards


if __name__ == "__main__":
    main()
