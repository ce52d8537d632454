"""The model anywhere: the checkpoint bound as a Module, the decoding recipe, the device, threads, a user's handlers."""
