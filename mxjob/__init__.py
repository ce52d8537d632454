"""The job's code, one package per stage; ``mxinfer`` (executors, library) and ``infer_main`` (driver CLI) sit on top.

``core`` (constants, errors, per-process state) and ``s3`` (every S3 call)
serve all; ``model`` (the checkpoint, the recipe, the device, threads),
``results`` (one schema per task and its views), ``inputs`` (the key list,
manifests) and ``executor`` (one Spark task: download, decode, score, write)
are what the executors and the library run. The driver adds ``options``
(every option, declared once, and the resolved settings), ``int8``,
``planning`` (the sample, the batch size, the estimate), ``outputs`` (the
work prefix, the merge, the sinks, datasets and tables), ``run`` (the run's
sequence and its Spark job) and ``reporting`` (summary, status, report,
watch). docs/layout.md maps every module. ``make package`` zips this package
with ``mxinfer.py`` and ``utils.py`` into the ``--py-files`` zip.
"""
