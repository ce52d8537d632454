"""Decoding: every Pillow mode to 3 channels, the exact recipe, and bad bytes raising."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from dataclasses import replace

import numpy as np
import PIL.Image
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

import mxinfer
from mxjob.options import config
from tests.support.helpers import encode

PREP = mxinfer.Preprocess(input_shape=(3, 24, 32))


def gradient_rgb(width: int = 40, height: int = 30) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                    (x + y) * 255 // (width + height)], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8))


def reference(data: bytes, shape=(3, 24, 32), mean=(0, 0, 0), std=(1, 1, 1), draft: bool = True,
              resize: str = "stretch") -> np.ndarray:
    """The preprocessing recipe of docs/performance.md, written out independently of mxinfer."""
    height, width = shape[1:]
    if resize == "short-side-crop":
        short = round(min(height, width) * 256 / 224)
        target = (short, short)
    else:
        target = (width, height)
    img = Image.open(io.BytesIO(data))
    if draft and img.format == "JPEG":
        turned = img.getexif().get(0x0112, 1) in (5, 6, 7, 8)
        img.draft(None, (2 * target[1], 2 * target[0]) if turned else (2 * target[0], 2 * target[1]))
    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I;16"):  # the docs: value / 257, not Pillow's clipping convert
        img = Image.fromarray(np.clip(np.rint(np.asarray(img, np.float64) / 257), 0, 255).astype(np.uint8))
    img = img.convert("RGB")
    if resize == "short-side-crop":
        scale = target[0] / min(img.size)
        size = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
        img = img.resize(size, Image.BILINEAR)
        left, top = (size[0] - width) // 2, (size[1] - height) // 2
        img = img.crop((left, top, left + width, top + height))
    else:
        img = img.resize((width, height), Image.BILINEAR)
    x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1)
    return (x - np.array(mean, np.float32).reshape(3, 1, 1)) / np.array(std, np.float32).reshape(3, 1, 1)


@pytest.mark.parametrize("mode", ["RGB", "L", "LA", "P", "RGBA", "CMYK", "1"])
def test_every_8bit_mode_decodes_to_three_channels_as_the_recipe(mode):
    img = gradient_rgb().convert(mode)
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    data = encode(img, fmt)
    out = mxinfer.decode_image(data, PREP)
    assert out.shape == (3, 24, 32)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, reference(data), atol=1e-4)


@pytest.mark.parametrize("channels", [3, 1])
def test_normalisation_is_bit_identical_to_float32_first(channels):
    # decode_image subtracts and divides on uint8 CHW values into float32; the
    # recipe converts to float32 first. Every one of 256 values per channel must agree exactly.
    noise = np.random.RandomState(1).randint(0, 256, (64, 48, 3), dtype=np.uint8)
    noise[:6, :, :] = (np.arange(6 * 48) % 256).reshape(6, 48, 1)  # every value 0-255 in every channel
    img = Image.fromarray(noise)
    assert all(len(np.unique(noise[..., c])) == 256 for c in range(3))
    mean, std = ((123.68, 116.78, 103.94), (58.4, 57.12, 57.38)) if channels == 3 else ((127.5,), (255.0,))
    prep = mxinfer.Preprocess(input_shape=(channels, 64, 48), mean=mean, std=std)
    out = mxinfer.decode_image(encode(img), prep)
    pixels = np.asarray(img if channels == 3 else img.convert("L"), dtype=np.float32)
    pixels = pixels.transpose(2, 0, 1) if channels == 3 else pixels[np.newaxis]
    expected = (pixels - np.array(mean, np.float32).reshape(-1, 1, 1)) / np.array(std, np.float32).reshape(-1, 1, 1)
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"] and out.shape == expected.shape
    assert np.array_equal(out, expected)


def test_cmyk_jpeg_colours_survive():
    red = Image.new("RGB", (16, 16), (220, 20, 20)).convert("CMYK")
    out = mxinfer.decode_image(encode(red, "JPEG", quality=95), PREP)
    r, g, b = (out[c].mean() for c in range(3))
    assert r > 180 and g < 70 and b < 70


def test_16bit_greyscale_is_scaled_not_saturated():
    values = np.full((30, 40), 32768, dtype=np.uint16)  # mid-grey at 16 bits
    img = Image.fromarray(values)
    assert img.mode.startswith("I;16")
    out = mxinfer.decode_image(encode(img), PREP)
    # 32768 / 257 = 127.5 -> 128; Pillow's own convert("RGB") would give 255.
    assert out.shape == (3, 24, 32)
    np.testing.assert_allclose(out, 128.0, atol=0.5)
    assert np.asarray(img.convert("RGB")).max() == 255  # the saturation this avoids


def test_32bit_integer_greyscale_holding_16bit_values_is_scaled_too():
    img = Image.fromarray(np.full((8, 8), 65535, dtype=np.uint16)).convert("I")
    out = mxinfer.decode_image(encode(img, "TIFF"), PREP)
    np.testing.assert_allclose(out, 255.0, atol=0.5)


def test_mean_and_std_apply_to_0_255_values():
    data = encode(Image.new("RGB", (8, 8), (100, 150, 200)))
    prep = mxinfer.Preprocess(input_shape=(3, 4, 4), mean=(100, 50, 0), std=(1, 2, 4))
    out = mxinfer.decode_image(data, prep)
    np.testing.assert_allclose(out[:, 0, 0], [0.0, 50.0, 50.0])


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 20, 20))  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    data = encode(img, "JPEG", exif=exif.tobytes(), quality=95)
    out = mxinfer.decode_image(data, mxinfer.Preprocess(input_shape=(3, 40, 20)))
    # After the rotation the white half is on top.
    assert out[:, :15, :].mean() > 200 and out[:, 25:, :].mean() < 50


def test_greyscale_model_input_has_one_channel():
    out = mxinfer.decode_image(encode(gradient_rgb()), mxinfer.Preprocess(input_shape=(1, 8, 8)))
    assert out.shape == (1, 8, 8)


def test_short_side_crop_resizes_short_side_then_crops_the_centre():
    img = Image.new("RGB", (512, 256), (0, 0, 0))
    img.paste((255, 255, 255), (192, 0, 320, 256))  # a white centre band 128 px wide
    prep = mxinfer.Preprocess(input_shape=(3, 224, 224), resize="short-side-crop")
    out = mxinfer.decode_image(encode(img), prep)
    assert out.shape == (3, 224, 224)
    # Short side 256 -> 256 (no scaling), width 512 -> crop 144..368: band at 48..176.
    assert out[:, :, 60:160].mean() > 250
    assert out[:, :, :40].mean() < 5 and out[:, :, 190:].mean() < 5


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (10, 10), c) for c in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    out = mxinfer.decode_image(buffer.getvalue(), mxinfer.Preprocess(input_shape=(3, 10, 10)))
    assert out[0].mean() > 200 and out[2].mean() < 50


@pytest.mark.parametrize("data, error, match", [
    (b"", ValueError, "empty object"),
    (b"this is not an image at all", UnidentifiedImageError, "cannot identify image"),
])
def test_bad_bytes_raise(data, error, match):
    with pytest.raises(error, match=match):
        mxinfer.decode_image(data, PREP)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_images_raise_rather_than_decode_half_grey(fmt):
    data = encode(gradient_rgb(200, 150), fmt)
    with pytest.raises(OSError, match="image file is truncated"):
        mxinfer.decode_image(data[: len(data) // 2], PREP)


def test_decompression_bomb_is_refused_before_decoding():
    prep = mxinfer.Preprocess(input_shape=(3, 8, 8), max_image_pixels=10_000_000)
    data = png_declaring(5000, 5000)
    assert len(data) < 100
    with pytest.raises(mxinfer.ImageTooLargeError, match="25,000,000 pixels is over --max-image-pixels 10,000,000"):
        mxinfer.decode_image(data, prep)
    with pytest.raises(mxinfer.ImageTooLargeError, match="over --max-image-pixels"):  # 30000 x 30000: Pillow's check
        mxinfer.decode_image(png_declaring(30000, 30000), prep)


def test_an_image_over_max_image_pixels_names_the_option_and_the_limit_it_was_given():
    # The option reaches the recipe as the job passes it: --max-image-pixels -> JobConfig.preprocess.
    prep = config.resolve(config.merge_settings(
        {"input": "s3://in/p/", "output": "s3://o/k.jsonl", "model": "s3://m/r", "input_shape": "3,8,8",
         "max_image_pixels": 1000}, {})).preprocess
    with pytest.raises(mxinfer.ImageTooLargeError, match=r"^image of 40 x 30 = 1,200 pixels is over "
                                                         r"--max-image-pixels 1,000 \(raise it to read larger"):
        mxinfer.decode_image(encode(gradient_rgb(40, 30)), prep)


def test_an_image_over_pillows_bomb_limit_names_the_jobs_limit_not_pillows():
    prep = mxinfer.Preprocess(input_shape=(3, 8, 8), max_image_pixels=1000)
    with pytest.raises(mxinfer.ImageTooLargeError) as refused:  # 192 MP: over twice Pillow's own 89 MP
        mxinfer.decode_image(png_declaring(12000, 16000), prep)
    assert str(refused.value).startswith("image of 192,000,000 pixels is over --max-image-pixels 1,000 ")
    assert "178956970" not in str(refused.value) and "178,956,970" not in str(refused.value)


def test_pillows_bomb_warning_raised_as_an_error_names_the_jobs_limit(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1,200 pixels: Pillow warns, short of its error
    prep = mxinfer.Preprocess(input_shape=(3, 8, 8), max_image_pixels=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(mxinfer.ImageTooLargeError, match=r"^image of 1,200 pixels is over --max-image-pixels "
                                                             r"1,000 "):
            mxinfer.decode_image(encode(gradient_rgb(40, 30)), prep)


def test_pillows_own_limit_never_refuses_an_image_the_jobs_limit_allows(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # Pillow alone refuses 1,200 pixels (over twice 500)
    prep = mxinfer.Preprocess(input_shape=(3, 8, 8), max_image_pixels=10_000)
    assert mxinfer.decode_image(encode(gradient_rgb(40, 30)), prep).shape == (3, 8, 8)
    assert Image.MAX_IMAGE_PIXELS == 10_000  # raised to the job's limit, so raising the option reads more


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width x height`` greyscale pixels (a decompression bomb)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


@pytest.mark.parametrize("kwargs, match", [
    ({"input_shape": (2, 8, 8)}, "C 1 or 3"),
    ({"mean": (1, 2)}, "mean needs"),
    ({"std": (0, 1, 1)}, "non-zero"),
    ({"resize": "zoom"}, "resize must be"),
])
def test_preprocess_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mxinfer.Preprocess(**kwargs)


def real_photo(scale: float = 1.0) -> Image.Image:
    """scikit-learn's china.jpg (640x427), upscaled by ``scale``."""
    from sklearn.datasets import load_sample_images

    img = Image.fromarray(load_sample_images().images[0])
    return img.resize((round(img.width * scale), round(img.height * scale)), Image.BICUBIC) if scale != 1 else img


BIG = mxinfer.Preprocess(input_shape=(3, 224, 224), mean=(123.68, 116.78, 103.94), std=(58.4, 57.12, 57.38))


@pytest.mark.parametrize("resize", mxinfer.RESIZE_MODES)
def test_a_large_jpeg_is_decoded_at_reduced_scale_close_to_the_exact_path(resize, monkeypatch):
    data = encode(real_photo(2.5), "JPEG", quality=90)  # 1600x1068: at least 2x of 448 for a 1/2 draft
    prep = replace(BIG, resize=resize)
    loaded = []
    real_load = PIL.Image.Image.load

    def spy(self):
        loaded.append(self.size)
        return real_load(self)

    monkeypatch.setattr(PIL.Image.Image, "load", spy)
    draft = mxinfer.decode_image(data, prep)
    assert loaded[0] == (800, 534)  # the JPEG decoder's 1/2 scale, not 1600x1068
    exact = mxinfer.decode_image(data, replace(prep, decode="exact"))
    assert draft.shape == exact.shape == (3, 224, 224)
    difference = np.abs(draft - exact)
    assert 0 < difference.mean() < 0.02 and difference.max() < 0.5  # in units of std


def test_the_draft_path_is_the_readme_recipe():
    data = encode(real_photo(2.5), "JPEG", quality=90)
    np.testing.assert_allclose(mxinfer.decode_image(data, replace(BIG, mean=(0.0,), std=(1.0,))),
                               reference(data, (3, 224, 224)), atol=1e-4)


@pytest.mark.parametrize(("fmt", "scale"), [("PNG", 2.5), ("JPEG", 1.0)])
def test_png_and_jpegs_under_twice_the_target_take_the_exact_path(fmt, scale):
    data = encode(real_photo(scale), fmt)
    np.testing.assert_array_equal(mxinfer.decode_image(data, BIG),
                                  mxinfer.decode_image(data, replace(BIG, decode="exact")))


def test_draft_asks_for_twice_the_upright_size_of_a_quarter_turned_jpeg():
    img = real_photo(2.5).resize((1600, 800))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: upright it is 800 wide, 1600 high
    data = encode(img, "JPEG", quality=90, exif=exif.tobytes())
    prep = mxinfer.Preprocess(input_shape=(3, 400, 200))
    with Image.open(io.BytesIO(data)) as opened:
        assert mxinfer.draft_size(opened, prep) == (800, 400)  # the file's width is the upright height
    draft = mxinfer.decode_image(data, prep)
    exact = mxinfer.decode_image(data, replace(prep, decode="exact"))
    assert draft.shape == (3, 400, 200)
    assert np.abs(draft - exact).mean() < 2.0  # 0-255 units: the same upright picture


def test_decode_mode_is_checked():
    with pytest.raises(ValueError, match="decode must be one of draft, exact"):
        mxinfer.Preprocess(decode="fast")


# ----------------------------------------------------------------------------
# The job's path equals the recipe on real photos, every mode, orientation and format


def photo_in_mode(mode: str, scale: float = 1.0) -> Image.Image:
    """A real photo (:func:`real_photo`) in Pillow ``mode``; ``I;16`` spreads its grey over 16 bits."""
    img = real_photo(scale)
    if mode == "I;16":
        return Image.fromarray(np.asarray(img.convert("L"), np.uint16) * 257)
    if mode == "LA":
        return Image.merge("LA", (img.convert("L"), img.convert("L").point(lambda v: 255 - v // 2)))
    if mode == "RGBA":
        return Image.merge("RGBA", (*img.split(), img.convert("L")))
    return img.convert(mode)


#: Each mode in the formats that hold it (JPEG for RGB, L and CMYK; PNG for every one but CMYK; GIF for P).
MODE_FORMATS = [("RGB", "JPEG"), ("RGB", "PNG"), ("L", "JPEG"), ("L", "PNG"), ("CMYK", "JPEG"), ("LA", "PNG"),
                ("P", "PNG"), ("P", "GIF"), ("RGBA", "PNG"), ("I;16", "PNG"), ("1", "PNG")]


@pytest.mark.parametrize("resize", mxinfer.RESIZE_MODES)
@pytest.mark.parametrize(("mode", "fmt"), MODE_FORMATS)
def test_real_photos_of_every_mode_and_format_decode_as_the_recipe(mode, fmt, resize):
    img = photo_in_mode(mode, 2.5)  # 1600x1068: JPEGs take the draft path (1/2 scale)
    assert img.mode == mode
    data = encode(img, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    prep = replace(BIG, resize=resize)
    np.testing.assert_allclose(mxinfer.decode_image(data, prep),
                               reference(data, prep.input_shape, prep.mean, prep.std, resize=resize), atol=1e-4)


@pytest.mark.parametrize("resize", mxinfer.RESIZE_MODES)
@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_every_exif_orientation_decodes_as_the_recipe(fmt, orientation, resize):
    exif = Image.Exif()
    exif[0x0112] = orientation
    img = real_photo(2.5).resize((1600, 900))  # not square: a quarter turn changes the draft request
    data = encode(img, fmt, exif=exif.tobytes(), **({"quality": 90} if fmt == "JPEG" else {}))
    prep = replace(BIG, resize=resize, input_shape=(3, 224, 160))
    out = mxinfer.decode_image(data, prep)
    np.testing.assert_allclose(out, reference(data, prep.input_shape, prep.mean, prep.std, resize=resize),
                               atol=1e-4)


def test_decode_into_fills_a_batch_row_with_decode_image_s_values():
    datas = [encode(photo_in_mode(mode), fmt) for mode, fmt in (("RGB", "JPEG"), ("P", "GIF"), ("I;16", "PNG"))]
    batch = np.full((len(datas) + 1, *BIG.input_shape), np.nan, np.float32)
    for row, data in zip(batch, datas):
        assert mxinfer.decode_into(data, BIG, row) is row
    for row, data in zip(batch, datas):
        assert np.array_equal(row, mxinfer.decode_image(data, BIG))
    assert np.isnan(batch[-1]).all()  # the rows it was not given stay untouched


def test_decode_into_a_one_channel_row():
    prep = mxinfer.Preprocess(input_shape=(1, 24, 32), mean=(127.5,), std=(255.0,), decode="exact")
    data = encode(real_photo(), "JPEG")
    out = mxinfer.decode_into(data, prep, np.empty((1, 24, 32), np.float32))
    expected = (np.asarray(Image.open(io.BytesIO(data)).convert("L").resize((32, 24), Image.BILINEAR),
                           np.float32) - np.float32(127.5)) / np.float32(255.0)
    assert np.array_equal(out[0], expected)


@pytest.mark.parametrize("out, match", [
    (np.empty((3, 24, 32), np.float64), "out must be float32 of shape \\(3, 24, 32\\), got float64"),
    (np.empty((3, 32, 24), np.float32), "got float32 \\(3, 32, 24\\)"),
    (np.empty((1, 3, 24, 32), np.float32), "out must be float32 of shape"),
])
def test_decode_into_refuses_a_wrong_array(out, match):
    with pytest.raises(ValueError, match=match):
        mxinfer.decode_into(encode(gradient_rgb()), PREP, out)


def test_decode_into_raises_on_bad_bytes_as_decode_image_does():
    with pytest.raises(OSError, match="image file is truncated"):
        data = encode(gradient_rgb(200, 150), "JPEG")
        mxinfer.decode_into(data[: len(data) // 2], PREP, np.empty(PREP.input_shape, np.float32))
