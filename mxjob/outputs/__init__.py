"""Where the results go: the work prefix, the merge, the sinks, a dataset, an Iceberg table, and what may be written."""
