"""A realistic image set for the benchmark, made here from real photos that scikit-learn ships.

scikit-learn's ``load_sample_images()`` holds two real photos (``china.jpg`` and
``flower.jpg``, 640x427). Each benchmark image is a distinct random view of one
of them: a random scale and crop to about 500x375 (landscape or portrait), a
random horizontal flip, and brightness / contrast / colour jitter; nine in ten
are saved as JPEG quality 90, one in ten as PNG. Deterministic for a seed, and
cached on disk, so repeated runs of ``make bench`` upload the same bytes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

SIZE = (500, 375)  # width, height of a landscape image; portraits are 375x500


def source_photos() -> list[Image.Image]:
    from sklearn.datasets import load_sample_images

    return [Image.fromarray(array) for array in load_sample_images().images]


def make_image(photo: Image.Image, rng: np.random.RandomState) -> Image.Image:
    """One random view of ``photo``, about 500x375 or 375x500."""
    width, height = SIZE if rng.rand() < 0.8 else SIZE[::-1]
    # Scale so the crop fits, then some more at random, so crops differ in content and scale.
    fit = max(width / photo.width, height / photo.height)
    scale = fit * rng.uniform(1.0, 1.6)
    scaled = photo.resize((max(width, round(photo.width * scale)), max(height, round(photo.height * scale))),
                          Image.BILINEAR)
    left = rng.randint(0, scaled.width - width + 1)
    top = rng.randint(0, scaled.height - height + 1)
    img = scaled.crop((left, top, left + width, top + height))
    if rng.rand() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.7, 1.3))
    img = ImageEnhance.Contrast(img).enhance(rng.uniform(0.7, 1.3))
    return ImageEnhance.Color(img).enhance(rng.uniform(0.6, 1.4))


def encode(img: Image.Image, index: int) -> tuple[str, bytes]:
    """Every tenth image as PNG, the rest as JPEG quality 90: ``(suffix, bytes)``."""
    buffer = io.BytesIO()
    if index % 10 == 9:
        img.save(buffer, format="PNG")
        return ".png", buffer.getvalue()
    img.save(buffer, format="JPEG", quality=90)
    return ".jpg", buffer.getvalue()


def _cached_set(out_dir: str | Path, wanted: dict, suffixes: tuple[str, ...], count: int, seed: int,
                write_one) -> list[Path]:
    """The files ``write_one(out, index, photo, rng)`` makes for ``count`` indices, or those already
    under ``out_dir`` when its stamp says they were made with the same ``wanted`` settings."""
    out = Path(out_dir)
    stamp = out / "made.json"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return sorted(p for p in out.iterdir() if p.suffix in suffixes)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    photos = source_photos()
    rng = np.random.RandomState(seed)
    paths = [write_one(out, index, photos[index % len(photos)], rng) for index in range(count)]
    stamp.write_text(json.dumps(wanted))
    return paths


def make_images(out_dir: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` distinct images under ``out_dir`` (reused if already made); return their paths."""
    def write_one(out: Path, index: int, photo: Image.Image, rng: np.random.RandomState) -> Path:
        suffix, data = encode(make_image(photo, rng), index)
        path = out / f"img{index:06d}{suffix}"
        path.write_bytes(data)
        return path

    wanted = {"count": count, "seed": seed, "size": list(SIZE)}
    return _cached_set(out_dir, wanted, (".jpg", ".png"), count, seed, write_one)


#: Phone and camera photos: 8 to 12 MP (4032x3024 is a 12 MP phone photo).
LARGE_SIZES = ((4032, 3024), (3264, 2448), (3840, 2160))


def make_large_image(photo: Image.Image, rng: np.random.RandomState, size: tuple[int, int]) -> Image.Image:
    """A random view of ``photo`` (as :func:`make_image`), upscaled to ``size`` (landscape or portrait)."""
    view = make_image(photo, rng)
    width, height = size if view.width >= view.height else size[::-1]
    return view.resize((width, height), Image.BICUBIC)


def make_large_images(out_dir: str | Path, count: int, seed: int = 1) -> list[Path]:
    """Write ``count`` JPEGs (quality 90) of 8 to 12 MP under ``out_dir`` (reused if already made)."""
    def write_one(out: Path, index: int, photo: Image.Image, rng: np.random.RandomState) -> Path:
        path = out / f"large{index:05d}.jpg"
        make_large_image(photo, rng, LARGE_SIZES[index % len(LARGE_SIZES)]).save(path, format="JPEG", quality=90)
        return path

    wanted = {"count": count, "seed": seed, "sizes": [list(s) for s in LARGE_SIZES]}
    return _cached_set(out_dir, wanted, (".jpg",), count, seed, write_one)


def real_photos() -> list[Image.Image]:
    """Nine real photos: scikit-learn's two and seven that scikit-image ships (a cat, a rocket, coffee, ...)."""
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    names = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "camera.png",
             "clock_motion.png")
    return source_photos() + [Image.open(folder / name).convert("RGB") for name in names]


def photo_views(count: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct JPEGs (quality 90): random views (:func:`make_image`) of :func:`real_photos`."""
    photos = real_photos()
    rng = np.random.RandomState(seed)
    out = []
    for index in range(count):
        buffer = io.BytesIO()
        make_image(photos[index % len(photos)], rng).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out
