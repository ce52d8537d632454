"""listing: the compact key list (Arrow columns, zero-copy batches) and parallel listing of a prefix."""

from __future__ import annotations

import logging
import random

import botocore.exceptions
import pyarrow as pa
import pytest

from mxjob.inputs import listing
from mxjob.s3 import lean_list, parallel_list
from tests.support.helpers import make_s3_client

BUCKET = "listing-bucket"
# Nested folders, unicode, spaces and characters the range splitter never cuts at; sizes differ per key.
KEYS = sorted(
    [f"set/{folder}/{i:03d}.jpg" for folder in ("a", "b/deep/er", "c", "Z") for i in range(40)]
    + [f"set/{i:04d}.png" for i in range(60)]
    + ["set/é/café.jpg", "set/日本/写真 1.jpg", "set/😀.png", "set/~tilde.jpg", "set/ space.jpg",
       "set/+plus.jpg", "set/a b/c.jpg", "set/zz/\u00ff.jpg", "set/\u0130.JPG"]
)


@pytest.fixture(scope="module")
def bucket(moto_buckets):
    s3 = moto_buckets
    for n, key in enumerate(KEYS):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x" * (n % 11))
    s3.put_object(Bucket=BUCKET, Key="sets/outside.jpg", Body=b"")  # shares the prefix's text, not its folder
    s3.put_object(Bucket=BUCKET, Key="other/x.jpg", Body=b"")
    return s3


def sequential(endpoint: str, prefix: str) -> list[tuple[str, int]]:
    return list(parallel_list.list_objects(make_s3_client(endpoint), BUCKET, prefix))


# --- the compact list


def test_build_sorts_deduplicates_filters_suffixes_and_limits():
    keys = ["p/b.JPG", "p/a.png", "p/c.txt", "p/a.png", "q/d.jpg", "p/é.jpeg", "p/B.jpg"]
    sizes = [3, 1, 9, 2, 4, None, 7]
    images = listing.Listing.build("bkt", keys, sizes, prefix="p/", suffixes=["jpg", ".PNG", ".jpeg"])
    assert list(images) == [("p/B.jpg", 7), ("p/a.png", 2), ("p/b.JPG", 3), ("p/é.jpeg", -1)]
    assert images.bucket == "bkt"
    assert list(listing.Listing.build("bkt", keys, sizes, suffixes=[".jpg"], limit=2)) == [
        ("p/B.jpg", 7), ("p/b.JPG", 3)]


def test_suffixes_are_case_insensitive_and_exact_on_the_end_of_the_key():
    keys = ["a.JPG", "b.jpeg", "c.png.txt", "d.Tiff", "e", "f.webp", "gjpg"]
    kept = listing.Listing.build("bkt", keys, suffixes=[".jpg", "jpeg", ".tiff", ".webp"])
    assert [key for key, _ in kept] == ["a.JPG", "b.jpeg", "d.Tiff", "f.webp"]



def test_the_suffix_filter_counts_every_key_it_drops_and_names_the_first_ten_in_key_order():
    notes = [f"p/notes-{i:02d}.txt" for i in range(12)]
    keys = [*reversed(notes), "p/a.jpg", "p/b.jpg"]  # a parallel listing's pages come back in any order
    skipped = listing.Skipped(suffixes=[".jpg"])
    images = listing.Listing.build("bkt", keys, suffixes=[".jpg"], skipped=skipped)
    assert [key for key, _ in images] == ["p/a.jpg", "p/b.jpg"]
    assert skipped.entry("not_image") == {"count": 12, "why": "not ending in .jpg", "examples": notes[:10]}

def test_build_orders_keys_as_s3_and_python_do():
    keys = ["a/😀", "a/z", "a/é", "a/Z", "a/日", "a/\u00ff", "a/ ", "a/~"]
    images = listing.Listing.build("bkt", keys)
    assert [key for key, _ in images] == sorted(keys)  # code point order: S3's, for valid UTF-8


def test_a_listing_is_a_sequence_whose_slices_share_its_memory():
    images = listing.Listing.build("bkt", [f"k/{i:06d}.jpg" for i in range(100_001)], list(range(100_001)))
    assert len(images) == 100_001
    assert images[0] == ("k/000000.jpg", 0) and images[-1] == ("k/100000.jpg", 100_000)
    assert sum(1 for _ in images) == 100_001  # iterates across its internal chunks
    batch = images[3 * 64: 4 * 64]
    assert list(batch) == [(f"k/{i:06d}.jpg", i) for i in range(192, 256)]
    assert batch.bucket == "bkt"
    assert images.num_batches(64) == 1563 and len(images[1562 * 64: 1563 * 64]) == 100_001 - 1562 * 64
    parent = images.keys.chunks[0].buffers()[2].address
    assert batch.keys.chunks[0].buffers()[2].address == parent  # the same bytes: no copy
    assert images.keys.type == pa.large_string()
    with pytest.raises(IndexError, match="out of range for 100001 keys"):
        images[100_001]
    with pytest.raises(ValueError, match="step 1 only"):
        images[::2]


def test_split_range_covers_the_range_exactly_whatever_the_keys():
    rng = random.Random(7)
    alphabet = "ab/Z09 _-.~é日😀\x7f"
    for _ in range(500):
        words = sorted({"p/" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(30)})
        last = rng.choice(words)
        end = rng.choice([None, *[w for w in words if w > last]])
        ranges = parallel_list.split_range("p/", last, end, rng.randint(1, 20))
        assert ranges[0][0] == last and ranges[-1][1] == end
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous
        assert all(low < high for low, high in ranges if high is not None)  # none empty or reversed
        for word in words:
            inside = [(low, high) for low, high in ranges if word > low and (high is None or word <= high)]
            wanted = word > last and (end is None or word <= end)
            assert len(inside) == (1 if wanted else 0), (word, last, end, ranges)


# --- listing a prefix against the moto server


@pytest.mark.parametrize("concurrency, page_size", [(1, 7), (4, 7), (16, 5), (16, 1000)])
def test_parallel_listing_equals_sequential_listing(bucket, moto_endpoint, concurrency, page_size):
    client = lean_list.list_client(moto_endpoint)
    keys, sizes = parallel_list.list_prefix(client, BUCKET, "set/", concurrency, page_size=page_size)
    got = listing.Listing.build(BUCKET, keys, sizes)
    assert list(got) == sequential(moto_endpoint, "set/") == [(k, n % 11) for n, k in enumerate(KEYS)]
    assert len(keys) == len(KEYS)  # no key listed twice by two ranges


def test_parallel_listing_calls_fan_out(bucket, moto_endpoint):
    client = lean_list.list_client(moto_endpoint)
    calls = []
    client.meta.events.register("provide-client-params.s3.ListObjectsV2",
                                lambda params, **_: calls.append(dict(params)))
    parallel_list.list_prefix(client, BUCKET, "set/", 8, page_size=10)
    starts = {call.get("StartAfter") for call in calls}
    assert len(calls) > len(KEYS) / 10 and len(starts) == len(calls)  # every call listed a different range


def test_listing_logs_progress_every_n_keys(bucket, moto_endpoint, caplog):
    with caplog.at_level(logging.INFO, logger=parallel_list.__name__):
        parallel_list.list_prefix(lean_list.list_client(moto_endpoint), BUCKET, "set/", 4, page_size=10,
                                  progress_every=50)
    progress = [r.getMessage() for r in caplog.records if "keys so far" in r.getMessage()]
    assert len(progress) >= 4 and all(f"listing s3://{BUCKET}/set/:" in line for line in progress)
    assert any(f"listed s3://{BUCKET}/set/: {len(KEYS)} keys" in r.getMessage() for r in caplog.records)


def test_an_empty_prefix_lists_nothing_and_a_missing_bucket_raises(bucket, moto_endpoint):
    client = lean_list.list_client(moto_endpoint)
    keys, sizes = parallel_list.list_prefix(client, BUCKET, "nothing-here/", 8)
    assert len(keys) == len(sizes) == 0
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        parallel_list.list_prefix(client, "no-such-bucket-listing", "p/", 8)


def test_the_list_client_reads_keys_and_sizes_itself_as_botocore_would(bucket, moto_endpoint):
    page = lean_list.list_client(moto_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="set/")
    assert "Contents" not in page and page["KeyCount"] == len(KEYS)  # botocore parsed the rest
    assert list(zip(*page["KeysAndSizes"])) == sequential(moto_endpoint, "set/")


def test_a_cut_off_page_is_still_retried_by_botocore(bucket, moto_endpoint):
    from tests.support.fault_proxy import FaultProxy, Faults

    with FaultProxy(moto_endpoint, faults=Faults(rate=0.3, kinds=("cut",), seed=3)) as proxy:
        client = lean_list.list_client(proxy.endpoint, max_attempts=10)
        keys, sizes = parallel_list.list_prefix(client, BUCKET, "set/", 4, page_size=20)
    assert proxy.counts["cut"] >= 2, proxy.counts
    assert list(listing.Listing.build(BUCKET, keys, sizes)) == sequential(moto_endpoint, "set/")



def test_a_prefix_listing_counts_and_names_the_keys_that_are_not_images(bucket, moto_endpoint):
    from mxjob.options import config
    from mxjob.run import keys

    for key in ("mixed/a.jpg", "mixed/notes.txt", "mixed/b.PNG", "mixed/README"):
        bucket.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    cfg = config.resolve(config.merge_settings({"input": f"s3://{BUCKET}/mixed/", "model": "s3://m/r",
                                                "output": "s3://o/k.jsonl", "endpoint_url": moto_endpoint,
                                                "suffixes": ".jpg,.png"}, {}))
    images = keys.list_images(None, cfg)
    assert [key for key, _ in images] == ["mixed/a.jpg", "mixed/b.PNG"]
    assert images.skipped_keys == {"count": 2, "why": "not ending in .jpg .png",
                                   "examples": ["mixed/README", "mixed/notes.txt"]}

PAGE = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Name>b</Name>{encoding}<Contents><Key>{first}</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>"
        "<Size>5</Size></Contents><Contents><Key>p/b</Key><Size>7</Size></Contents>"
        "<IsTruncated>false</IsTruncated></ListBucketResult>")


@pytest.mark.parametrize("encoding, first, key", [
    ("<EncodingType>url</EncodingType>", "p/a+%26+%C3%A9.jpg", "p/a & é.jpg"),  # the regular expression
    ("", "p/a &amp; é.jpg", "p/a & é.jpg"),  # not url-encoded: ElementTree unescapes
])
def test_the_page_reader_decodes_keys_as_botocore_does(encoding, first, key):
    response = {"status_code": 200, "body": PAGE.format(encoding=encoding, first=first).encode()}
    custom: dict = {}
    lean_list._keys_and_sizes(response_dict=response, customized_response_dict=custom)
    assert custom["KeysAndSizes"] == ([key, "p/b"], [5, 7])
    assert b"<Contents>" not in response["body"] and b"<IsTruncated>false" in response["body"]


def test_list_concurrency_below_one_is_a_usage_error(runner):
    import infer_main

    result = runner.invoke(infer_main.main, ["--input", "s3://in/p/", "--model", "s3://m/r18",
                                             "--output", "s3://o/p.jsonl", "--list-concurrency", "0"])
    assert result.exit_code == 2
    assert "--list-concurrency" in result.output and "0 is not in the range 1<=x<=1024" in result.output
