"""--task classify: the top-k classes of each image, highest probability first.

:class:`Classifier` adds labels, softmax and top-k to a :class:`Predictor`;
:class:`ImageClassifier` takes encoded images and decodes them as the job does;
:data:`TASK` is the task (``predictions list<struct<class_id int32, label
string, probability float64>>``; float32 in Parquet).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core import constants
from mxjob.model.predictor import ModelError, ModelSpec, Predictor, get_model, images_array, preprocess_for, read_labels
from mxjob.model.preprocess import Preprocess
from mxjob.results import jsonl_view
from mxjob.tasks.base import Task, TaskOption, get


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def top_classes(probabilities: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Per row, the ``k`` largest ``(class_id, probability)``, highest first.

    Ties keep the lower class id first, so results are deterministic: the
    first ``k`` of a stable sort of the row, highest first. Only the few
    classes at or above each row's ``k``-th largest value are sorted (a
    partition finds it), not all of them: 0.008 instead of 0.042 ms of CPU
    per row of ImageNet's 1,000 classes.
    """
    classes = probabilities.shape[1]
    k = min(k, classes)
    if k == 0 or not np.isfinite(probabilities).all():  # a row that is not finite fails; its order is the sort's
        order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
        return [[(int(c), float(row[c])) for c in idx] for row, idx in zip(probabilities, order)]
    kth = np.partition(probabilities, classes - k, axis=1)[:, classes - k]
    out = []
    for row, threshold in zip(probabilities, kth):
        # Every class above the k-th value, and those equal to it in class order: a stable sort keeps that order.
        candidates = np.flatnonzero(row >= threshold)
        out.append([(int(c), float(row[c])) for c in candidates[np.argsort(-row[candidates], kind="stable")[:k]]])
    return out


class Classifier(Predictor):
    """A :class:`Predictor` whose first output is class scores; adds labels and top-k.

    Labels come from ``spec.labels_uri``; when that is ``None``, from
    ``synset.txt`` beside the symbol file if it exists.
    """

    def __init__(self, model, input_shape=constants.DEFAULT.input_shape, batch_size: int = constants.DEFAULT.batch_size,
                 context: str | None = None):
        super().__init__(model, input_shape, batch_size, context)
        self.num_classes = int(np.prod(self.output_shapes[0]))
        self.labels, uri = read_labels(self.spec)
        #: The labels file read (``synset.txt`` beside the model when --labels is not given), or None.
        self.labels_uri: str | None = uri if self.labels is not None else None
        if self.labels is not None and len(self.labels) != self.num_classes:
            raise ModelError(f"labels file {uri} has {len(self.labels)} lines but the model has "
                             f"{self.num_classes} classes")

    def model_summary(self) -> dict:
        """:meth:`Predictor.model_summary`, with the labels file the lines' labels came from and its count."""
        return {**super().model_summary(), "labels": self.labels_uri if self.labels else None,
                "labels_count": len(self.labels) if self.labels else 0}

    def probabilities(self, array: np.ndarray) -> np.ndarray:
        scores = self.predict(array)[0].reshape(array.shape[0], -1).astype(np.float64)
        return scores if self.output_is_probability else softmax(scores)

    def classify(self, array: np.ndarray,
                 top_k: int = constants.DEFAULT.top_k) -> list[list[tuple[int, str | None, float]]]:
        """Per row, ``(class_id, label, probability)`` for the ``top_k`` classes, highest first."""
        return [self.labelled(row) for row in top_classes(self.probabilities(array), top_k)]

    def labelled(self, row: list[tuple[int, float]]) -> list[tuple[int, str | None, float]]:
        """A row of :func:`top_classes` with each class's label (``None`` without labels)."""
        return [(c, self.labels[c] if self.labels else None, p) for c, p in row]


class ImageClassifier(Classifier):
    """A :class:`Classifier` that takes encoded images, decoded exactly as the job does."""

    def __init__(self, model, input_shape=constants.DEFAULT.input_shape, batch_size: int = constants.DEFAULT.batch_size,
                 context: str | None = None, preprocess: Preprocess | None = None):
        super().__init__(model, input_shape, batch_size, context)
        self.preprocess = preprocess_for(self, preprocess)

    def to_array(self, images: Sequence) -> np.ndarray:
        """Encoded bytes, file paths or PIL images as one NCHW batch, decoded as the job decodes."""
        return images_array(images, self.preprocess)

    def classify_images(self, images: Sequence, top_k: int = constants.DEFAULT.top_k):
        """Classify encoded bytes, file paths or PIL images."""
        return self.classify(self.to_array(images), top_k)


def get_classifier(spec: ModelSpec, input_shape: tuple, batch_size: int) -> Classifier:
    """This Python worker's classifier for ``spec``, loaded on first use and then reused.

    Relies on ``spark.python.worker.reuse=true`` (Spark's default): the worker
    process, and so its cache (:data:`mxjob.core.state.models`), outlives the task.
    Keyed by everything that changes the bound module, the device
    (``spec.context``) included.
    """
    return get_model(spec, input_shape, batch_size, Classifier)


def top_k_or_errors(classifier: Classifier, arrays: list[np.ndarray], top_k: int) -> list[tuple]:
    """One forward pass over ``arrays``; per row ``(top-k, None)`` or ``(None, the exception that failed it)``.

    The top-k is :meth:`Classifier.classify`'s row: ``(class_id, label,
    probability)``, highest first. A failed forward pass fails every row; a
    row whose scores are not finite fails alone. The job's lines and the UDF's
    rows are both made from this.
    """
    try:
        probs = classifier.probabilities(np.stack(arrays))
    except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
        return [(None, exc)] * len(arrays)
    finite = np.isfinite(probs).all(axis=1)
    return [(classifier.labelled(row), None) if ok else (None, FloatingPointError("model output is not finite"))
            for ok, row in zip(finite, top_classes(probs, top_k))]


# ----------------------------------------------------------------------------
# The task


#: A row's prediction: the job's probability (6 significant digits) as float64, written to JSON as it is.
PREDICTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float64())])
#: ... and in Parquet: probability as float32 (Athena's ``float``).
PARQUET_PREDICTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float32())])
#: Bytes per top-k prediction (class id, probability, a label of about a dozen characters).
PREDICTION_BYTES = 24


def prediction_entries(labelled: Iterable[tuple[int, str | None, float]]) -> list[dict]:
    """Top-k ``(class_id, label, probability)`` as the ``predictions`` column's rows: the job's 6 significant digits."""
    return [{"class_id": c, "label": label, "probability": float(f"{p:.6g}")} for c, label, p in labelled]


@functools.lru_cache(maxsize=65_536)
def _prediction_head(class_id: int, label: str | None) -> str:
    """``{"class_id": C, "label": L, "probability": ``: a prediction's text up to its probability."""
    return jsonl_view.class_head(class_id, label) + '"probability": '


class ClassifyTask(Task):
    """The top-k classes of each image (``predictions``), highest probability first."""

    name = "classify"
    summary = "the top-k labels of each image and their probabilities (--top-k)"
    options = (TaskOption("top_k", "--top-k", "Predictions per image (classify).", default=5),)
    model_class = Classifier
    meanings: ClassVar[dict] = {
        "predictions": "the top `--top-k` classes, highest probability first (ties: lower class id first); "
                       "`label` is null without labels; null for an error row"}
    doc_examples: ClassVar[tuple] = (("classify", {}, "photo_classes", "s3://my-bucket/classes/"),)
    parquet_types: ClassVar[dict] = {"predictions": pa.list_(PARQUET_PREDICTION)}

    def columns(self) -> list[pa.Field]:
        return [pa.field("predictions", pa.list_(PREDICTION))]

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        return [pa.array(values, schema.field("predictions").type)]

    def score(self, model: Classifier, keys, inputs, job, out) -> None:
        for key, (row, exc) in zip(keys, top_k_or_errors(model, inputs, job.top_k)):
            if exc is not None:
                out.fail_stage(key, "predict", exc)
            else:
                out.add(key, prediction_entries(row))

    def with_handlers(self, handlers) -> Task:
        """An ``output_handler`` writes the lines instead of the top-k: the ``custom`` task."""
        if handlers is not None and handlers.output_handler is not None:
            return get("custom").with_handlers(handlers)
        return super().with_handlers(handlers)

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        """``, "predictions": [...]}`` per row (``None`` for a row without predictions); no label member without
        labels."""
        column = batch.column("predictions")
        offsets = column.offsets.to_numpy()
        start, stop = int(offsets[0]), int(offsets[-1])
        entries = column.values.slice(start, stop - start)
        class_ids = entries.field("class_id").to_pylist()
        labels = entries.field("label").to_pylist()
        probabilities = entries.field("probability").to_pylist()
        texts = [_prediction_head(c, label) + repr(p) + "}" for c, label, p in zip(class_ids, labels, probabilities)]
        valid = column.is_valid().to_pylist()
        return [', "predictions": [' + ", ".join(texts[a - start:b - start]) + "]}" if ok else None
                for ok, a, b in zip(valid, offsets[:-1].tolist(), offsets[1:].tolist())]

    def top_labels(self, batch: pa.RecordBatch) -> dict[str, int]:
        """How often each class came first in the batch's ``predictions`` (its label, else its id)."""
        predictions = batch.column("predictions")
        predictions = predictions.filter(pc.greater(pc.list_value_length(predictions), 0))
        if not len(predictions):
            return {}
        first = pc.list_element(predictions, 0)  # one struct array: its fields as columns, no dict per row
        return dict(Counter(str(label if label is not None else class_id) for label, class_id
                            in zip(first.field("label").to_pylist(), first.field("class_id").to_pylist())))

    def row_bytes(self, settings, model_summary: dict) -> tuple[float, str]:
        return settings.top_k * PREDICTION_BYTES, f"{settings.top_k} predictions"

    def check(self, settings, facts) -> None:
        if facts.num_classes is not None and settings.top_k > facts.num_classes:
            raise ValueError(f"--top-k {settings.top_k} is larger than the model's {facts.num_classes} classes")


#: The task (``mxjob/tasks/__init__.py`` registers it).
TASK = ClassifyTask()
