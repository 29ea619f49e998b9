"""BraxEnv: Brax's jitted, vmapped physics as a tdrl env (the ``brax`` extra)."""

from __future__ import annotations

import os

import pytest
import torch

# one XLA thread, before JAX is first imported (the machine is shared)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
pytest.importorskip("brax", reason='needs brax: pip install "packages/core[brax]"')

from tdrl.core.envs import check_env_specs, make_env  # noqa: E402
from tdrl.core.envs.brax import BraxEnv  # noqa: E402

LIMIT = 15


@pytest.fixture(scope="module")
def env():
    """Brax's inverted pendulum (spring pipeline), 4 sub-envs, a 15-step time limit."""
    return BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=0)


def test_specs_and_the_data_contract(env):
    check_env_specs(env)
    td = env.reset()
    assert td["observation"].shape == (4, 4) and td["observation"].dtype == torch.float32
    assert env.action_spec.shape == (4, 1)
    assert float(env.action_spec.space.low.min()) == -1.0


def test_rollout_follows_the_physics_and_the_time_limit(env):
    """Brax's pendulum ends an episode when the pole leans past 0.2 rad (obs[1]) and pays 1
    per step; the time limit truncates after 15 steps; finished sub-envs restart alone."""
    torch.manual_seed(0)
    ro = env.rollout(60, break_when_any_done=False)
    nxt = ro["next"]
    angle = nxt["observation"][..., 1].abs()
    term, trunc = nxt["terminated"].squeeze(-1), nxt["truncated"].squeeze(-1)
    assert torch.equal(term, (angle > 0.2) & ~trunc)
    assert torch.equal(nxt["done"].squeeze(-1), term | trunc)
    assert torch.all(nxt["reward"] == 1.0)
    assert int(term.sum()) > 0 and int(trunc.sum()) > 0
    # episode lengths: every truncation comes exactly LIMIT steps after the last reset
    for b in range(4):
        length = 0
        for t in range(60):
            length += 1
            if bool(trunc[b, t]):
                assert length == LIMIT
            if bool(term[b, t] or trunc[b, t]):
                length = 0
            assert length < LIMIT
    # a reset row starts a fresh, upright episode: its observation is near the origin
    restarted = ro["observation"][:, 1:][(term | trunc)[:, :-1]]
    assert restarted.abs().max() < 0.05


def test_partial_reset_touches_only_the_masked_rows(env):
    td = env.reset()
    td["action"] = torch.full((4, 1), 0.7)
    td = env.step(td)["next"]
    before = td["observation"].clone()
    td["_reset"] = torch.tensor([[True], [False], [False], [True]])
    out = env.reset(td)
    assert torch.equal(out["observation"][1:3], before[1:3])
    assert not torch.equal(out["observation"][0], before[0])


def test_seeding_repeats_and_a_new_seed_differs(env):
    def run(seed):
        e = BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=seed)
        actions = torch.linspace(-1, 1, 4 * 20).reshape(20, 4, 1)
        td, obs = e.reset(), []
        for a in actions:
            td["action"] = a
            td, _ = e.step_and_maybe_reset(td)[1], None
            obs.append(td["observation"])
        return torch.stack(obs)

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    assert env.set_seed(7) == 8


def test_make_env_and_bad_input():
    env = make_env("brax/inverted_pendulum", num_envs=4, episode_length=LIMIT)
    assert isinstance(env, BraxEnv)
    with pytest.raises(ValueError, match="no environment 'pendulum'.*inverted_pendulum"):
        BraxEnv("pendulum", num_envs=2)
    with pytest.raises(ValueError, match="backend must be one of"):
        BraxEnv("inverted_pendulum", num_envs=2, backend="physx")
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        BraxEnv("inverted_pendulum", num_envs=0)
    fresh = BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT)
    td = fresh.full_action_spec.rand()
    with pytest.raises(RuntimeError, match="call reset"):
        fresh.step(td)


def test_fast_partial_reset_equals_the_generic_merge():
    """BraxEnv.reset's own partial reset (a flat CPU root) gives what EnvBase.reset's merge
    gives on the same state: fresh rows, kept rows, cleared flags, carried extra entries."""
    from tdrl.core.envs import EnvBase

    a, b = (BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=3) for _ in range(2))
    roots = []
    for e in (a, b):
        td = e.reset()
        td["action"] = torch.full((4, 1), 0.9)
        td = e.step(td)["next"]
        td["done"] = torch.tensor([[True], [False], [True], [False]])
        td["terminated"] = td["done"].clone()
        td["hidden"] = torch.arange(8.0).reshape(4, 2)  # e.g. a policy's recurrent state
        td["_reset"] = td["done"].clone()
        roots.append(td)
    fast = a.reset(roots[0])
    generic = EnvBase.reset(b, roots[1])
    assert set(fast.keys()) == set(generic.keys()) and "_reset" not in fast.keys()
    for key in generic.keys():
        assert torch.equal(fast[key], generic[key]), key
    assert not fast["done"].any() and torch.equal(fast["hidden"], roots[0]["hidden"])
    assert torch.equal(fast["observation"][[1, 3]], roots[0]["observation"][[1, 3]])
    assert not torch.equal(fast["observation"][[0, 2]], roots[0]["observation"][[0, 2]])


def test_fused_step_and_reset_equals_step_then_reset():
    """BraxEnv.step_and_maybe_reset (step and the done sub-envs' reset in one jitted call) gives
    the data of EnvBase's step, step_mdp, reset(mask=done), step after step."""
    from tdrl.core.envs import EnvBase

    a, b = (BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=5) for _ in range(2))
    ta, tb = a.reset(), b.reset()
    actions = torch.linspace(-1, 1, 4 * 40).reshape(40, 4, 1).flip(0)
    resets = 0
    for act in actions:
        ta["action"], tb["action"] = act, act.clone()
        sa, ta = a.step_and_maybe_reset(ta)
        sb, tb = EnvBase.step_and_maybe_reset(b, tb)
        resets += int(sb["next", "done"].sum())
        for key in sb.keys(True, True):
            assert torch.equal(sa[key], sb[key]), key
        assert set(ta.keys(True, True)) == set(tb.keys(True, True))
        for key in tb.keys(True, True):
            assert torch.equal(ta[key], tb[key]), key
    assert resets >= 4  # the time limit alone ends every sub-env's episode twice


def test_outputs_equal_brax_own_state_and_never_alias():
    """The unpacked step outputs (bytes of one packed array, copied into a row slab) equal
    Brax's own State fields, and a later step never changes an earlier step's tensors."""
    import numpy as np

    e = BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=1)
    td = e.reset()
    assert np.array_equal(td["observation"].numpy(), np.asarray(e.state.obs))
    kept, done_seen = [], 0
    for t in range(2 * LIMIT):
        td["action"] = torch.full((4, 1), 0.05 * (t % 3 - 1))
        nxt = e.step(td)["next"]
        s = e.state
        done = np.asarray(s.done) > 0
        trunc = (np.asarray(s.info["truncation"]) > 0) & done
        assert np.array_equal(nxt["observation"].numpy(), np.asarray(s.obs))
        assert np.array_equal(nxt["reward"].numpy()[:, 0], np.asarray(s.reward))
        assert np.array_equal(nxt["done"].numpy()[:, 0], done)
        assert np.array_equal(nxt["terminated"].numpy()[:, 0], done & ~trunc)
        assert np.array_equal(nxt["truncated"].numpy()[:, 0], trunc)
        assert e.last_any_done == bool(done.any())
        done_seen += int(done.sum())
        kept.append((nxt, {k: v.clone() for k, v in nxt.items()}))
        td = e.reset(nxt.set("_reset", nxt["done"].clone())) if done.any() else nxt
    assert done_seen >= 4
    for nxt, copy in kept:  # no step overwrote an earlier one's outputs
        for k, v in copy.items():
            assert torch.equal(nxt[k], v), k
    ptrs = [nxt["observation"].data_ptr() for nxt, _ in kept]
    assert len(set(ptrs)) == len(ptrs)


def test_fused_step_with_a_preset_next_and_dict_stepper_equal_the_generic_step():
    """The fused step's fallback (a root that already holds "next", e.g. a recurrent
    policy's next state) and dict_stepper give what EnvBase's step / step_and_maybe_reset give."""
    from tdrl.core.envs import EnvBase

    a, b, c = (BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=9) for _ in range(3))
    ta, tb = a.reset(), b.reset()
    rc = dict(c.reset().items())
    stepper = c.dict_stepper()
    assert stepper is not None
    actions = torch.linspace(-1, 1, 4 * 35).reshape(35, 4, 1)
    resets = 0
    for t, act in enumerate(actions):
        ta["action"], tb["action"], rc["action"] = act, act.clone(), act.clone()
        ta["next", "hidden"] = tb["next", "hidden"] = torch.full((4, 2), float(t))
        sa, ta = a.step_and_maybe_reset(ta)
        sb, tb = EnvBase.step_and_maybe_reset(b, tb)
        nc, any_done = stepper(rc)
        for key in sb.keys(True, True):
            assert torch.equal(sa[key], sb[key]), key
        assert set(ta.keys(True, True)) == set(tb.keys(True, True)) and "hidden" in ta.keys()
        for key in tb.keys(True, True):
            assert torch.equal(ta[key], tb[key]), key
        assert set(nc) == set(sb["next"].keys()) - {"hidden"}
        for key, value in nc.items():
            assert torch.equal(value, sb["next", key]), key
        assert any_done == bool(sb["next", "done"].any())
        resets += int(sb["next", "done"].sum())
        rc = dict(c.reset(c._make_td({**{k: v for k, v in nc.items() if k != "reward"},
                                     "_reset": nc["done"].clone()})).items()) if any_done else nc
    assert resets >= 4


def test_collector_dict_loop_equals_the_generic_loop():
    """A Collector runs BraxEnv through its dict_stepper (the dict loop): the same batches as
    the generic loop (episodes end and sub-envs reset inside the batches)."""
    from tensordict.nn import TensorDictModule

    from tdrl.core.collectors import Collector

    def collect(dict_loop):
        torch.manual_seed(0)
        policy = TensorDictModule(torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Tanh()),
                                  ["observation"], ["action"])
        col = Collector(BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=2),
                        policy, frames_per_batch=4 * 20, seed=2)
        col._dict_loop = dict_loop
        it = iter(col)
        batches = [next(it) for _ in range(2)]
        return batches, col

    fast, fast_col = collect(True)
    slow, _ = collect(False)
    assert fast_col._dict_plan(fast_col._td) is not None  # the dict loop did run
    assert int(torch.cat([b["next", "done"] for b in slow]).sum()) >= 4
    for a, b in zip(fast, slow):
        assert list(a.keys(True, True)) == list(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


def test_state_packer_round_trips_mixed_leaves():
    """_StatePacker: leaves of several dtypes and shapes, and leaves without the batch
    dimension, come back unchanged from their packed arrays (one per dtype, then the rest)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tdrl.core.envs.brax import _StatePacker

    b = 3
    leaves = [jnp.arange(b * 2, dtype=jnp.float32).reshape(b, 2), jnp.arange(b, dtype=jnp.int32),
              jnp.ones((b, 2, 2), jnp.float32) * 7, jnp.array([[True], [False], [True]]),
              jnp.float32(0.5), jnp.arange(4, dtype=jnp.float32)]  # the last two: no batch dim
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    packer = _StatePacker(specs, b, obs_leaf=2)
    packed = packer.pack(leaves)
    assert [tuple(x.shape) for x in packed] == [(b, 6), (b, 1), (b, 1), (), (4,)]
    assert [x.dtype for x in packed] == [jnp.float32, jnp.int32, jnp.bool_, jnp.float32, jnp.float32]
    for got, want in zip(packer.unpack(packed), leaves, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.array_equal(np.asarray(got), np.asarray(want))
    obs = packer.observation(packed)
    assert obs.flags.writeable and np.array_equal(obs, np.full((b, 2, 2), 7, np.float32))


def test_steps_equal_brax_own_jitted_step():
    """20 steps of BraxEnv (its state packed, donated) and of Brax's own jitted step of the
    same wrapped env from the same state, with the same actions: the same observations,
    rewards, done flags and final state, leaf by leaf."""
    import jax
    import numpy as np
    from brax import envs
    from brax.envs.wrappers.training import EpisodeWrapper, VmapWrapper

    e = BraxEnv("inverted_pendulum", num_envs=4, episode_length=LIMIT, seed=2)
    td = e.reset()
    brax_env = VmapWrapper(EpisodeWrapper(envs.get_environment("inverted_pendulum", backend="spring"),
                                          LIMIT, 1))
    step = jax.jit(brax_env.step)
    state = e.state
    for t in range(20):
        action = torch.linspace(-1, 1, 4).reshape(4, 1) * (0.3 if t % 2 else -0.2)
        td["action"] = action
        nxt = e.step(td)["next"]
        state = step(state, action.numpy())
        assert np.allclose(nxt["observation"].numpy(), np.asarray(state.obs), atol=1e-6), t
        assert np.allclose(nxt["reward"].numpy()[:, 0], np.asarray(state.reward)), t
        assert np.array_equal(nxt["done"].numpy()[:, 0], np.asarray(state.done) > 0), t
        td = nxt
    for ours, theirs in zip(jax.tree.leaves(e.state), jax.tree.leaves(state), strict=True):
        assert ours.shape == theirs.shape
        assert np.allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5)
