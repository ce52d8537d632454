"""The job's code, one concern per module; ``mxinfer`` (executors, library) and ``infer_main`` (driver CLI) sit on top.

Executor side: ``preprocess``, ``model``, ``device``, ``int8``, ``handlers``,
``udf``, ``worker``, ``partition``, ``stats``, ``state``, ``errors``, ``defaults``.
Driver side: ``config`` (options, defaults, YAML), ``driver`` (the run from
listing to summary), ``cluster`` (the Spark job), ``summary``, ``signals``,
``listing``, ``manifest``, ``durable``. ``make package`` zips this package
with ``mxinfer.py`` and ``utils.py`` into the ``--py-files`` zip.
"""
