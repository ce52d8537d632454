"""``--int8-exclude auto``: find the layers to keep in fp32 so that int8 agrees with fp32 and is faster.

The driver (``mxjob.int8.int8_prep.prepare_precision``) calibrates once
(:class:`Calibration`: every output's min and max in the oneDNN-fused fp32
graph, over the calibration images), so each configuration the search tries
costs a graph pass and one int8 forward pass over the held-out images, never
another calibration run. :func:`search` then

1. quantizes every layer, with per-tensor and with per-channel weight scales
   (:data:`GRANULARITIES`), and keeps the granularity whose output
   probabilities stray least from fp32 (KL divergence);
2. measures each layer's sensitivity: that layer alone quantized, the others
   in fp32, the KL divergence from fp32 on :data:`SENSITIVITY_IMAGES`
   held-out images;
3. keeps the most sensitive layers in fp32, more at each step
   (:func:`exclusion_steps`), until int8 agrees at ``min_agreement`` on every
   held-out image, while it is still faster than fp32 (:data:`MIN_SPEEDUP`).

It stops at ``budget_seconds``, or as soon as a configuration is no faster
than fp32 (keeping more layers in fp32 only slows it further). The result
(:class:`SearchResult`) says what it kept, what it reached and why it
stopped; the driver refuses the job unless it ``passed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from mxjob.model.predictor import ModelError, ModelSpec, bind, padded_batches, split_params
from mxjob.tasks.classify import softmax

#: ``--int8-exclude auto``: the value that asks for the search instead of naming layers.
AUTO = "auto"
#: Weight scales tried, as MXNet names them: one per tensor, or one per output channel.
GRANULARITIES = ("tensor-wise", "channel-wise")
#: Held-out images each one-layer sensitivity trial scores: enough to rank layers by KL divergence (it
#: compares whole distributions, not 16 top-1 answers), few enough that ranking a 50-layer model costs about
#: one fp32 pass over 800 images.
SENSITIVITY_IMAGES = 16
#: The share of the time left that ranking the layers may take; the rest is for trying exclusions.
RANKING_SHARE = 2 / 3
#: An int8 model must be at least this much faster than fp32: closer is within the timing noise of a
#: loaded driver, and not worth int8's risk.
MIN_SPEEDUP = 1.05
#: The final timing of the chosen configuration against fp32: held-out images per model and repeat (a few
#: bound batches), and repeats, interleaved; the fastest repeat counts (:func:`time_models`).
TIMING_IMAGES, TIMING_REPEATS = 64, 3
#: Each search trial's quicker timing, ``(images, repeats)``: a trial's speed-up only has to tell
#: "faster" from "not", and the final timing confirms the one that passes.
SEARCH_TIMING = (32, 2)


def is_auto(patterns: Sequence[str]) -> bool:
    """Whether ``--int8-exclude`` asks for the search (``auto``) rather than naming layers."""
    return [p.lower() for p in patterns] == [AUTO]


class Calibration:
    """A checkpoint fused for oneDNN and calibrated once: every output's min and max over the calibration images.

    :meth:`quantize` makes the int8 graph for any excluded layers and
    granularity from these ranges (MXNet's ``naive`` calibration: the same
    thresholds ``quantize_model_mkldnn`` would compute), without running the
    fp32 model again. Only MXNet's public API: a ``Monitor`` collects the
    ranges, ``quantize_graph`` and ``calib_graph`` quantize (about 4 ms more
    CPU a configuration on ResNet-18 than calling the private
    ``_quantize_symbol``, ``_calibrate_quantized_sym`` and ``_quantize_params``
    they wrap, against a trial's forward passes of seconds).

    Parameters
    ----------
    symbol : mxnet.symbol.Symbol
        The fp32 graph.
    arg_params, aux_params : dict of str to NDArray
        Its parameters.
    data_name : str
        The input's name.
    calibration : numpy.ndarray
        ``(N, C, H, W)`` float32 inputs, preprocessed as the job does.
    batch_size : int
        Images per calibration forward pass, and per trial's forward pass.
    output_is_probability : bool
        The graph ends in a softmax (``Classifier.output_is_probability``);
        otherwise its output is logits, and the search compares their softmax.
    """

    def __init__(self, symbol, arg_params: dict, aux_params: dict, data_name: str, calibration: np.ndarray,
                 batch_size: int, output_is_probability: bool = False):
        import mxnet as mx

        self._mx = mx
        self.fused = symbol.get_backend_symbol("MKLDNN_QUANTIZE")
        self.arg_params, self.aux_params, self.data_name = arg_params, aux_params, data_name
        self.batch_size, self.output_is_probability = batch_size, output_is_probability
        self.ranges: dict[str, tuple[float, float]] = {}
        module = bind(self.fused, arg_params, aux_params, data_name, calibration.shape[1:], batch_size)
        # Every output, not only those of one configuration's quantized layers: excluding a layer makes its
        # fp32 output the next layer's int8 input, whose range that configuration then needs.
        monitor = mx.monitor.Monitor(1, stat_func=_min_max, monitor_all=True)
        module.install_monitor(monitor)
        monitor.tic()  # collects every batch until toc(), never called: this module serves this calibration only
        forward(module, calibration, batch_size)
        for _, name, (low, high) in monitor.queue:
            if name in self.ranges:
                low, high = min(low, self.ranges[name][0]), max(high, self.ranges[name][1])
            self.ranges[name] = (low, high)

    def quantize(self, exclude: Sequence[str] = (), granularity: str = GRANULARITIES[0]) -> tuple:
        """``(symbol, arg_params, aux_params)`` of the int8 graph with ``exclude`` (fp32 layer names) in fp32."""
        from mxnet.contrib import quantization as q

        # calib_mode "naive": quantize_graph returns a collector of the outputs the graph needs ranges for
        # (include_layer), which calib_graph reads (min_max_dict); it is filled from the ranges collected once.
        qsym, _, _, collector = q.quantize_graph(
            self.fused, self.arg_params, self.aux_params, self._mx.cpu(), excluded_sym_names=list(exclude),
            calib_mode="naive", quantized_dtype="auto", quantize_mode="smart", quantize_granularity=granularity)
        missing = [name for name in collector.include_layer if name not in self.ranges]
        if missing:
            raise ModelError(f"int8: no calibrated range for {', '.join(missing[:3])}")
        collector.min_max_dict = {name: self.ranges[name] for name in collector.include_layer}
        qsym, qargs, _ = q.calib_graph(qsym, self.arg_params, self.aux_params, collector, calib_mode="naive",
                                       quantized_dtype="auto", logger=None)
        return qsym.get_backend_symbol("MKLDNN_QUANTIZE"), qargs, self.aux_params


def load_checkpoint(spec: ModelSpec) -> tuple:
    """The fp32 checkpoint's ``(symbol, arg_params, aux_params)``."""
    import mxnet as mx

    symbol = mx.sym.load_json(spec.read(spec.symbol_uri).decode("utf-8"))
    return (symbol, *split_params(mx.nd.load_frombuffer(spec.read(spec.params_uri))))


def _min_max(array) -> tuple[float, float]:
    """A calibration output's least and greatest values (the ``Monitor``'s statistic)."""
    import mxnet as mx

    return float(mx.nd.min(array).asscalar()), float(mx.nd.max(array).asscalar())


def forward(module, arrays: np.ndarray, batch_size: int) -> np.ndarray:
    """The first output of ``module`` for every row of ``arrays`` (the last batch padded with zeros)."""
    import mxnet as mx

    outputs = []
    for batch, rows in padded_batches(arrays, batch_size):
        module.forward(mx.io.DataBatch([mx.nd.array(batch)]), is_train=False)
        outputs.append(module.get_outputs()[0].asnumpy().reshape(batch_size, -1)[:rows])
    return np.concatenate(outputs)


def to_probabilities(outputs: np.ndarray, output_is_probability: bool) -> np.ndarray:
    """Class probabilities from a model's first output: itself after a softmax head, else its softmax."""
    outputs = outputs.astype(np.float64)
    return outputs if output_is_probability else softmax(outputs)


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean KL divergence of ``candidate`` class probabilities from ``reference`` (rows are images)."""
    tiny = 1e-12
    return float(np.mean(np.sum(reference * (np.log(reference + tiny) - np.log(candidate + tiny)), axis=1)))


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """The share of rows whose top class is the same."""
    return float(np.mean(np.argmax(reference, axis=1) == np.argmax(candidate, axis=1)))


@dataclass
class Trial:
    """One configuration tried: layers in fp32, weight granularity, and how its outputs compare with fp32."""

    excluded: list
    granularity: str
    images: int
    agreement: float
    kl: float
    #: fp32's forward time over int8's, timed in this trial (:func:`time_models`, :data:`SEARCH_TIMING`).
    speedup: float
    passed: bool = False

    def as_dict(self) -> dict:
        """The trial for the summary and the bench: rounded figures, the layers kept in fp32."""
        return {"excluded_layers": list(self.excluded), "granularity": self.granularity, "images": self.images,
                "top1_agreement": round(self.agreement, 4), "kl_divergence": round(self.kl, 6),
                "speedup": round(self.speedup, 2)}


@dataclass
class SearchResult:
    """What :func:`search` found: the configuration it chose (or the best it saw), how, and why it stopped."""

    #: The passing configuration, or ``None``.
    chosen: Trial | None
    #: The passing configuration, else the trial on every held-out image with the best agreement among those
    #: faster than fp32 (else the best agreement of all).
    best: Trial
    #: Every trial on all held-out images, in order (sensitivity trials are counted, not kept).
    trials: list = field(default_factory=list)
    #: Layers, most sensitive first, with their one-layer KL divergence.
    sensitivity: list = field(default_factory=list)
    configurations_tried: int = 0
    seconds: float = 0.0
    stopped: str = ""
    #: The final interleaved timing of the chosen (or best) configuration: fp32 and int8 ms per image.
    timing: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether a configuration agreed at the minimum and was faster than fp32."""
        return self.chosen is not None

    def as_dict(self) -> dict:
        """The summary's ``precision.search`` entry."""
        return {"configurations_tried": self.configurations_tried, "seconds": round(self.seconds, 1),
                "stopped": self.stopped, "best": self.best.as_dict(), "timing": self.timing,
                "most_sensitive": [{"layer": name, "kl_divergence": round(kl, 6)} for name, kl in self.sensitivity[:8]],
                "trials": [t.as_dict() | {"excluded_layers": len(t.excluded)} for t in self.trials]}


def exclusion_steps(count: int) -> list[int]:
    """How many of the most sensitive layers to keep in fp32 at each step: 1, 2, 3, 4, 5, 7, 9, 12, ... < ``count``.

    About a third more each step: a model that needs one or two layers in
    fp32 finds them in one or two trials, and a model that needs half its
    layers takes a dozen trials rather than one per layer.
    """
    steps, k = [], 1
    while k < count:
        steps.append(k)
        k = max(k + 1, round(k * 4 / 3))
    return steps


class _Trials:
    """Runs configurations on the held-out images against the fp32 reference, counting them and the budget."""

    def __init__(self, calibration: Calibration, held_out: np.ndarray, reference: np.ndarray, fp32_module,
                 min_agreement: float, deadline: float, clock: Callable[[], float]):
        self.calibration, self.held_out, self.reference = calibration, held_out, reference
        self.fp32_module, self.min_agreement, self.deadline, self.clock = fp32_module, min_agreement, deadline, clock
        self.count, self.longest = 0, 0.0
        self.done: list[Trial] = []

    def time_left(self, until: float | None = None) -> bool:
        """Whether another trial, as long as the longest so far, ends before ``until`` (else the deadline)."""
        return self.clock() + self.longest <= (self.deadline if until is None else until)

    def probabilities(self, exclude: Sequence[str], granularity: str, arrays: np.ndarray,
                      timed: bool = False) -> tuple[np.ndarray, float | None]:
        """The int8 probabilities for ``arrays``, and with ``timed`` the speed-up (:func:`time_models`)."""
        started, c = self.clock(), self.calibration
        module = bind(*c.quantize(exclude, granularity), c.data_name, arrays.shape[1:], c.batch_size)
        probabilities = to_probabilities(forward(module, arrays, c.batch_size), c.output_is_probability)
        speedup = time_models(self.fp32_module, module, arrays, c.batch_size, SEARCH_TIMING)["speedup"] if timed \
            else None
        self.count += 1
        self.longest = max(self.longest, self.clock() - started)
        return probabilities, speedup

    def run(self, exclude: Sequence[str], granularity: str) -> Trial:
        probabilities, speedup = self.probabilities(exclude, granularity, self.held_out, timed=True)
        agreement = top1_agreement(self.reference, probabilities)
        trial = Trial(list(exclude), granularity, len(self.held_out), agreement,
                      kl_divergence(self.reference, probabilities), speedup,
                      agreement >= self.min_agreement and speedup >= MIN_SPEEDUP)
        self.done.append(trial)
        return trial

    def sensitivity(self, layers: Sequence[str], granularity: str) -> list[tuple[str, float]]:
        """Layers by their KL divergence with only them quantized, most sensitive first.

        Takes at most :data:`RANKING_SHARE` of the time left, so that some is
        left to try exclusions; the layers it had no time for are left out.
        """
        images, reference = self.held_out[:SENSITIVITY_IMAGES], self.reference[:SENSITIVITY_IMAGES]
        until = self.clock() + RANKING_SHARE * (self.deadline - self.clock())
        scores = []
        for layer in layers:
            if not self.time_left(until):
                break
            probabilities, _ = self.probabilities([other for other in layers if other != layer], granularity, images)
            scores.append((layer, kl_divergence(reference, probabilities)))
        return sorted(scores, key=lambda item: -item[1])


def best_of(trials: Sequence[Trial]) -> Trial:
    """The trial to report: passing first, then faster than fp32, then the highest agreement, then speed."""
    return max(trials, key=lambda t: (t.passed, t.speedup >= MIN_SPEEDUP, t.agreement, t.speedup))


@dataclass(frozen=True)
class SearchGoal:
    """What the search must reach and how long it may look: ``--min-agreement`` (top-1 agreement with fp32 on
    the held-out images) and ``--int8-search-seconds``."""

    min_agreement: float
    budget_seconds: float


@dataclass(frozen=True)
class SampleArrays:
    """The int8 sample, decoded: ``(N, C, H, W)`` float32 inputs to calibrate on, and held-out ones to compare
    int8 with fp32 on."""

    calibration: np.ndarray
    held_out: np.ndarray


def search(calibration: Calibration, layers: Sequence[str], held_out: np.ndarray, reference: np.ndarray,
           fp32_module, goal: SearchGoal, clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Find the fewest layers to keep in fp32 so that int8 agrees at ``goal.min_agreement`` and is faster.

    Parameters
    ----------
    calibration : Calibration
        The calibrated, fused fp32 model.
    layers : sequence of str
        The convolution and fully connected layers that may be kept in fp32
        (``mxjob.int8.int8.weight_layers``).
    held_out : numpy.ndarray
        ``(N, C, H, W)`` held-out inputs.
    reference : numpy.ndarray
        ``(N, classes)``: fp32's probabilities for ``held_out``.
    fp32_module : mxnet.module.Module
        The fp32 model bound at the calibration's batch (:func:`bind`): each
        trial times it against the int8 one, interleaved, on the same threads.
    goal : SearchGoal
        ``--min-agreement``, and ``--int8-search-seconds``: no trial starts
        that would end after it (the first, every layer quantized, always runs).
    clock : callable
        Seconds, monotonic; tests pass a fake one.

    Returns
    -------
    SearchResult
    """
    started = clock()
    trials = _Trials(calibration, held_out, reference, fp32_module, goal.min_agreement,
                     started + goal.budget_seconds, clock)
    result = _search(trials, list(layers))
    result.trials, result.configurations_tried = trials.done, trials.count
    result.seconds = clock() - started
    return result


def _search(trials: _Trials, layers: list[str]) -> SearchResult:
    start = _every_layer(trials)
    if start.passed:
        return SearchResult(start, start, stopped="passes with every layer quantized")
    if start.speedup < MIN_SPEEDUP:
        return SearchResult(None, best_of(trials.done), stopped="no faster than fp32 with every layer quantized")
    ranking = trials.sensitivity(layers, start.granularity)
    if not ranking:
        return SearchResult(None, best_of(trials.done), stopped="no time left to rank the layers")
    result = _keep_most_sensitive(trials, ranking, start.granularity, len(layers))
    if len(ranking) < len(layers):
        result.stopped += f" (the time budget ranked {len(ranking)} of {len(layers)} layers)"
    return result


def _every_layer(trials: _Trials) -> Trial:
    """Every layer quantized, per tensor, then per channel if time allows: the passing or the closer to fp32."""
    tried = [trials.run([], GRANULARITIES[0])]
    for granularity in GRANULARITIES[1:]:
        if tried[0].passed or not trials.time_left():
            break
        tried.append(trials.run([], granularity))
    return min(tried, key=lambda t: (not t.passed, t.kl))


def _keep_most_sensitive(trials: _Trials, ranking: list, granularity: str, count: int) -> SearchResult:
    """Keep the ``k`` most sensitive layers of ``count`` in fp32, ``k`` growing (:func:`exclusion_steps`), until
    one passes."""
    for k in exclusion_steps(min(count, len(ranking) + 1)):
        if not trials.time_left():
            return SearchResult(None, best_of(trials.done), sensitivity=ranking, stopped="time budget spent")
        trial = trials.run([name for name, _ in ranking[:k]], granularity)
        if trial.passed:
            return SearchResult(trial, trial, sensitivity=ranking, stopped=f"passes with {k} of {count} layers in fp32")
        if trial.speedup < MIN_SPEEDUP:
            return SearchResult(None, best_of(trials.done), sensitivity=ranking,
                                stopped=f"no faster than fp32 with {k} of {count} layers in fp32")
    return SearchResult(None, best_of(trials.done), sensitivity=ranking, stopped="no configuration passes")



def time_models(fp32_module, int8_module, arrays: np.ndarray, batch_size: int,
                timing: tuple[int, int] = (TIMING_IMAGES, TIMING_REPEATS)) -> dict:
    """fp32 and int8 forward milliseconds per image on ``arrays``, interleaved, the fastest of some repeats.

    ``timing`` is ``(images, repeats)``. Interleaved, so that a neighbour's
    load on the driver slows both alike; the fastest repeat, because load
    only ever adds time.
    """
    images, repeats = timing
    arrays = arrays[:images]
    best = {"fp32": float("inf"), "int8": float("inf")}
    for _ in range(repeats):
        for name, module in (("fp32", fp32_module), ("int8", int8_module)):
            started = time.perf_counter()
            forward(module, arrays, batch_size)
            best[name] = min(best[name], time.perf_counter() - started)
    return {"fp32_ms_per_image": round(1000 * best["fp32"] / len(arrays), 2),
            "int8_ms_per_image": round(1000 * best["int8"] / len(arrays), 2),
            "speedup": round(best["fp32"] / best["int8"], 2), "images": len(arrays)}


def quantize_auto(spec: ModelSpec, layers: Sequence[str], sample: SampleArrays, out_prefix: str, batch_size: int,
                  goal: SearchGoal, output_is_probability: bool = False) -> tuple[ModelSpec | None, SearchResult]:
    """``--int8-exclude auto``: calibrate once, :func:`search`, time the result, write it if it passed.

    Parameters
    ----------
    spec : ModelSpec
        The fp32 checkpoint.
    layers : sequence of str
        Its convolution and fully connected layers (``mxjob.int8.int8.weight_layers``).
    sample : SampleArrays
        The inputs to calibrate on, and to compare with fp32 on.
    out_prefix : str
        Where the chosen int8 checkpoint goes (``-symbol.json``, ``-0000.params``).
    batch_size : int
        The bound batch of every forward pass, fp32 and int8 alike.
    goal : SearchGoal
        ``--min-agreement``, ``--int8-search-seconds``.
    output_is_probability : bool
        The model ends in a softmax.

    Returns
    -------
    (ModelSpec or None, SearchResult)
        The int8 checkpoint (``shipped``) when a configuration agreed at
        ``goal.min_agreement`` and was at least :data:`MIN_SPEEDUP` times faster
        in the final timing, else ``None``; and what the search found.
    """
    import mxnet as mx

    calibration, held_out = sample.calibration, sample.held_out
    symbol, args, aux = load_checkpoint(spec)
    batch_size = min(batch_size, len(calibration), len(held_out))
    calibrated = Calibration(symbol, args, aux, spec.data_name, calibration, batch_size, output_is_probability)
    fp32 = bind(symbol, args, aux, spec.data_name, held_out.shape[1:], batch_size)
    reference = to_probabilities(forward(fp32, held_out, batch_size), output_is_probability)
    result = search(calibrated, layers, held_out, reference, fp32, goal)
    final = result.chosen or result.best
    qsym, qargs, qaux = calibrated.quantize(final.excluded, final.granularity)
    result.timing = time_models(fp32, bind(qsym, qargs, qaux, spec.data_name, held_out.shape[1:], batch_size),
                                held_out, batch_size)
    if result.chosen is not None and result.timing["speedup"] < MIN_SPEEDUP:
        result.chosen, result.stopped = None, f"{result.stopped}, but no faster than fp32 in the final timing"
    if result.chosen is None:
        return None, result
    mx.model.save_checkpoint(out_prefix, 0, qsym, qargs, qaux)
    return replace(spec, symbol_uri=f"{out_prefix}-symbol.json", params_uri=f"{out_prefix}-0000.params",
                   shipped=True), result


def _layers(names: Sequence[str]) -> str:
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"{len(names)} in fp32 ({shown})" if names else "none in fp32"


def duration(seconds: float) -> str:
    """``0.04 s``, ``0.4 s``, ``7.3 s``, ``95 s``: a small model's search takes under a second, which whole seconds
    showed as ``0s``."""
    if seconds < 1:
        return f"{seconds:.2g} s"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def tried(result: SearchResult) -> str:
    """What the search tried and kept, for a refusal after it: ``7 configurations in 0.4 s and chose layers ...``."""
    trial = result.chosen or result.best
    return (f"{result.configurations_tried} configurations in {duration(result.seconds)} and "
            f"{'chose' if result.passed else 'got no further than'} layers {_layers(trial.excluded)} with "
            f"{trial.granularity} weight scales, which agreed on {trial.agreement:.2%} of the {trial.images} "
            f"held-out images in its search")


def describe(result: SearchResult) -> str:
    """The driver's log line: what the search tried, kept and reached, and why it stopped."""
    best, timing = result.best, result.timing
    return (f"int8 --int8-exclude auto: {result.configurations_tried} configurations in {duration(result.seconds)} "
            f"({result.stopped}); {'chosen' if result.passed else 'best found'}: layers {_layers(best.excluded)}, "
            f"{best.granularity} weight scales, top-1 agreement {best.agreement:.2%} on {best.images} held-out "
            f"images, speed-up {timing.get('speedup', best.speedup):.2f}x (fp32 "
            f"{timing.get('fp32_ms_per_image', '?')} ms, int8 {timing.get('int8_ms_per_image', '?')} ms per image)")


def refusal(result: SearchResult, min_agreement: float, held_out: int) -> str:
    """The ``JobError`` message when the search found nothing that agrees and is faster: the best it found."""
    best, timing = result.best, result.timing
    return (f"--int8-exclude auto found no int8 configuration that agrees with fp32 on at least {min_agreement:.2%} "
            f"of top-1 classes and is at least {MIN_SPEEDUP:g}x faster ({result.configurations_tried} tried in "
            f"{duration(result.seconds)} on {held_out} held-out images; {result.stopped}). The best: layers "
            f"{_layers(best.excluded)}, {best.granularity} weight scales, top-1 agreement {best.agreement:.2%}, "
            f"speed-up {timing.get('speedup', best.speedup):.2f}x. Nothing was scored. Use --precision fp32, a "
            f"lower --min-agreement if that agreement is enough, or more --int8-search-seconds if the search ran "
            f"out of time")
