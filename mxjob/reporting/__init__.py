"""What the user sees: the run's records, summary, status, progress, report and watch."""
