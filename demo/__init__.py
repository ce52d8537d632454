"""The demo: a digits classifier trained here, a local S3 server, and ``make run-local``."""
