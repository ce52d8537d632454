"""Defaults the library's signatures share: each written once, here.

The job's options take theirs from :class:`mxjob.partition.JobSpec` and
:class:`mxjob.preprocess.Preprocess`, which take these; ``--help`` and
``conf/defaults.yaml`` show the same values (``tests/test_config.py`` checks).
"""

#: ``(C, H, W)`` of one model input: ImageNet's usual size.
INPUT_SHAPE = (3, 224, 224)
#: Images per batch (one Spark partition) and, unless told otherwise, per forward pass.
BATCH_SIZE = 64
#: Predictions per image.
TOP_K = 5
#: Images declaring more pixels are refused before any pixel is decoded (a 64 MP photo passes).
MAX_IMAGE_PIXELS = 64_000_000
