"""--precision int8: oneDNN quantization, --int8-exclude auto's search, and the driver's preparation."""
