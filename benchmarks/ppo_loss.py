"""One PPO epoch on the CPU: tdrl PPOLoss vs TorchRL ClipPPOLoss vs plain torch.

Run (one torch thread, in the peers venv)::

    flock /tmp/tdrl-cpu.lock .venv-bench/bin/python -m benchmarks.ppo_loss

An epoch: 65,536 transitions (obs 17, act 6), shuffled into minibatches of 4,096; for each
minibatch the clipped surrogate + value loss + entropy bonus, backward, Adam step. The
three contenders use the same networks (actor 17-64-64-6 + state-independent log-std,
critic 17-64-64-1, tanh) and the same data. Prints the median epoch time of each and the
ratios ours/TorchRL and ours/plain-torch.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

OBS, ACT, N, MB = 17, 6, 65_536, 4_096
CLIP, ENT, VF = 0.2, 0.01, 0.5


class ActorNet(nn.Module):
    """Gaussian policy parameters: ``loc`` from an MLP, ``scale`` from a free log-std."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Sequential(
            nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, ACT)
        )
        self.log_std = nn.Parameter(torch.zeros(ACT))

    def forward(self, obs):
        loc = self.mean(obs)
        return loc, self.log_std.exp().expand_as(loc)


def critic_net() -> nn.Module:
    return nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def make_data(actor: ActorNet) -> dict:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(N, OBS, generator=g)
    with torch.no_grad():
        loc, scale = actor(obs)
        dist = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)
        action = dist.sample()
        logp = dist.log_prob(action)
    return {
        "observation": obs,
        "action": action,
        "action_log_prob": logp,
        "advantage": torch.randn(N, 1, generator=g),
        "value_target": torch.randn(N, 1, generator=g),
        "state_value": torch.randn(N, 1, generator=g),
    }


def plain_torch_epoch(actor, critic, opt, data):
    """Reference: a minimal hand-written PPO loss on tensors (CleanRL style)."""
    perm = torch.randperm(N)
    for i in range(0, N, MB):
        idx = perm[i : i + MB]
        obs, act = data["observation"][idx], data["action"][idx]
        old_lp, adv = data["action_log_prob"][idx], data["advantage"][idx].squeeze(-1)
        target = data["value_target"][idx]
        loc, scale = actor(obs)
        dist = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)
        ratio = (dist.log_prob(act) - old_lp).exp()
        pg = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv).mean()
        v_loss = 0.5 * (critic(obs) - target).pow(2).mean()
        loss = pg + VF * v_loss - ENT * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def tdrl_setup(actor_net, critic):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    from tdrl.core.modules import IndependentNormal, ProbabilisticActor, ValueOperator
    from tdrl.core.objectives import PPOLoss, total_loss

    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        IndependentNormal,
    )
    loss = PPOLoss(actor, ValueOperator(critic), clip_epsilon=CLIP, entropy_coef=ENT,
                   critic_coef=VF)

    def epoch(opt, data):
        td = TensorDict(data, batch_size=[N])
        perm = torch.randperm(N)
        for i in range(0, N, MB):
            out = loss(td[perm[i : i + MB]])
            opt.zero_grad()
            total_loss(out).backward()
            opt.step()

    return loss, epoch


def torchrl_setup(actor_net, critic):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss

    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    loss = ClipPPOLoss(actor, ValueOperator(critic, in_keys=["observation"]),
                       clip_epsilon=CLIP, entropy_coeff=ENT, critic_coeff=VF,
                       loss_critic_type="l2", normalize_advantage=False)

    def epoch(opt, data):
        td = TensorDict({**data, "sample_log_prob": data["action_log_prob"]}, batch_size=[N])
        perm = torch.randperm(N)
        for i in range(0, N, MB):
            out = loss(td[perm[i : i + MB]])
            total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
            opt.zero_grad()
            total.backward()
            opt.step()

    return loss, epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    base_actor, base_critic = ActorNet(), critic_net()
    data = make_data(base_actor)

    def fresh():
        a, c = ActorNet(), critic_net()
        a.load_state_dict(base_actor.state_dict())
        c.load_state_dict(base_critic.state_dict())
        return a, c

    runs = {}
    a, c = fresh()
    opt = torch.optim.Adam([*a.parameters(), *c.parameters()], lr=3e-4)
    runs["plain torch"] = lambda: plain_torch_epoch(a, c, opt, data)
    a2, c2 = fresh()
    loss2, epoch2 = tdrl_setup(a2, c2)
    opt2 = torch.optim.Adam(loss2.parameters(), lr=3e-4)
    runs["tdrl PPOLoss"] = lambda: epoch2(opt2, data)
    try:
        import torchrl

        a3, c3 = fresh()
        loss3, epoch3 = torchrl_setup(a3, c3)
        opt3 = torch.optim.Adam(loss3.parameters(), lr=3e-4)
        runs[f"torchrl {torchrl.__version__} ClipPPOLoss"] = lambda: epoch3(opt3, data)
    except ImportError:
        pass

    # interleave the contenders so that machine load affects them alike
    times = {name: [] for name in runs}
    for name, fn in runs.items():
        fn()  # warm-up
    for _ in range(args.repeat):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    print(f"PPO epoch: {N} transitions, minibatch {MB}, obs {OBS}, act {ACT}, 64x64 tanh nets, "
          f"1 thread, median of {args.repeat}")
    for name, ms in med.items():
        print(f"  {name:<32s} {ms:9.1f} ms/epoch")
    ours = med["tdrl PPOLoss"]
    print(f"  tdrl / plain torch      = {ours / med['plain torch']:.3f}  (target <= 1.15)")
    peer = [n for n in med if n.startswith("torchrl")]
    if peer:
        print(f"  tdrl / TorchRL          = {ours / med[peer[0]]:.3f}  (target <= 1.00)")
    else:
        print("  TorchRL not importable: run with .venv-bench/bin/python for the comparison.")


if __name__ == "__main__":
    main()
