"""--task detect: boxes from a model whose output is MXNet's detection layout (batch, anchors, 6)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mxjob.core import constants
from mxjob.model.predictor import ModelError, Predictor, encoded, preprocess_for, read_labels
from mxjob.model.preprocess import Geometry, Preprocess, decode_image_geometry, map_boxes


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
            name = self._symbol.list_outputs()[0]
            raise ModelError(f"--task detect needs a model whose output is MXNet's detection layout (batch, anchors, "
                             f"6); its output {name} has shape {(self.batch_size, *shape)}")
        self.labels, _ = read_labels(self.spec)
        self.preprocess = preprocess_for(self, preprocess)

    def label(self, class_id: int) -> str | None:
        """The label of ``class_id``; ``None`` without labels or beyond them."""
        return self.labels[class_id] if self.labels and 0 <= class_id < len(self.labels) else None

    def detect(self, array: np.ndarray, geometries: Sequence[Geometry],
               min_score: float = constants.DEFAULT.min_score,
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
        return [{"image_size": [g.width, g.height],
                 "detections": [{"class_id": c, "label": label, "score": score, "box": box}
                                for c, label, score, box in dets]}
                for (_, g), dets in zip(decoded, found)]
