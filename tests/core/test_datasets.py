"""Offline datasets: D4RL-style HDF5 and Minari <-> tdrl transitions (issue #19, item 1).

The data is real: short runs of tdrl's GymWrapper on Gymnasium's Pendulum-v1 / CartPole-v1,
and one dataset written by minari's own DataCollector.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from tensordict import TensorDict

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:minari")

h5py = pytest.importorskip("h5py", reason='needs h5py: pip install "packages/core[offline]"')
gym = pytest.importorskip("gymnasium", reason='needs gymnasium: pip install "packages/core[gym]"')

from tdrl.core.datasets import (EPISODE, DatasetFormatError, load_d4rl, load_minari,  # noqa: E402
                                read_d4rl, read_minari, write_d4rl, write_minari)
from tdrl.core.envs.gym import GymWrapper  # noqa: E402
from tdrl.core.replay import MemmapStorage, ReplayBuffer, SliceSampler, TensorStorage  # noqa: E402

HAS_MINARI = importlib.util.find_spec("minari") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None
needs_minari = pytest.mark.skipif(
    not HAS_MINARI, reason='needs minari: pip install "packages/core[offline]"')

DATA_KEYS = ["observation", "action", EPISODE, ("next", "observation"), ("next", "reward"),
             ("next", "done"), ("next", "terminated"), ("next", "truncated")]


def tdrl_episodes(n_episodes: int = 3, max_steps: int = 7, seed: int = 0) -> TensorDict:
    """Random-policy Pendulum episodes from tdrl's GymWrapper, flattened, with ids."""
    env = GymWrapper(gym.make("Pendulum-v1", max_episode_steps=max_steps))
    env.set_seed(seed)
    torch.manual_seed(seed)
    parts = []
    for e in range(n_episodes):
        r = env.rollout(100, break_when_any_done=True)
        r[EPISODE] = torch.full(r.shape, e, dtype=torch.int64)
        parts.append(r.select(*DATA_KEYS))
    return torch.cat(parts, 0)


def assert_same(a: TensorDict, b: TensorDict) -> None:
    ka = sorted(map(str, a.keys(include_nested=True, leaves_only=True)))
    kb = sorted(map(str, b.keys(include_nested=True, leaves_only=True)))
    assert ka == kb
    for key in a.keys(include_nested=True, leaves_only=True):
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


# ----------------------------------------------------------------------------- D4RL
def test_d4rl_round_trip_identical(tmp_path):
    td = tdrl_episodes()
    path = tmp_path / "pendulum.hdf5"
    write_d4rl(td, path)
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == ["actions", "next_observations", "observations", "rewards",
                                    "terminals", "timeouts"]
        assert f["rewards"].shape == (21,) and f["timeouts"][:].sum() == 3
    back = read_d4rl(path)
    assert_same(td, back)
    assert back[EPISODE].tolist() == [0] * 7 + [1] * 7 + [2] * 7


def test_d4rl_into_memmap_storage_and_slices(tmp_path):
    td = tdrl_episodes()
    path = tmp_path / "pendulum.hdf5"
    write_d4rl(td, path)
    storage = load_d4rl(path, MemmapStorage(30, tmp_path / "mm"), chunk_size=5)
    assert len(storage) == 21 and storage.cursor == 21
    assert_same(td, storage.get(slice(0, 21)))
    reopened = MemmapStorage(30, tmp_path / "mm")  # the load was committed to disk
    assert len(reopened) == 21 and reopened.cursor == 21
    assert_same(td, reopened.get(slice(0, 21)))
    rb = ReplayBuffer(storage, SliceSampler(slice_len=7, traj_key=EPISODE), batch_size=14)
    batch = rb.sample()
    assert batch.shape == (2, 7)
    # every slice is one whole episode: constant id, only the last step done
    assert (batch[EPISODE] == batch[EPISODE][:, :1]).all()
    assert batch["next", "done"][:, :, 0].tolist() == [[False] * 6 + [True]] * 2


def test_d4rl_without_next_observations_by_hand(tmp_path):
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)  # row i = [2i, 2i+1]
    path = tmp_path / "raw.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = obs
        f["actions"] = np.arange(6, dtype=np.float32)[:, None]
        f["rewards"] = np.arange(6, dtype=np.float64) * 0.5
        f["terminals"] = np.array([0, 0, 1, 0, 0, 0], bool)
        f["timeouts"] = np.array([0, 0, 0, 0, 0, 1], bool)
    td = read_d4rl(path)
    # the timeout row 5 has no next observation in the file: dropped, row 4 ends truncated
    assert td.shape == (5,)
    assert td[EPISODE].tolist() == [0, 0, 0, 1, 1]
    assert torch.equal(td["observation"], torch.from_numpy(obs[:5]))
    assert torch.equal(td["next", "observation"], torch.from_numpy(obs[[1, 2, 2, 4, 5]]))
    assert td["next", "terminated"].view(-1).tolist() == [False, False, True, False, False]
    assert td["next", "truncated"].view(-1).tolist() == [False, False, False, False, True]
    assert td["next", "done"].view(-1).tolist() == [False, False, True, False, True]
    assert td["next", "reward"].dtype == torch.float32
    assert td["next", "reward"].view(-1).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    # chunked reading gives the same rows
    assert_same(td, read_d4rl(path, chunk_size=2))
    assert_same(td, load_d4rl(path, chunk_size=4).get(slice(0, 5)))


def test_d4rl_dict_observations_round_trip(tmp_path):
    td = tdrl_episodes(2, 4)
    for where in (td, td["next"]):
        where["achieved_goal"] = where["observation"][:, :2] * 2
        where["desired_goal"] = torch.ones(8, 2)
    path = tmp_path / "goals.hdf5"
    write_d4rl(td, path)
    with h5py.File(path, "r") as f:
        assert sorted(f["observations"].keys()) == ["achieved_goal", "desired_goal", "observation"]
    assert_same(td, read_d4rl(path))


def test_d4rl_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="No D4RL HDF5 file"):
        read_d4rl(tmp_path / "absent.hdf5")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(DatasetFormatError, match="not an HDF5 file"):
        read_d4rl(tmp_path / "text.hdf5")
    with h5py.File(tmp_path / "partial.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
        f["actions"] = np.zeros((3, 1), np.float32)
    with pytest.raises(DatasetFormatError, match=r"lacks \['rewards', 'terminals', 'timeouts'\]"):
        read_d4rl(tmp_path / "partial.hdf5")
    with h5py.File(tmp_path / "short.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
        f["actions"] = np.zeros((3, 1), np.float32)
        f["rewards"] = np.zeros(2)
        f["terminals"] = np.zeros(3, bool)
        f["timeouts"] = np.zeros(3, bool)
    with pytest.raises(DatasetFormatError, match=r"rewards has shape \(2,\), expected \(3,\)"):
        read_d4rl(tmp_path / "short.hdf5")
    td = tdrl_episodes(2, 3)
    with pytest.raises(ValueError, match="storage has max_size 4"):
        load_d4rl(_written(td, tmp_path / "ok.hdf5"), TensorStorage(4))
    with pytest.raises(DatasetFormatError, match="lack"):
        write_d4rl(td.exclude(EPISODE), tmp_path / "x.hdf5")
    td[EPISODE] = torch.tensor([0, 0, 1, 1, 0, 0])
    with pytest.raises(DatasetFormatError, match="consecutive"):
        write_d4rl(td, tmp_path / "x.hdf5")


def _written(td, path):
    write_d4rl(td, path)
    return path


def test_d4rl_cut_episode_is_written_as_timeout(tmp_path):
    td = tdrl_episodes(2, 5)
    td = torch.cat([td[:3], td[5:]], 0)  # episode 0 cut after 3 steps, then episode 1
    back = read_d4rl(_written(td, tmp_path / "cut.hdf5"))
    assert back[EPISODE].tolist() == [0] * 3 + [1] * 5
    assert back["next", "truncated"].view(-1).tolist() == [False, False, True] + [False] * 4 + [True]


# ----------------------------------------------------------------------------- Minari
@needs_minari
def test_minari_round_trip_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    td = tdrl_episodes()
    ds = write_minari(td, "tdrl/pendulum/random-v0", env="Pendulum-v1",
                      algorithm_name="random")
    assert ds.total_episodes == 3 and ds.total_steps == 21
    import minari

    ep = minari.load_dataset("tdrl/pendulum/random-v0")[1]
    assert ep.observations.shape == (8, 3) and len(ep) == 7
    assert np.array_equal(ep.observations[1:], td["next", "observation"][7:14].numpy())
    # by id, by folder and by object: the same transitions as written
    assert_same(td, read_minari("tdrl/pendulum/random-v0"))
    assert_same(td, read_minari(tmp_path / "tdrl" / "pendulum" / "random-v0"))
    assert_same(td, load_minari(ds, MemmapStorage(21, tmp_path / "mm")).get(slice(0, 21)))


@needs_minari
def test_minari_dict_observations_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    td = tdrl_episodes(2, 4)
    for where in (td, td["next"]):
        where["achieved_goal"] = where["observation"][:, :2].clone()
        where["desired_goal"] = torch.full((8, 2), 0.5)
    box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    space = gym.spaces.Dict({"observation": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                             "achieved_goal": box, "desired_goal": box})
    write_minari(td, "tdrl/goals-v0", observation_space=space,
                 action_space=gym.spaces.Box(-2, 2, (1,), np.float32))
    assert_same(td, read_minari("tdrl/goals-v0"))


@needs_minari
@pytest.mark.skipif(not HAS_JAX, reason='minari\'s DataCollector needs jax: pip install "minari[create]"')
def test_minari_data_collector_dataset_is_read(tmp_path, monkeypatch):
    """A dataset written by minari's own DataCollector: episodes, lengths, flags, values."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    from minari import DataCollector

    env = DataCollector(gym.make("CartPole-v1", max_episode_steps=12))
    rng = np.random.default_rng(0)
    seen = []  # what the env did, recorded beside the collector
    for e in range(5):
        obs, _ = env.reset(seed=e)
        steps = [obs]
        while True:
            obs, rew, term, trunc, _ = env.step(int(rng.integers(2)))
            steps.append(obs)
            if term or trunc:
                break
        seen.append((np.stack(steps), term, trunc))
    env.create_dataset("cartpole/collector-v0", algorithm_name="random")
    env.close()
    td = read_minari("cartpole/collector-v0")
    lengths = [len(s) - 1 for s, _, _ in seen]
    assert td.shape == (sum(lengths),)
    assert td[EPISODE].tolist() == sum(([e] * n for e, n in enumerate(lengths)), [])
    assert any(t for _, t, _ in seen) and any(t for _, _, t in seen)  # both kinds of end
    start = 0
    for e, (obs, term, trunc) in enumerate(seen):
        ep = td[start:start + lengths[e]]
        start += lengths[e]
        assert torch.equal(ep["observation"], torch.from_numpy(obs[:-1]))
        assert torch.equal(ep["next", "observation"], torch.from_numpy(obs[1:]))
        assert ep["next", "terminated"].view(-1).tolist() == [False] * (len(ep) - 1) + [term]
        assert ep["next", "truncated"].view(-1).tolist() == [False] * (len(ep) - 1) + [trunc]
        assert ep["next", "done"][-1].item() and not ep["next", "done"][:-1].any()
        assert (ep["next", "reward"] == 1.0).all() and ep["action"].dtype == torch.int64


@needs_minari
def test_minari_bad_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="downloads nothing"):
        read_minari("nobody/absent-v0")
    (tmp_path / "empty" / "data").mkdir(parents=True)
    with pytest.raises(DatasetFormatError, match="not a readable Minari dataset"):
        read_minari(tmp_path / "empty")
    with pytest.raises(ValueError, match="observation_space= and action_space="):
        write_minari(tdrl_episodes(1, 2), "tdrl/x-v0")


@pytest.mark.parametrize("module, call", [
    ("h5py", "from tdrl.core.datasets import read_d4rl; read_d4rl('x.hdf5')"),
    ("minari", "from tdrl.core.datasets import read_minari; read_minari('some-id-v0')"),
])
def test_a_missing_dependency_names_the_offline_extra(fresh_python, module, call):
    code = f"import sys\nsys.modules[{module!r}] = None\n{call}"
    proc = fresh_python.run(code, absent=[module], timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:"), proc.stderr[-2000:]
    assert 'pip install "packages/core[offline]"' in last
