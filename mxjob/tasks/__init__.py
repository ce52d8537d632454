"""The tasks: what the model makes of each image, one module each."""
