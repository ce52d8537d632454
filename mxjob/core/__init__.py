"""What every layer reads: the settings' choices and defaults, what a failure looks like, and per-process state."""
