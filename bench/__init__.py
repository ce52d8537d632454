"""``make bench``: throughput and memory of the job on this machine (not a test)."""
