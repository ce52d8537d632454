"""The driver's sequence: the run's steps, the Spark job, the early SparkContext, the dry run, signals, resuming."""
