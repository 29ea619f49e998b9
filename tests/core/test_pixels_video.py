"""Pixels from Gymnasium and MuJoCo renders (``GymEnv(from_pixels=True)``), the pixel pipeline to
a stacked, resized, grayscale uint8 observation, and ``VideoRecorder`` writing a real video file
through ``CSVLogger`` (issue 40)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tdrl.core.collectors import Collector
from tdrl.core.envs import GymEnv
from tdrl.core.train import CSVLogger, generate_exp_name, get_logger
from tdrl.core.transforms import CatFrames, Compose, GrayScale, Resize, ToTensorImage, TransformedEnv, VideoRecorder

PIL = pytest.importorskip("PIL.Image", reason="writing a GIF needs Pillow (pip install -r requirements/test.txt)")


def test_pixels_are_the_render_of_the_state():
    env = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False)
    env.set_seed(0)
    td = env.reset()
    frame = env.env.render()
    assert torch.equal(td["pixels"], torch.as_tensor(frame))  # the frame of the state just reset to
    assert td["observation"].shape == (4,)
    only = GymEnv("CartPole-v1", from_pixels=True)
    assert set(only.observation_spec.keys()) == {"pixels"}  # TorchRL's pixels_only=True default
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        GymEnv("CartPole-v1", from_pixels=True, render_mode="human")
    assert set(GymEnv("CartPole-v1", pixels_only=False).observation_spec.keys()) == {"observation"}


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs mujoco (requirements/test.txt)")
def test_a_mujoco_render_through_the_pixel_pipeline_to_stacked_grayscale_uint8():
    try:
        env = GymEnv("InvertedPendulum-v5", from_pixels=True, width=64, height=64)
        env.reset()
    except Exception as err:  # no OpenGL context on this machine (EGL / OSMesa missing)
        pytest.skip(f"MuJoCo cannot render here: {type(err).__name__}: {err}")
    t = Compose(ToTensorImage(from_int=True), Resize(32, 32), GrayScale(),
                CatFrames(N=4, dim=-3, in_keys=["pixels"]))
    penv = TransformedEnv(env, t)
    out = penv.rollout(5, break_when_any_done=False)  # random actions end an episode within a few steps
    assert out["pixels"].shape == (5, 4, 32, 32) and out["pixels"].dtype == torch.float32
    u8 = (out["pixels"] * 255).round().to(torch.uint8)
    assert u8.max() > u8.min()  # a real picture, not a constant
    assert penv.observation_spec["pixels"].shape == (4, 32, 32)


def test_the_pixel_pipeline_on_a_classic_control_render_is_on_the_collectors_fast_path():
    env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True),
                         Compose(ToTensorImage(), Resize(40, 60), GrayScale(), CatFrames(N=3, dim=-3, in_keys=["pixels"])))
    batch = next(iter(Collector(env, None, frames_per_batch=6, total_frames=6)))
    assert batch["pixels"].shape == (6, 3, 40, 60) and batch["next", "pixels"].shape == (6, 3, 40, 60)
    # the stack of frame t+1 ends with frame t+1 and starts with the frames before it
    assert torch.equal(batch["next", "pixels"][0, :-1], batch["pixels"][0, 1:])


def test_video_recorder_writes_a_gif_of_the_frames_it_kept(tmp_path):
    logger = get_logger("csv", logger_name=str(tmp_path), experiment_name=generate_exp_name("DQN", "cartpole"))
    recorder = VideoRecorder(logger, tag="episode", skip=2, fps=10)
    env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True, pixels_only=False), recorder)
    env.set_seed(0)
    env.rollout(max_steps=9)  # reset + 9 steps = 10 frames, one in two kept
    assert len(recorder.frames) == 5 and recorder.frames[0].dtype == torch.uint8
    kept = torch.stack(recorder.frames)
    recorder.dump()
    assert recorder.frames == []
    gifs = list(tmp_path.rglob("episode_0.gif"))
    assert len(gifs) == 1
    with PIL.open(gifs[0]) as im:
        assert im.size == (600, 400) and im.info["duration"] % 100 == 0  # 10 fps (Pillow merges equal frames)
        im.seek(0)
        first = torch.as_tensor(list(im.convert("RGB").getdata()), dtype=torch.int16).reshape(400, 600, 3)
    # GIF is paletted: the first frame matches the recorded one up to the palette's rounding
    assert (first - kept[0].to(torch.int16)).abs().float().mean() < 8


def test_video_recorder_and_logger_refusals(tmp_path):
    class NoVideo:
        def log_scalar(self, *a):
            pass

    with pytest.raises(TypeError, match="cannot write videos"):
        VideoRecorder(NoVideo(), tag="x")
    with pytest.raises(ValueError, match="CenterCrop"):
        VideoRecorder(CSVLogger(tmp_path), tag="x", center_crop=64)
    with pytest.raises(ValueError, match="video_format"):
        CSVLogger(tmp_path, video_format="mp4")
    with pytest.raises(ValueError, match=r"\[T, H, W, C\]"):
        CSVLogger(tmp_path).log_video("v", torch.zeros(3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="logger_type"):
        get_logger("mlflow", "x", "y")
    path = CSVLogger(tmp_path, video_format="pt").log_video("v", torch.rand(2, 3, 4, 5), step=3)
    frames = torch.load(path)
    assert path.name == "v_3.pt" and frames.shape == (2, 4, 5, 3) and frames.dtype == torch.uint8
