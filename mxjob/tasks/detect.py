"""--task detect: boxes from a model whose output is MXNet's detection layout (batch, anchors, 6).

:class:`ObjectDetector` keeps the boxes that score enough and maps them onto
the upright image; :data:`TASK` is the task (``image_size
fixed_size_list<int32>[2], detections list<struct<class_id int32, label
string, score float32, box fixed_size_list<float32>[4]>>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core import constants
from mxjob.model.predictor import ModelError, Predictor, encoded, preprocess_for, read_labels
from mxjob.model.preprocess import Geometry, Preprocess, decode_image_geometry, map_boxes
from mxjob.results import jsonl_view
from mxjob.tasks.base import Task, TaskOption, forward_or_fail


class ObjectDetector(Predictor):
    """A :class:`Predictor` whose output is MXNet's detection layout; boxes in the pixels of each image.

    The model's first output is ``(batch, anchors, 6)``: ``class_id, score,
    xmin, ymin, xmax, ymax``, coordinates in 0..1 of the model's input and
    ``class_id`` -1 for suppressed rows, as ``mx.sym.contrib.MultiBoxDetection``
    gives. Labels are optional (``synset.txt`` beside the model, or ``spec.labels_uri``).
    :meth:`detect_images` decodes as the job does and maps each box back onto
    the image as its EXIF orientation shows it.

    Examples
    --------
    >>> d = ObjectDetector("file:///models/ssd", (3, 300, 300), batch_size=4)  # doctest: +SKIP
    >>> d.detect_images(["cat.jpg"], min_score=0.5)[0]["detections"][0]  # doctest: +SKIP
    {'class_id': 7, 'label': 'cat', 'score': 0.91, 'box': [12.0, 30.5, 410.0, 388.0]}
    """

    def __init__(self, model, input_shape=constants.DEFAULT.input_shape, batch_size: int = constants.DEFAULT.batch_size,
                 context: str | None = None, preprocess: Preprocess | None = None):
        super().__init__(model, input_shape, batch_size, context)
        shape = self.output_shapes[0]
        if len(shape) != 2 or shape[1] != 6:
            hint = "; one value per class, as a classifier's is: --task classify" if len(shape) == 1 else ""
            raise ModelError(f"--task detect needs a model whose output is MXNet's detection layout (batch, anchors, "
                             f"6); its output {self._symbol.list_outputs()[0]} has shape {(self.batch_size, *shape)}"
                             f"{hint}")
        self.labels, _ = read_labels(self.spec)
        self.preprocess = preprocess_for(self, preprocess)

    def label(self, class_id: int) -> str | None:
        """The label of ``class_id``; ``None`` without labels or beyond them."""
        return self.labels[class_id] if self.labels and 0 <= class_id < len(self.labels) else None

    def detect(self, array: np.ndarray, geometries: Sequence[Geometry], min_score: float = constants.DEFAULT.min_score,
               max_detections: int = constants.DEFAULT.max_detections) -> list[list[tuple]]:
        """Per row of ``array``, ``(class_id, label, score, box)`` best first, ``box`` in pixels of its image.

        ``geometries`` (one per row, from :func:`decode_image_geometry`) say
        where each input came from. Suppressed rows (class -1) and scores
        under ``min_score`` are left out; at most ``max_detections`` remain.
        """
        rows = self.predict(array)[0]
        return [self.image_detections(row, geometry, min_score, max_detections)
                for row, geometry in zip(rows, geometries)]

    def image_detections(self, row: np.ndarray, geometry: Geometry, min_score: float,
                         max_detections: int) -> list[tuple]:
        """One image's ``(anchors, 6)`` output as :meth:`detect` returns it."""
        if not np.isfinite(row).all():
            raise FloatingPointError("model output is not finite")
        kept = row[(row[:, 0] >= 0) & (row[:, 1] >= min_score)]
        kept = kept[np.argsort(-kept[:, 1], kind="stable")][:max_detections]
        boxes = map_boxes(kept[:, 2:6], geometry)
        return [(int(d[0]), self.label(int(d[0])), float(np.float32(d[1])), [float(v) for v in box])
                for d, box in zip(kept, boxes)]

    def detect_images(self, images: Sequence, min_score: float = constants.DEFAULT.min_score,
                      max_detections: int = constants.DEFAULT.max_detections) -> list[dict]:
        """Detect in encoded bytes, file paths or PIL images: per image ``image_size`` and ``detections``.

        Each detection is a dict of ``class_id``, ``label`` (``None`` without
        labels), ``score`` and ``box`` (``xmin, ymin, xmax, ymax`` in pixels of
        the image as its EXIF orientation shows it), best first.
        """
        decoded = [decode_image_geometry(encoded(image), self.preprocess) for image in images]
        if not decoded:
            return []
        found = self.detect(np.stack([a for a, _ in decoded]), [g for _, g in decoded], min_score, max_detections)
        return [{"image_size": [g.width, g.height], "detections": detection_entries(dets)}
                for (_, g), dets in zip(decoded, found)]


# ----------------------------------------------------------------------------
# The task


BOX = pa.list_(pa.float32(), 4)
DETECTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("score", pa.float32()), ("box", BOX)])
IMAGE_SIZE = pa.list_(pa.int32(), 2)
#: Bytes per detection (class id, label, score, four coordinates) and detections per image a row's size assumes.
DETECTION_BYTES, TYPICAL_DETECTIONS = 40, 10


def detection_entries(detections: Iterable[tuple]) -> list[dict]:
    """``(class_id, label, score, box)`` tuples (``ObjectDetector.detect``) as the ``detections`` column's rows."""
    return [{"class_id": c, "label": label, "score": score, "box": list(box)} for c, label, score, box in detections]


class DetectTask(Task):
    """Boxes per image (``image_size``, ``detections``), each with its class and score, best first."""

    name = "detect"
    summary = "boxes per image, each with its class and score (--min-score, --max-detections)"
    options = (
        TaskOption("min_score", "--min-score", "detect: boxes scoring less are left out.", default=0.3,
                   kind="number", minimum=0, maximum=1),
        TaskOption("max_detections", "--max-detections", "detect: at most this many boxes per image, best first.",
                   default=100),
    )
    model_class = ObjectDetector
    takes_input_handler = False
    meanings: ClassVar[dict] = {
        "image_size": "`[W, H]` of the image as its EXIF orientation shows it; null for an error row",
        "detections": "boxes scoring at least `--min-score`, best first, at most `--max-detections`; "
                      "`box` is `[xmin, ymin, xmax, ymax]` in pixels of that upright image; `label` is null "
                      "without labels; null for an error row",
    }
    doc_examples: ClassVar[tuple] = (("detect", {}, "photo_boxes", "s3://my-bucket/boxes/"),)

    def columns(self) -> list[pa.Field]:
        return [pa.field("image_size", IMAGE_SIZE), pa.field("detections", pa.list_(DETECTION))]

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        return [pa.array([v[0] if v is not None else None for v in values], IMAGE_SIZE),
                pa.array([v[1] if v is not None else None for v in values], pa.list_(DETECTION))]

    def decode(self, data: bytes, preprocess: Preprocess):
        """The input and where it came from in the image (:func:`decode_image_geometry`): boxes map back through it."""
        return decode_image_geometry(data, preprocess)

    def score(self, model: ObjectDetector, keys, inputs, job, out) -> None:
        rows = forward_or_fail(lambda: model.predict(np.stack([array for array, _ in inputs]))[0], keys, out)
        if rows is None:
            return
        for key, row, (_, geometry) in zip(keys, rows, inputs):
            try:
                found = model.image_detections(row, geometry, job.min_score, job.max_detections)
                out.add(key, ([geometry.width, geometry.height], detection_entries(found)))
            except Exception as exc:  # noqa: BLE001 - a non-finite output fails its image only
                out.fail_stage(key, "predict", exc)

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        sizes = batch.column("image_size")
        detections = batch.column("detections")
        offsets = detections.offsets.to_numpy()
        start, stop = int(offsets[0]), int(offsets[-1])
        entries = detections.values.slice(start, stop - start)
        scores = pc.cast(entries.field("score"), pa.string()).to_pylist()
        boxes = jsonl_view.number_lists(entries.field("box"))
        labels = entries.field("label").to_pylist()
        texts = [jsonl_view.class_head(c, label) + f'"score": {score}, "box": [{box}]}}'
                 for c, label, score, box in zip(entries.field("class_id").to_pylist(), labels, scores, boxes)]
        return [None if size is None else f', "image_size": [{size[0]}, {size[1]}], "detections": ['
                + ", ".join(texts[a - start:b - start]) + "]}"
                for size, a, b in zip(sizes.to_pylist(), offsets[:-1].tolist(), offsets[1:].tolist())]

    def row_bytes(self, settings, model_summary: dict) -> tuple[float, str]:
        return TYPICAL_DETECTIONS * DETECTION_BYTES + 8, f"about {TYPICAL_DETECTIONS} detections"


#: The task (``mxjob/tasks/__init__.py`` registers it).
TASK = DetectTask()
