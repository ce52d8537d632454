"""Preprocessing: encoded image bytes to the model's float32 CHW input, one recipe.

The recipe (what :func:`decode_image` does, and what the README tells users
to reproduce): ``PIL.Image.open`` -> for a JPEG, ``img.draft(None,
draft_size(img, prep))`` (DCT scaling; skipped with ``decode="exact"``) ->
``ImageOps.exif_transpose`` -> RGB (``convert("RGB")``; 16-bit and 32-bit
greyscale are scaled to 8 bits first, not clipped) -> ``resize((W, H),
BILINEAR)`` (or short side to ``H*256/224`` then a centre crop) -> float32
CHW -> ``(x - mean) / std`` on 0-255 values.

Pure functions of the bytes and a :class:`Preprocess`: no S3, no Spark, no model.
"""

from __future__ import annotations

import functools
import io
import re
import threading
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from mxjob.core import constants
from mxjob.core.constants import DECODE_MODES, RESIZE_MODES

ORIENTATION_TAG = 0x0112  # EXIF


@dataclass(frozen=True)
class Preprocess:
    """How encoded images become model input.

    Parameters
    ----------
    input_shape : tuple of int
        ``(C, H, W)``; ``C`` is 3 (RGB) or 1 (greyscale).
    mean, std : tuple of float
        Per channel, or one value for all, applied to 0-255 pixel values:
        ``(x - mean) / std``.
    resize : str
        ``"stretch"`` (straight to ``W x H``) or ``"short-side-crop"``.
    max_image_pixels : int
        Images declaring more pixels are refused before any pixel is decoded
        (``--max-image-pixels``). Decoding raises Pillow's process-wide
        ``PIL.Image.MAX_IMAGE_PIXELS`` to it when lower, so that Pillow's own
        decompression-bomb check never refuses an image this limit allows.
    decode : str
        ``"draft"``: a JPEG at least twice the size the resize needs is
        decoded at 1/2, 1/4 or 1/8 scale by the JPEG decoder itself (DCT
        scaling, Pillow's ``Image.draft``), never below twice that size, then
        resized as usual. ``"exact"``: always decode every pixel.
    """

    # The job's defaults (mxjob.options.settings), so the library decodes as the job does.
    input_shape: tuple = constants.DEFAULT.input_shape
    mean: tuple = constants.DEFAULT.mean
    std: tuple = constants.DEFAULT.std
    resize: str = constants.DEFAULT.resize
    max_image_pixels: int = constants.DEFAULT.max_image_pixels
    decode: str = constants.DEFAULT.decode

    def __post_init__(self):
        channels = self.input_shape[0]
        if len(self.input_shape) != 3 or channels not in (1, 3) or min(self.input_shape) < 1:
            raise ValueError(f"input_shape must be (C, H, W) with C 1 or 3, got {self.input_shape}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
        if any(s == 0 for s in self.std):
            raise ValueError("std values must be non-zero")
        for name, modes in (("resize", RESIZE_MODES), ("decode", DECODE_MODES)):
            if getattr(self, name) not in modes:
                raise ValueError(f"{name} must be one of {', '.join(modes)}, got {getattr(self, name)!r}")


class ImageTooLargeError(ValueError):
    """An image that declares more pixels than the configured limit."""


def to_rgb(img: Image.Image, mode: str = "RGB") -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB (or L), scaling deep greyscale.

    Pillow's own ``convert`` clips 16-bit ("I;16") and 32-bit ("I", "F")
    greyscale to 255, which turns most real 16-bit images white; those are
    scaled from their bit depth to 0-255 instead.
    """
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        values = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I;16"):
            scale = 255.0 / 65535.0
        elif img.mode == "I" and values.size and values.max() > 255:
            scale = 255.0 / 65535.0 if values.max() <= 65535 else 255.0 / 4294967295.0
        else:
            scale = 1.0
        values = np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)
        img = Image.fromarray(values)
    return img if img.mode == mode else img.convert(mode)


@dataclass(frozen=True)
class Geometry:
    """Where the model's input came from in the image, for mapping boxes back (``--task detect``).

    Parameters
    ----------
    width, height : int
        The image's size as its EXIF orientation shows it (after ``exif_transpose``), at full resolution.
    window : tuple of float
        ``(left, top, right, bottom)``: the part of that image the model saw, in its pixels. The whole
        image for ``stretch``; the centre crop for ``short-side-crop``.
    """

    width: int
    height: int
    window: tuple


def decode_image(data: bytes, prep: Preprocess) -> np.ndarray:
    """Decode one encoded image to a new float32 CHW array, exactly per the recipe.

    Raises on anything that is not a whole, readable image: a truncated file is
    an error, never a half-grey image (``ImageFile.LOAD_TRUNCATED_IMAGES`` stays
    off). Animated images give their first frame. :func:`decode_into` writes
    the same values into an array of yours.
    """
    return decode_into(data, prep, np.empty(prep.input_shape, dtype=np.float32))


def decode_into(data: bytes, prep: Preprocess, out: np.ndarray) -> np.ndarray:
    """Decode one encoded image into ``out``, exactly per the recipe; returns ``out``.

    Parameters
    ----------
    data : bytes
        The encoded image (JPEG, PNG, GIF, TIFF, ... whatever Pillow opens).
    prep : Preprocess
        The recipe.
    out : numpy.ndarray
        float32 of shape ``prep.input_shape``: typically one row of a
        preallocated ``(N, C, H, W)`` batch, so the image needs no array of its
        own and no ``np.stack`` before the forward pass (``make bench-worker``
        measures the copy it saves). On an error its values are undefined.

    Returns
    -------
    numpy.ndarray
        ``out``, holding ``(x - mean) / std`` of the image, bit for bit
        :func:`decode_image`'s values.

    Raises
    ------
    ValueError
        ``out`` of the wrong shape or dtype; an empty ``data``
        (:class:`ImageTooLargeError` for an image over ``max_image_pixels``).
    OSError, PIL.UnidentifiedImageError
        Bytes that are not a whole image Pillow can read.

    Examples
    --------
    >>> batch = np.empty((len(images), *prep.input_shape), np.float32)  # doctest: +SKIP
    >>> for row, data in zip(batch, images):                             # doctest: +SKIP
    ...     decode_into(data, prep, row)
    """
    _decode(data, prep, out)
    return out


def decode_image_geometry(data: bytes, prep: Preprocess) -> tuple[np.ndarray, Geometry]:
    """:func:`decode_image`, and the :class:`Geometry` that maps the model's input back onto the image.

    The pixels are :func:`decode_image`'s. ``draft`` decoding changes the
    scale the resize starts from, not the part of the image kept, so the
    window is measured on the image as decoded and scaled to full resolution.
    """
    out = np.empty(prep.input_shape, dtype=np.float32)
    return out, _decode(data, prep, out, geometry=True)


def _decode(data: bytes, prep: Preprocess, out: np.ndarray, geometry: bool = False) -> Geometry | None:
    """The recipe into ``out``; with ``geometry``, the :class:`Geometry` of the window it kept (else ``None``)."""
    if out.shape != tuple(prep.input_shape) or out.dtype != np.float32:
        raise ValueError(f"out must be float32 of shape {tuple(prep.input_shape)}, got {out.dtype} {out.shape}")
    if not data:
        raise ValueError("empty object (0 bytes)")
    with _open(data, prep) as img:
        turned = _quarter_turned(img)
        full = img.size[::-1] if turned else img.size  # the upright full-resolution size
        resized, decoded, window = _recipe_image(img, prep, turned)
        normalise_into(resized, prep, out)
    if not geometry:
        return None
    sx, sy = full[0] / decoded[0], full[1] / decoded[1]
    return Geometry(int(full[0]), int(full[1]), (window[0] * sx, window[1] * sy, window[2] * sx, window[3] * sy))


def _quarter_turned(img: Image.Image) -> bool:
    """Whether the image's EXIF orientation (5-8) turns it a quarter, as ``exif_transpose`` will: the file's
    width is then the upright height."""
    return img.getexif().get(ORIENTATION_TAG, 1) in (5, 6, 7, 8)


def _open(data: bytes, prep: Preprocess) -> Image.Image:
    """``Image.open`` with the pixel limits checked from the header, before any pixel is decoded."""
    _raise_pillow_limit(prep.max_image_pixels)
    try:
        img = Image.open(io.BytesIO(data))
    # The warning is an exception only where warnings are errors (python -W error); either way the image is over
    # Pillow's limit, which is at least ours, so the message names ours: the one the user can change.
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        found = _PILLOW_PIXELS.search(str(exc))
        raise _too_large(prep.max_image_pixels, int(found.group(1)) if found else None) from None
    if img.width * img.height > prep.max_image_pixels:
        img.close()
        raise _too_large(prep.max_image_pixels, img.width * img.height, img.size)
    return img


#: The pixel count in Pillow's decompression-bomb message: "Image size (192000000 pixels) exceeds limit of ...".
_PILLOW_PIXELS = re.compile(r"\((\d+) pixels\)")
#: Held while raising Pillow's limit, so that decode threads with different limits keep the largest.
_PILLOW_LIMIT_LOCK = threading.Lock()


def _raise_pillow_limit(limit: int) -> None:
    """Raise Pillow's process-wide ``Image.MAX_IMAGE_PIXELS`` to ``limit`` if it is lower; never lower or lift it.

    Pillow refuses an image over twice its limit inside ``Image.open``,
    before our own check: left at its 89,478,485 it would refuse a 180 MP
    image that ``--max-image-pixels 200000000`` allows. At ``limit`` or
    above, it refuses (or warns about) only images ours refuses too.
    """
    if Image.MAX_IMAGE_PIXELS is None or Image.MAX_IMAGE_PIXELS >= limit:
        return
    with _PILLOW_LIMIT_LOCK:
        if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
            Image.MAX_IMAGE_PIXELS = limit


def _too_large(limit: int, pixels: int | None, size: tuple | None = None) -> ImageTooLargeError:
    """The error for an image of ``pixels`` (``size``, when known) over ``--max-image-pixels`` ``limit``."""
    image = "image"
    if pixels:
        image += f" of {size[0]:,} x {size[1]:,} = {pixels:,} pixels" if size else f" of {pixels:,} pixels"
    return ImageTooLargeError(f"{image} is over --max-image-pixels {limit:,} (raise it to read larger images)")


def _recipe_image(img: Image.Image, prep: Preprocess, turned: bool) -> tuple[Image.Image, tuple, tuple]:
    """The recipe up to the resize: draft, decode, EXIF orientation, RGB (or L), resize or short-side crop.

    ``turned`` is :func:`_quarter_turned` of ``img``. Returns the resized
    image, the size it was decoded at (upright), and the window of that
    decoded image the model sees.
    """
    channels, height, width = prep.input_shape
    if prep.decode == "draft" and img.format in ("JPEG", "MPO"):
        img.draft(None, _draft_request(prep, turned))
    img.load()
    ImageOps.exif_transpose(img, in_place=True)  # in place: no copy of an upright image
    img = to_rgb(img, "RGB" if channels == 3 else "L")
    decoded = img.size
    if prep.resize == "stretch":
        return img.resize((width, height), Image.BILINEAR), decoded, (0.0, 0.0, float(decoded[0]), float(decoded[1]))
    cropped, window = _short_side_crop(img, width, height)
    return cropped, decoded, window


def normalise_into(img: Image.Image, prep: Preprocess, out: np.ndarray) -> None:
    """``out[c] = (img's band c - mean[c]) / std[c]`` in float32: the recipe's last step, CHW.

    ``img`` is the resized image, mode RGB (or L for one channel). Each band
    is taken from Pillow already planar (``tobytes("raw", "R")``, one
    contiguous 224x224 copy), then subtracted and divided straight into
    ``out[c]``: no HWC array, no CHW transpose copy, no float32 temporary
    (faster than ``np.asarray`` -> CHW copy -> subtract -> divide into a new
    array: docs/performance.md, "Figures behind the code"). uint8 minus a float32
    scalar into float32, then divided by a float32 scalar, gives the very
    values of ``(float32(x) - mean) / std``: bit-identical to the recipe.
    (``x * (1/std) + (-mean/std)`` differs from it by up to 5e-7, well within
    1e-4, and was no faster.)
    """
    means, stds = _constants(tuple(prep.mean), tuple(prep.std), prep.input_shape[0])
    bands = ("L",) if img.mode == "L" else ("R", "G", "B")
    height, width = out.shape[1:]
    for c, band in enumerate(bands):
        values = np.frombuffer(img.tobytes("raw", band), dtype=np.uint8).reshape(height, width)
        np.subtract(values, means[c], out=out[c], dtype=np.float32)
        np.divide(out[c], stds[c], out=out[c])


@functools.lru_cache(maxsize=16)
def _constants(mean: tuple, std: tuple, channels: int) -> tuple[tuple, tuple]:
    """Per channel float32 means and stds (one value given: the same for every channel), made once per recipe."""
    def per_channel(values):
        return tuple(np.float32(values[c if len(values) > 1 else 0]) for c in range(channels))
    return per_channel(mean), per_channel(std)


def map_boxes(boxes: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Boxes ``(N, 4)`` of ``xmin, ymin, xmax, ymax`` in 0..1 of the model's input to pixels of the image.

    The model saw ``geometry.window`` of the upright image (EXIF orientation
    applied), stretched to its input; a box is mapped into that window, then
    clipped to the image. Returns float32 ``(N, 4)``.
    """
    left, top, right, bottom = geometry.window
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    out = np.empty_like(boxes)
    out[:, 0::2] = np.clip(left + boxes[:, 0::2] * (right - left), 0, geometry.width)
    out[:, 1::2] = np.clip(top + boxes[:, 1::2] * (bottom - top), 0, geometry.height)
    return out.astype(np.float32)


#: ``short-side-crop`` resizes the shorter side to the model's size times this, then crops the centre:
#: ImageNet's usual evaluation ratio (256 for a 224 input).
SHORT_SIDE_RATIO = 256 / 224


def short_side(width: int, height: int) -> int:
    """The shorter side ``short-side-crop`` resizes to, for a model input of ``width x height``."""
    return round(min(width, height) * SHORT_SIDE_RATIO)


def draft_size(img: Image.Image, prep: Preprocess) -> tuple[int, int]:
    """Twice the size the resize step needs, in the file's own orientation: ``Image.draft``'s request.

    ``draft`` decodes at the smallest of 1/1, 1/2, 1/4, 1/8 scale that is
    still at least this size in both directions, so the resize that follows
    always shrinks by 2x or more, as it would from the full image.
    """
    return _draft_request(prep, _quarter_turned(img))


def _draft_request(prep: Preprocess, turned: bool) -> tuple[int, int]:
    """:func:`draft_size` for an image that EXIF turns a quarter (``turned``) or not."""
    _, height, width = prep.input_shape
    if prep.resize == "short-side-crop":
        width = height = short_side(width, height)
    if turned:  # the file's width is the upright height
        width, height = height, width
    return 2 * width, 2 * height


def _short_side_crop(img: Image.Image, width: int, height: int) -> tuple[Image.Image, tuple]:
    """Shorter side to ``min(H, W) * 256 / 224`` (ImageNet's usual ratio), then centre crop.

    Also returns the crop's window in the pixels of ``img`` as given (before the resize).
    """
    scale = short_side(width, height) / min(img.width, img.height)
    new_w = max(width, round(img.width * scale))
    new_h = max(height, round(img.height * scale))
    sx, sy = img.width / new_w, img.height / new_h
    img = img.resize((new_w, new_h), Image.BILINEAR)
    left, top = (new_w - width) // 2, (new_h - height) // 2
    window = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
    return img.crop((left, top, left + width, top + height)), window
