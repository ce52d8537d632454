"""The job's code, one concern per module; ``mxinfer`` (executors, library) and ``infer_main`` (driver CLI) sit on top.

Executor side: ``partition`` (one Spark task: download, decode, score, write),
``preprocess``, ``model``, ``results`` (one schema per task), ``part_format``
(a batch's durable part), ``jsonl_view``, ``device``, ``int8``, ``handlers``,
``udf``, ``worker`` (threads and memory), ``state`` (per-process caches),
``stats``, ``errors``.
Driver side: ``settings`` (every option, declared once), ``config`` (the YAML
layer and the resolved settings), ``driver`` (the run from listing to
summary), ``manifest`` (with ``manifest_text`` and ``inventory``), ``sizing``,
``estimate`` and ``batchsize`` (the sample, the estimate, the batch),
``int8_prep``, ``dry_run``, ``cluster`` (the Spark job), ``merge`` and
``sinks`` (the output; ``parquet_view`` and ``athena_table``), ``dataset``,
``summary``, ``status``, ``report``, ``signals``; ``s3`` holds the S3 access
of both sides. docs/layout.md maps every module. ``make package`` zips this
package with ``mxinfer.py`` and ``utils.py`` into the ``--py-files`` zip.
"""
