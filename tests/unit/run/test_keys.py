"""The run's keys: a prefix without its ``/`` that took keys beside the folder is named (mxjob/run/keys.py)."""

from __future__ import annotations

import logging

import pytest

from mxjob.inputs.listing import Listing
from mxjob.run import keys

KEYS = ["photos/a.jpg", "photos/b.jpg", "photos/c/d.jpg", "photos-2023/e.jpg", "photos.old/f.jpg"]


def listed(prefix: str) -> Listing:
    taken = [key for key in KEYS if key.startswith(prefix)]
    return Listing.build("b", taken, [1] * len(taken), suffixes=[".jpg"])


def test_a_prefix_without_its_slash_that_took_keys_beside_the_folder_is_named(caplog):
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        keys.warn_of_neighbours(listed("photos"), "s3://b/photos", "photos")
    [record] = caplog.records
    assert record.getMessage() == (
        "--input s3://b/photos is a key prefix, not a folder: it takes 3 images under photos/ and 2 images beside "
        "it, such as photos-2023/e.jpg; end it in / to score only the folder")


@pytest.mark.parametrize("prefix", ["photos/", "photos/c", "photos-", "photos/a", ""],
                         ids=["a-folder", "only-a-folder-beneath", "only-beside", "a-name-part", "the-bucket"])
def test_a_prefix_that_took_only_one_side_is_not_named(caplog, prefix):
    with caplog.at_level(logging.WARNING, logger=keys.__name__):
        keys.warn_of_neighbours(listed(prefix), f"s3://b/{prefix}", prefix)
    assert caplog.records == []
