"""The DataFrame function: :func:`model_udf`, a pandas UDF over a column of encoded images.

It scores through the job's own code: the same :func:`decode_image`, the same
per-worker model cache, the same top-k and the same result model
(:mod:`mxjob.results.results`): its rows are the classify record batch less ``key``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from mxjob.core import constants
from mxjob.model.device import parse_context, task_context
from mxjob.model.predictor import ModelSpec
from mxjob.model.preprocess import Preprocess, decode_image
from mxjob.tasks import classify


def udf_return_type():
    """The struct :func:`model_udf` returns; ``error`` is null when the image was scored.

    ``predictions array<struct<class_id:int, label:string, probability:double>>,
    error struct<stage:string, type:string, message:string>``: the classify
    schema of :mod:`mxjob.results.results` less ``key``, converted from Arrow, so a UDF
    can be made before any SparkSession.
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, from_arrow_type(f.type))
                       for f in classify.TASK.schema() if f.name != "key"])


@dataclass(frozen=True)
class UdfSpec:
    """What a :func:`model_udf` worker needs, as plain values (pickled with the UDF)."""

    model: ModelSpec
    preprocess: Preprocess
    batch_size: int = constants.DEFAULT.batch_size
    top_k: int = constants.DEFAULT.top_k


def model_udf(model: str | ModelSpec, preprocess: Preprocess | None = None,
              batch_size: int = constants.DEFAULT.batch_size, top_k: int = constants.DEFAULT.top_k, *,
              context: str | None = None):
    """A Spark UDF from a column of encoded images to their top-k predictions.

    The model is loaded on the executors, once per Python worker, through
    :func:`get_classifier` (``spark.python.worker.reuse=true``, Spark's
    default, keeps the worker and so the model between tasks). Images are
    decoded exactly as the job does (:func:`decode_image`) and scored by the
    same :class:`Classifier`, ``batch_size`` at a time. The executors need
    ``mxinfer.py`` and ``utils.py`` (``--py-files``) and pandas and pyarrow.

    Not built on ``pyspark.ml.functions.predict_batch_udf``: it checks only the
    first row of each batch against the return type, so it cannot return a
    null ``predictions`` with an ``error`` for one unreadable image, and its
    model cache is keyed by a new id per UDF object, where ours is keyed by
    the model, shared with the job's code path.

    Parameters
    ----------
    model : str or ModelSpec
        Checkpoint prefix (``prefix-symbol.json``, ``prefix-0000.params``;
        ``s3://``, ``http(s)://``, ``file://`` or a path every executor can
        read), or a :class:`ModelSpec` for anything more (another epoch,
        labels, the data name, the S3 endpoint and attempts:
        :meth:`ModelSpec.from_prefix` takes them).
    preprocess : Preprocess, optional
        The decoding recipe, the job's own (``--input-shape``, ``--mean``,
        ``--std``, ``--resize``, ``--max-image-pixels``, ``--decode``); by
        default the job's defaults.
    batch_size : int
        Images per forward pass (the module's bound batch).
    top_k : int
        Predictions per image.
    context : str, optional
        ``cpu``, ``gpu`` (the GPU Spark assigned to the task, else partition
        modulo visible GPUs) or ``gpu:N``. Default: the ``ModelSpec``'s, cpu.

    Returns
    -------
    pyspark.sql.Column function
        Apply it to a binary column; it returns :func:`udf_return_type`:
        ``predictions`` (``class_id``, ``label``, ``probability``; highest
        first) and ``error`` (``stage`` decode or predict, ``type``,
        ``message``) for an image that could not be scored. A null input gives
        null fields.

    Examples
    --------
    >>> recipe = Preprocess(mean=(123.68, 116.78, 103.94), std=(58.4, 57.12, 57.38))
    >>> classify = model_udf("s3://bucket/models/resnet-18", recipe, top_k=3)  # doctest: +SKIP
    >>> images = spark.read.format("binaryFile").load("s3://bucket/photos/")  # doctest: +SKIP
    >>> images.select("path", classify("content").alias("p")).select("path", "p.predictions")  # doctest: +SKIP
    """
    import typing

    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    if isinstance(model, ModelSpec):
        spec = model if context is None else replace(model, context=context)
    else:
        spec = ModelSpec.from_prefix(str(model), context=context or constants.DEFAULT.context)
    parse_context(spec.context)  # a malformed context fails here, not on the executors
    if preprocess is None:
        preprocess = Preprocess()
    elif not isinstance(preprocess, Preprocess):
        raise TypeError(f"preprocess must be a Preprocess (the job's recipe: mxinfer.Preprocess(input_shape, "
                        f"mean=..., std=...)), got {type(preprocess).__name__}")
    if int(batch_size) < 1 or int(top_k) < 1:
        raise ValueError(f"batch_size and top_k must be at least 1, got {batch_size} and {top_k}")
    udf_spec = UdfSpec(spec, preprocess, int(batch_size), int(top_k))

    def predict(batches):
        return _udf_batches(batches, udf_spec)

    # pandas_udf tells the UDF kind from real type hints; this module postpones
    # annotations and imports pandas lazily, so they are set here.
    predict.__annotations__ = {"batches": typing.Iterator[pd.Series], "return": typing.Iterator[pd.DataFrame]}
    return pandas_udf(predict, udf_return_type())


def _udf_batches(batches: Iterator, spec: UdfSpec) -> Iterator:
    """The executor side of :func:`model_udf`: Arrow batches of image bytes to frames of results."""
    import pandas as pd

    model = replace(spec.model, context=task_context(spec.model.context))
    classifier = classify.get_classifier(model, spec.preprocess.input_shape, spec.batch_size)
    for series in batches:
        rows = score_images(classifier, list(series), spec.preprocess, spec.top_k)
        yield pd.DataFrame({"predictions": [p for p, _ in rows], "error": [e for _, e in rows]})


def score_images(classifier: classify.Classifier, images: Sequence[bytes | None], preprocess: Preprocess,
                 top_k: int) -> list[tuple[list[dict] | None, dict | None]]:
    """Per image, ``(predictions, None)`` or ``(None, error)``; ``(None, None)`` for ``None``.

    Decodes and scores ``classifier.batch_size`` images at a time, so memory
    stays bounded however large the Arrow batch. The rows are the job's
    (``predictions`` and ``error`` of a classify record batch): probabilities with
    the job's 6 significant digits.
    """
    out = classify.TASK.results()
    row_key = "{:012d}".format  # the row's position as a key that sorts as the number does
    for start in range(0, len(images), classifier.batch_size):
        arrays, where = [], []
        for i in range(start, min(start + classifier.batch_size, len(images))):
            if images[i] is None:
                out.skip(row_key(i))
                continue
            try:
                arrays.append(decode_image(bytes(images[i]), preprocess))
                where.append(row_key(i))
            except Exception as exc:  # noqa: BLE001 - an unreadable image is that row's error
                out.fail_stage(row_key(i), "decode", exc)
        if arrays:
            for key, (row, exc) in zip(where, classify.top_k_or_errors(classifier, arrays, top_k)):
                if exc is not None:
                    out.fail_stage(key, "predict", exc)
                else:
                    out.add(key, classify.prediction_entries(row))
    # Sorted by key: back in the images' order (a batch's decoding failures were added before its predictions).
    batch = out.record_batch()
    return list(zip(batch.column("predictions").to_pylist(), batch.column("error").to_pylist()))
