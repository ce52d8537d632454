"""What a Spark task runs: one batch downloaded, decoded, scored and made durable; its stats; the model's check."""
