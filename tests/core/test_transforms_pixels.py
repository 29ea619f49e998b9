"""Pixel transforms (plain torch): hand-computed values on tiny images, the specs on an image
env, and the pipeline ToTensorImage -> GrayScale -> Resize -> CenterCrop -> CatFrames."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdrl.core.envs import EnvBase, check_env_specs
from tdrl.core.specs import Bounded, Composite, Unbounded
from tdrl.core.transforms import (
    CatFrames,
    CenterCrop,
    Compose,
    GrayScale,
    Resize,
    ToTensorImage,
    TransformedEnv,
)


class ImageEnv(EnvBase):
    """uint8 ``pixels`` (*batch, 6, 8, 3): pixel (h, w, c) = (10 h + w + c + t) % 256."""

    def __init__(self, batch_size=()):
        super().__init__(batch_size=batch_size)
        b = self.batch_size
        self.observation_spec = Composite(
            pixels=Bounded(0, 255, (*b, 6, 8, 3), dtype=torch.uint8),
            t=Unbounded((*b, 1), dtype=torch.int64), shape=b)
        self.action_spec = Bounded(-1.0, 1.0, (*b, 1))

    def _pixels(self, t):
        h, w, c = torch.meshgrid(torch.arange(6), torch.arange(8), torch.arange(3), indexing="ij")
        img = 10 * h + w + c
        return ((img + t.reshape(*t.shape[:-1], 1, 1, 1)) % 256).to(torch.uint8)

    def _reset(self, td, **kwargs):
        t = torch.zeros(*self.batch_size, 1, dtype=torch.int64)
        return TensorDict({"pixels": self._pixels(t), "t": t}, self.batch_size)

    def _step(self, td):
        t = td["t"] + 1
        f = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return TensorDict({"pixels": self._pixels(t), "t": t, "reward": torch.ones(*self.batch_size, 1),
                           "done": f, "terminated": f.clone(), "truncated": f.clone()}, self.batch_size)

    def _set_seed(self, seed):
        return seed


def test_to_tensor_image_hwc_uint8_to_chw_unit_float():
    x = torch.tensor([[[0, 255, 51]]], dtype=torch.uint8)  # H=1, W=1, C=3
    y = ToTensorImage()._apply_transform(x)
    assert y.shape == (3, 1, 1) and y.dtype == torch.float32
    assert y.flatten().tolist() == pytest.approx([0.0, 1.0, 0.2])
    env = TransformedEnv(ImageEnv((2,)), ToTensorImage())
    spec = env.observation_spec["pixels"]
    assert spec.shape == (2, 3, 6, 8) and spec.dtype == torch.float32
    td = env.reset()
    assert td["pixels"][0, 2, 1, 3].item() == pytest.approx((10 + 3 + 2) / 255)
    check_env_specs(env)


def test_grayscale_weights():
    x = torch.tensor([1.0, 0.5, 0.25]).reshape(3, 1, 1)
    assert GrayScale()._apply_transform(x).item() == pytest.approx(0.2989 + 0.2935 + 0.0285)
    with pytest.raises(ValueError, match="3 channels"):
        GrayScale()._apply_transform(torch.zeros(4, 2, 2))


def test_resize_nearest_and_bilinear():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    near = Resize(2, 2, interpolation="nearest")._apply_transform(x)
    assert near[0, 0].tolist() == [[0.0, 2.0], [8.0, 10.0]]  # every other row and column
    bil = Resize(2, interpolation="bilinear")._apply_transform(x)
    # antialiased 2x downsampling (as torchvision's default): a triangle filter of support 2
    # gives 1-d weights out0 = (3 x0 + 3 x1 + x2) / 7, out1 = (x1 + 3 x2 + 3 x3) / 7; the image
    # is col + 4 row, so out[i, j] = w_j([0, 1, 2, 3]) + 4 w_i([0, 1, 2, 3]) with w = 5/7, 16/7
    assert bil[0, 0].flatten().tolist() == pytest.approx([25 / 7, 36 / 7, 69 / 7, 80 / 7])
    up = Resize(3, 6)._apply_transform(torch.zeros(5, 2, 1, 4, 4))  # leading batch dims kept
    assert up.shape == (5, 2, 1, 3, 6)


def test_center_crop_offsets():
    x = torch.arange(30.0).reshape(1, 5, 6)  # C=1, H=5, W=6
    out = CenterCrop(3, 2)._apply_transform(x)  # rows 1..3, columns 2..3
    assert out[0].tolist() == [[8.0, 9.0], [14.0, 15.0], [20.0, 21.0]]
    with pytest.raises(ValueError, match="larger"):
        CenterCrop(7)._apply_transform(x)


def test_pixel_pipeline_on_an_image_env():
    env = TransformedEnv(ImageEnv((2,)), Compose(
        ToTensorImage(), GrayScale(), Resize(4, 4), CenterCrop(2), CatFrames(3, dim=-3, in_keys=["pixels"])))
    assert env.observation_spec["pixels"].shape == (2, 3, 2, 2)
    r = env.rollout(3)
    assert r["next", "pixels"].shape == (2, 3, 3, 2, 2)
    # the newest frame differs from the previous one by the time step (+1/255 on every pixel)
    diff = r["next", "pixels"][:, :, 2] - r["next", "pixels"][:, :, 1]
    assert torch.allclose(diff, torch.full_like(diff, 1 / 255), atol=1e-5)
    check_env_specs(env)
