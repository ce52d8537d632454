"""Large manifests for the tests of the manifest's reading and sorting: ImageNet-like keys, not in byte order."""

from __future__ import annotations

from pathlib import Path

#: Keys per folder: ``n01440000/n01440000_0.JPEG`` to ``_999.JPEG``, whose byte order is not their number order.
FOLDER_KEYS = 1000


def write_manifest(path: Path, count: int, bucket: str = "bench", size: int = 110_000) -> None:
    """A ``bucket,key,size`` CSV of ``count`` keys, with its header."""
    with open(path, "w", newline="") as out:
        out.write("bucket,key,size\n")
        for i in range(count):
            folder = f"n{1440000 + i // FOLDER_KEYS:08d}"
            out.write(f"{bucket},train/{folder}/{folder}_{i % FOLDER_KEYS}.JPEG,{size}\n")
