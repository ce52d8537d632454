"""Before the run: its batch size from a measured sample, and the estimate of its time and cost."""
