"""Plain values several layers read: the settings' choices and every setting's default. No imports.

The executors, the library and the S3 layer read their defaults here, so
none of them imports the option table (:mod:`mxjob.options.settings`, with click
and the driver's checks). The choices are declared here, by hand; the
defaults below the marker are generated from :data:`mxjob.options.settings.SETTINGS`
by ``make docs``, and ``tests/unit/options/test_settings.py`` fails when they differ:
the table stays the one declaration of a setting.
"""

#: ``--resize``: straight to W x H, or the short side to ``H*256/224`` then a centre crop.
RESIZE_MODES = ("stretch", "short-side-crop")
#: ``--decode``: JPEG DCT scaling (``draft``) or every pixel (``exact``).
DECODE_MODES = ("draft", "exact")
#: ``--precision``.
PRECISIONS = ("fp32", "int8")
#: ``--batch-size auto``: the driver picks the batch from what its sample measured (``mxjob.planning.batchsize``).
AUTO = "auto"
#: ``--output-format``.
OUTPUT_FORMATS = ("jsonl", "parquet")
#: How an output URI names an Iceberg table (mxjob.outputs.iceberg): iceberg://CATALOG/NAMESPACE.TABLE.
ICEBERG_SCHEME = "iceberg://"
#: ``--s3-reader`` choices: ``lean`` signs most GETs itself (:class:`mxjob.s3.object_reader.ObjectReader`),
#: ``botocore`` never does.
S3_READERS = ("lean", "botocore")

# ---- generated from mxjob/options/settings.py's SETTINGS by `make docs`; do not edit below this line

class DEFAULT:
    """Every setting's default as the library and the executors use it (``Setting.library_default``)."""

    input = None
    bucket = None
    prefix = ''
    input_manifest = None
    suffixes = ('.jpg', '.jpeg', '.png', '.gif', '.bmp', '.tif', '.tiff', '.webp')
    limit = None
    model = None
    epoch = 0
    labels = None
    sym_url = None
    param_url = None
    label_url = None
    data_name = 'data'
    context = 'cpu'
    handler = None
    plugin = ()
    output = None
    output_s3_bucket = None
    output_s3_key = None
    output_format = None
    with_object_metadata = False
    rows_per_file = 'auto'
    resume = False
    overwrite = False
    skip_existing = False
    rescore_errors = False
    commit_seconds = 300
    accept_other_fingerprint = False
    batch_size = 64
    task = 'classify'
    top_k = 5
    output_layer = None
    embedding_dtype = 'float32'
    normalize = False
    min_score = 0.3
    max_detections = 100
    input_shape = (3, 224, 224)
    mean = (0.0,)
    std = (1.0,)
    resize = 'stretch'
    max_image_pixels = 64000000
    decode = 'draft'
    endpoint_url = None
    region = None
    s3_max_attempts = 5
    max_errors = '1%'
    max_object_bytes = 52428800
    precision = 'fp32'
    calibration_images = 256
    min_agreement = 0.99
    int8_exclude = ()
    int8_search_seconds = 120.0
    estimate_images = 32
    estimate_cluster = None
    node_price = None
    master_price = None
    dry_run = False
    app_name = 'mxnet-batch-inference'
    log_level = 'INFO'
    progress_seconds = 15.0
    list_concurrency = 16
    s3_reader = 'lean'
    io_threads = 16
    max_in_flight = 128
    micro_batch_size = 16
    threads = None
    forward_lanes = None


#: The settings an executor reads (``to="executor"``): ``JobSpec``'s option fields, in table order.
EXECUTOR_SETTINGS = ("with_object_metadata", "batch_size", "task", "top_k", "embedding_dtype", "normalize",
    "min_score", "max_detections", "endpoint_url", "region", "s3_max_attempts", "max_object_bytes", "precision",
    "s3_reader", "io_threads", "max_in_flight", "micro_batch_size", "threads", "forward_lanes")
