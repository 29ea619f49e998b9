"""Image transforms in plain torch (no torchvision): ``ToTensorImage`` (uint8 ``H, W, C`` to
float ``C, H, W`` in ``[0, 1]``), ``Resize``, ``GrayScale`` and ``CenterCrop``, each over any
number of leading batch dims."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..specs import Bounded, Composite, Unbounded
from ..specs._base import TensorSpec
from .base import Transform

__all__ = ["ToTensorImage", "Resize", "GrayScale", "CenterCrop", "Crop", "VideoRecorder"]

PIXELS = "pixels"


def _image_spec(leaf: TensorSpec, shape, dtype=None) -> TensorSpec:
    dtype = dtype or leaf.dtype
    if isinstance(leaf, Bounded):
        low, high = leaf.low.min(), leaf.high.max()
        return Bounded(low.to(dtype), high.to(dtype), shape, leaf.device, dtype)
    return Unbounded(shape, leaf.device, dtype)


class _Image(Transform):
    """Shared: ``_apply_transform`` on data; ``_out_shape`` on each spec leaf."""

    def __init__(self, in_keys, out_keys) -> None:
        super().__init__(in_keys or [PIXELS], out_keys)

    def _out_shape(self, shape: torch.Size) -> tuple:
        return tuple(self._apply_transform(torch.zeros(shape, device="meta")).shape)

    def transform_observation_spec(self, spec: Composite) -> Composite:
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                spec[k_out] = _image_spec(leaf, self._out_shape(leaf.shape))
        return spec


class ToTensorImage(_Image):
    """uint8 images ``(*, H, W, C)`` in ``[0, 255]`` to float ``(*, C, H, W)`` in ``[0, 1]``.

    Args:
        from_int: divide by 255 (default: when the input is an integer dtype; a bool image, such
            as MinAtar's grids, is already 0 / 1 and is not scaled).
        unsqueeze: add a leading dim to a single ``H, W, C`` image (kept for TorchRL's keyword).
        dtype: the output dtype (default float32).
        in_keys, out_keys: keys (default ``["pixels"]``).
    """

    def __init__(self, from_int: bool | None = None, unsqueeze: bool = False,
                 dtype: torch.dtype = torch.float32, in_keys: Sequence | None = None,
                 out_keys: Sequence | None = None) -> None:
        super().__init__(in_keys, out_keys)
        self.from_int, self.unsqueeze, self.dtype = from_int, unsqueeze, dtype

    def _apply_transform(self, x):
        scale = self.from_int if self.from_int is not None else not (x.dtype.is_floating_point or x.dtype == torch.bool)
        x = x.movedim(-1, -3).to(self.dtype)
        if scale:
            x = x / 255.0
        return x.unsqueeze(0) if self.unsqueeze and x.ndim == 3 else x

    def transform_observation_spec(self, spec):
        for k_in, k_out in zip(self.in_keys, self.out_keys, strict=True):
            if k_in in spec:
                leaf = spec[k_in]
                shape = self._out_shape(leaf.shape)
                spec[k_out] = Bounded(0.0, 1.0, shape, leaf.device, self.dtype)
        return spec


class Resize(_Image):
    """Resize images ``(*, C, H, W)`` to ``(*, C, w, h)`` (TorchRL's order: ``w`` is the new
    height dim's size) with ``torch.nn.functional.interpolate``.

    Args:
        w, h: the new sizes of dims -2 and -1 (``h`` defaults to ``w``).
        interpolation: ``"bilinear"`` (default), ``"nearest"``, ``"bicubic"``...
        in_keys, out_keys: keys (default ``["pixels"]``).
    """

    def __init__(self, w: int, h: int | None = None, interpolation: str = "bilinear",
                 in_keys: Sequence | None = None, out_keys: Sequence | None = None) -> None:
        super().__init__(in_keys, out_keys)
        self.w, self.h = int(w), int(h if h is not None else w)
        self.interpolation = interpolation

    def _apply_transform(self, x):
        lead = x.shape[:-3]
        flat = x.reshape(-1, *x.shape[-3:])
        dtype = flat.dtype
        kwargs = {"align_corners": False} if self.interpolation in ("bilinear", "bicubic") else {}
        if flat.device.type != "meta" and flat.numel():
            out = F.interpolate(flat.float(), size=(self.w, self.h), mode=self.interpolation,
                                **({"antialias": True} if kwargs else {}), **kwargs)
        else:
            out = flat.float().new_empty((flat.shape[0], flat.shape[1], self.w, self.h))
        if not dtype.is_floating_point:
            out = out.round().clamp(torch.iinfo(dtype).min, torch.iinfo(dtype).max)
        return out.to(dtype).reshape(*lead, *out.shape[-3:])

    def extra_repr(self) -> str:
        return f"w={self.w}, h={self.h}, interpolation={self.interpolation!r}"


class GrayScale(_Image):
    """RGB images ``(*, 3, H, W)`` to one channel ``(*, 1, H, W)``:
    ``0.2989 R + 0.587 G + 0.114 B`` (ITU-R 601-2 luma, as torchvision).

    Args:
        in_keys, out_keys: keys (default ``["pixels"]``).
    """

    def __init__(self, in_keys: Sequence | None = None, out_keys: Sequence | None = None) -> None:
        super().__init__(in_keys, out_keys)

    def _apply_transform(self, x):
        if x.shape[-3] != 3:
            raise ValueError(f"GrayScale needs 3 channels at dim -3, got shape {tuple(x.shape)}.")
        r, g, b = x.unbind(-3)
        out = (0.2989 * r.float() + 0.587 * g.float() + 0.114 * b.float()).unsqueeze(-3)
        return out.to(x.dtype) if x.dtype.is_floating_point else out.round().to(x.dtype)


class CenterCrop(_Image):
    """Crop the centre ``(w, h)`` of images ``(*, C, H, W)`` (dims -2, -1, TorchRL's order);
    the offsets are ``round((H - w) / 2)`` and ``round((W - h) / 2)``, as torchvision.

    Args:
        w, h: the crop sizes of dims -2 and -1 (``h`` defaults to ``w``).
        in_keys, out_keys: keys (default ``["pixels"]``).
    """

    def __init__(self, w: int, h: int | None = None, in_keys: Sequence | None = None,
                 out_keys: Sequence | None = None) -> None:
        super().__init__(in_keys, out_keys)
        self.w, self.h = int(w), int(h if h is not None else w)

    def _apply_transform(self, x):
        H, W = x.shape[-2:]
        if self.w > H or self.h > W:
            raise ValueError(f"CenterCrop({self.w}, {self.h}) is larger than the image {H}x{W}.")
        top, left = int(round((H - self.w) / 2.0)), int(round((W - self.h) / 2.0))
        return x[..., top:top + self.w, left:left + self.h]

    def extra_repr(self) -> str:
        return f"w={self.w}, h={self.h}"


class Crop(_Image):
    """Crop ``(w, h)`` of images ``(*, C, H, W)`` starting at row ``top`` and column ``left``
    (TorchRL's ``Crop``; dims -2, -1).

    Args:
        w, h: the crop sizes of dims -2 and -1 (``h`` defaults to ``w``).
        top, left: the first row and column kept (default 0).
        in_keys, out_keys: keys (default ``["pixels"]``).
    """

    def __init__(self, w: int, h: int | None = None, top: int = 0, left: int = 0,
                 in_keys: Sequence | None = None, out_keys: Sequence | None = None) -> None:
        super().__init__(in_keys, out_keys)
        self.w, self.h = int(w), int(h if h is not None else w)
        self.top, self.left = int(top), int(left)
        if min(self.top, self.left) < 0:
            raise ValueError(f"Crop: top and left must be >= 0, got {self.top}, {self.left}")

    def _apply_transform(self, x):
        H, W = x.shape[-2:]
        if self.top + self.w > H or self.left + self.h > W:
            raise ValueError(f"Crop({self.w}, {self.h}, top={self.top}, left={self.left}) leaves the image {H}x{W}.")
        return x[..., self.top:self.top + self.w, self.left:self.left + self.h]

    def extra_repr(self) -> str:
        return f"w={self.w}, h={self.h}, top={self.top}, left={self.left}"


class VideoRecorder(Transform):
    """Records the frames an env returns and writes them as a video through a logger
    (``logger.log_video``; :class:`~tdrl.core.train.CSVLogger` writes a GIF file).

    Frames are read from ``in_keys[0]`` at every reset and step (uint8 ``(*, H, W, C)`` or
    float ``(*, C, H, W)`` in ``[0, 1]``); with batch dims, the first sub-env's frame is kept.
    Every ``skip``-th frame is stored; :meth:`dump` writes the stored frames as one video and
    empties the store. The data passes through unchanged.

    Args:
        logger: a logger with ``log_video(name, frames, step, fps=)``.
        tag: the video's name.
        in_keys: the frame key (default ``["pixels"]``).
        skip: keep one frame in ``skip`` (TorchRL's default 2).
        fps: frames per second of the written video (default: the logger's).
        max_frames: frames kept before the oldest are dropped (caps memory).
    """

    def __init__(self, logger, tag: str, in_keys: Sequence | None = None, skip: int = 2, fps: int | None = None,
                 max_frames: int = 10_000, **torchrl_kwargs) -> None:
        unknown = set(torchrl_kwargs) - {"make_grid", "center_crop"}
        if unknown:
            raise TypeError(f"VideoRecorder: unknown keywords {sorted(unknown)}")
        if torchrl_kwargs.get("center_crop") is not None:
            raise ValueError("VideoRecorder(center_crop=...): put a CenterCrop transform before the recorder")
        if not hasattr(logger, "log_video"):
            raise TypeError(f"{type(logger).__name__} cannot write videos (no log_video): use CSVLogger")
        if skip < 1:
            raise ValueError(f"VideoRecorder: skip must be >= 1, got {skip}")
        super().__init__(in_keys or [PIXELS], None)
        self.logger, self.tag, self.skip, self.fps, self.max_frames = logger, tag, int(skip), fps, int(max_frames)
        self.frames: list[torch.Tensor] = []
        self.count = 0
        self.dumps = 0

    def _record(self, td):
        frame = td.get(self.in_keys[0], None)
        if frame is None:
            return td
        self.count += 1
        if (self.count - 1) % self.skip:
            return td
        channels_last = not frame.dtype.is_floating_point
        lead = frame.ndim - 3
        frame = frame.reshape(-1, *frame.shape[lead:])[0] if lead > 0 else frame
        if not channels_last:
            frame = (frame.clamp(0, 1) * 255).round().to(torch.uint8).movedim(-3, -1)
        self.frames.append(frame.detach().to("cpu", copy=True))
        if len(self.frames) > self.max_frames:
            self.frames.pop(0)
        return td

    def _step(self, td, next_td):
        return self._record(next_td)

    def _reset(self, td, td_reset):
        return self._record(td_reset)

    def _call(self, td):
        return self._record(td)

    def dump(self, suffix: str | None = None) -> None:
        """Write the stored frames as one video (``tag`` or ``tag_suffix``) and empty the store."""
        if not self.frames:
            return
        name = self.tag if suffix is None else f"{self.tag}_{suffix}"
        kwargs = {} if self.fps is None else {"fps": self.fps}
        self.logger.log_video(name, torch.stack(self.frames), step=self.dumps, **kwargs)
        self.frames, self.dumps = [], self.dumps + 1

    def extra_repr(self) -> str:
        return f"tag={self.tag!r}, in_keys={self.in_keys}, skip={self.skip}"
