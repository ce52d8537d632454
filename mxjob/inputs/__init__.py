"""The job's keys: a prefix listed, or a manifest read, held in Arrow, sorted; and the run's keys in batch order."""
