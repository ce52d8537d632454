"""The result model: one Arrow record batch per batch of images, and its views (part, JSON Lines, Parquet, Athena)."""
