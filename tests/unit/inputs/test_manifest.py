"""--input-manifest: plain text, CSV and S3 Inventory (CSV, ORC, Parquet) manifests, and their errors."""

from __future__ import annotations

import gzip
import json
import re
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.orc
import pyarrow.parquet
import pytest

import infer_main
from mxjob.inputs import manifest, manifest_text
from tests.support.helpers import make_s3_client

BUCKET = "manifest-images"
INVENTORY = "manifest-inventory"
BUCKETS = (BUCKET, INVENTORY)
SUFFIXES = (".jpg", ".png")
# (key, size): unicode, a space, a plus and a comma, which inventory CSV URL-encodes and CSV quotes.
OBJECTS = [("photos/a b+c.jpg", 10), ("photos/café,1.png", 20), ("photos/日本.jpg", 30), ("photos/z.jpg", 40)]


@pytest.fixture(scope="module")
def s3(moto_buckets):
    """The session's client, with BUCKETS created."""
    return moto_buckets


def read(path, client=None, **kwargs) -> list[tuple[str, int]]:
    return list(manifest.read_manifest(str(path), client, suffixes=SUFFIXES, **kwargs))


# --- plain text and CSV


def test_text_manifest_of_uris_and_bare_keys(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_bytes("\n".join([f"s3://{BUCKET}/photos/z.jpg", "", f"s3://{BUCKET}/photos/日本.jpg\r",
                                "photos/a b+c.jpg", "photos/readme.txt", f"s3://{BUCKET}/photos/z.jpg"]).encode())
    images = manifest.read_manifest(str(path), bucket=BUCKET, suffixes=SUFFIXES)
    assert images.bucket == BUCKET
    assert list(images) == [("photos/a b+c.jpg", -1), ("photos/z.jpg", -1), ("photos/日本.jpg", -1)]


def test_every_key_the_manifest_names_gets_a_line_or_is_counted_and_named_as_skipped(tmp_path, caplog):
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(["photos/a.jpg", "photos/b.jpg", "photos/a.jpg", "", "elsewhere/c.jpg",
                               "elsewhere/d.jpg", "photos/notes.txt", "photos/e.png", "photos/a.jpg"]) + "\n")
    images = manifest.read_manifest(str(path), bucket=BUCKET, prefix="photos/", suffixes=SUFFIXES)
    assert [key for key, _ in images] == ["photos/a.jpg", "photos/b.jpg", "photos/e.png"]
    report = images.manifest
    assert (report["keys_named"], report["images"], report["duplicates"]) == (8, 3, 2)
    assert report["skipped"] == {
        "outside_input": {"count": 2, "why": "not under the input prefix 'photos/'",
                          "examples": ["elsewhere/c.jpg", "elsewhere/d.jpg"]},
        "not_image": {"count": 1, "why": "not ending in .jpg .png", "examples": ["photos/notes.txt"]}}
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "2 keys skipped, not under the input prefix 'photos/' (outside_input; e.g. elsewhere/c.jpg" in warning
    assert "1 key skipped, not ending in .jpg .png (not_image; e.g. photos/notes.txt)" in warning
    assert "2 repeated keys (each key gets one line)" in warning


def test_a_manifest_line_longer_than_an_s3_key_is_skipped_and_shown_short(tmp_path):
    """A 20 KB line names no object (S3 keys are at most 1,024 bytes): it is counted and named by its start and
    its length, never scored into a 20 KB error row."""
    huge = "photos/" + "x" * 20_000 + ".jpg"
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(["photos/a.jpg", huge, "photos/" + "é" * 600 + ".jpg", "photos/b.txt"]) + "\n")
    images = manifest.read_manifest(str(path), bucket=BUCKET, prefix="photos/", suffixes=SUFFIXES)
    assert [key for key, _ in images] == ["photos/a.jpg"]
    skipped = images.manifest["skipped"]
    assert skipped["too_long"]["count"] == 2 and "1,024-byte limit" in skipped["too_long"]["why"]
    assert all(len(example) < 120 and example.endswith(" bytes)") for example in skipped["too_long"]["examples"])
    assert "(20,011 bytes)" in " ".join(skipped["too_long"]["examples"])
    assert skipped["not_image"]["count"] == 1  # the long keys are counted once, as too long


def test_a_manifest_whose_keys_are_all_kept_reports_nothing_skipped(tmp_path, caplog):
    path = tmp_path / "keys.txt"
    path.write_text("photos/a.jpg\nphotos/b.jpg\n")
    images = manifest.read_manifest(str(path), bucket=BUCKET, suffixes=SUFFIXES, limit=1)
    assert images.manifest == {"uri": str(path), "keys_named": 2, "images": 1, "duplicates": 0, "skipped": {}}
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_manifest_of_no_image_says_what_it_skipped(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("other/a.jpg\nphotos/readme.txt\n")
    skipped = r"1 key skipped, not under the input prefix 'photos/' \(outside_input; e\.g\. other/a\.jpg\)"
    with pytest.raises(manifest.ManifestError, match=r"names no image under 'photos/' .*" + skipped):
        manifest.read_manifest(str(path), bucket=BUCKET, prefix="photos/", suffixes=SUFFIXES)


def test_text_manifest_takes_its_bucket_from_its_uris_and_input_filters_by_prefix(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"s3://{BUCKET}/photos/z.jpg\ns3://{BUCKET}/other/y.jpg\n")
    assert manifest.read_manifest(str(path), suffixes=SUFFIXES).bucket == BUCKET
    assert read(path, bucket=BUCKET, prefix="other/") == [("other/y.jpg", -1)]


def test_csv_manifest_with_and_without_sizes(tmp_path):
    with_sizes = tmp_path / "with.csv"
    with_sizes.write_text("bucket,key,size\n" + "".join(f'{BUCKET},"{key}",{size}\n' for key, size in OBJECTS))
    assert read(with_sizes) == sorted(OBJECTS)
    without = tmp_path / "without.csv"
    without.write_text("".join(f'{BUCKET},"{key}"\n' for key, _ in OBJECTS) + f"{BUCKET},photos/q.jpg,\n")
    assert read(without) == sorted([(key, -1) for key, _ in OBJECTS] + [("photos/q.jpg", -1)])


def test_text_manifest_malformed_lines_are_named_by_number(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"photos/a.jpg\nhttp://host/x.jpg\n\ns3://" + BUCKET.encode() + b"/\nphotos/\xff.jpg\n")
    with pytest.raises(manifest.ManifestError, match=r"3 malformed line\(s\): line 2: 'http://host/x.jpg' is not "
                                                     r"s3://BUCKET/KEY; line 4: .*; line 5: not UTF-8 text"):
        read(path, bucket=BUCKET)


def test_csv_manifest_malformed_lines_are_named_by_number(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(f"{BUCKET},photos/a.jpg,1\n{BUCKET}\n{BUCKET},photos/b.jpg,12kB\n,photos/c.jpg\n"
                    f'{BUCKET},"photos/d\nwith newline.jpg",4\n{BUCKET},photos/e.jpg,5,extra\n')
    with pytest.raises(manifest.ManifestError, match=r"bad\.csv has 4 malformed line\(s\)") as raised:
        read(path)
    message = str(raised.value)
    assert "4 malformed line(s)" in message
    assert "line 2: 1 fields, expected bucket,key or bucket,key,size" in message
    assert "line 3: size '12kB' is not a whole number of bytes" in message
    assert "line 4: empty bucket or key" in message
    assert "line 7: 4 fields" in message  # counted after the quoted key that spans lines 5 and 6


@pytest.mark.parametrize(("name", "text", "bucket", "match"), [
    ("two.csv", "b-one,photos/a.jpg\nb-two,photos/b.jpg\nb-one,photos/c.jpg\n", None,
     "names keys in 2 buckets \\(b-one, b-two\\); one job reads one bucket: split the manifest by bucket"),
    ("one.csv", "b-one,photos/a.jpg\n", "other", "names keys in bucket b-one, not in the input bucket other"),
    ("keys.txt", "photos/a.jpg\n", None,
     "without a bucket: write them as s3://BUCKET/KEY, or give their bucket with --input"),
])
def test_a_manifest_that_does_not_name_the_one_input_bucket_is_refused(tmp_path, name, text, bucket, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(manifest.ManifestError, match=match):
        read(path, **({"bucket": bucket} if bucket else {}))


@pytest.mark.parametrize("name, text", [("empty.txt", ""), ("blank.txt", "\n\n"), ("docs.csv", "b-one,a/readme.txt\n"),
                                        ("header.csv", "bucket,key,size\n")])
def test_a_manifest_that_names_no_image_is_a_clear_error(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(manifest.ManifestError, match=r"names no image .*looked for keys ending in \.jpg \.png.*"
                                                     "check the manifest, --input and --suffixes"):
        read(tmp_path / name, bucket="b-one")


def test_a_missing_manifest_is_a_clear_error(tmp_path, s3):
    with pytest.raises(manifest.ManifestError, match="no such file"):
        read(tmp_path / "nope.txt")
    with pytest.raises(manifest.ManifestError, match=f"cannot read --input-manifest s3://{BUCKET}/nope.txt"):
        read(f"s3://{BUCKET}/nope.txt", s3)


def test_a_manifest_on_s3_is_read(s3):
    s3.put_object(Bucket=BUCKET, Key="lists/keys.txt", Body=f"s3://{BUCKET}/photos/z.jpg\n".encode())
    assert read(f"s3://{BUCKET}/lists/keys.txt", s3) == [("photos/z.jpg", -1)]


# --- S3 Inventory


CSV_SCHEMA = "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size, LastModifiedDate"


def inventory_rows() -> list[dict]:
    """Current versions of OBJECTS, plus an old version and a delete marker that must not be listed."""
    rows = [{"bucket": BUCKET, "key": key, "version_id": "v2", "is_latest": True, "is_delete_marker": False,
             "size": size} for key, size in OBJECTS]
    rows.append({"bucket": BUCKET, "key": "photos/old.jpg", "version_id": "v1", "is_latest": False,
                 "is_delete_marker": False, "size": 5})
    rows.append({"bucket": BUCKET, "key": "photos/deleted.jpg", "version_id": "v3", "is_latest": True,
                 "is_delete_marker": True, "size": None})
    return rows


def inventory_csv(rows: list[dict]) -> bytes:
    lines = []
    for row in rows:
        size = "" if row["size"] is None else str(row["size"])
        fields = [row["bucket"], urllib.parse.quote_plus(row["key"], safe="/"), row["version_id"],
                  str(row["is_latest"]).lower(), str(row["is_delete_marker"]).lower(), size, "2024-01-01T00:00:00.000Z"]
        lines.append(",".join(f'"{field}"' for field in fields))
    return gzip.compress(("\n".join(lines) + "\n").encode())


def write_inventory(s3, tmp_path: Path, kind: str, parts: list[bytes], schema: str) -> Path:
    """Upload the data files to the inventory bucket; write manifest.json locally and to S3."""
    files = []
    for i, data in enumerate(parts):
        key = f"inv/{BUCKET}/daily/data/{kind.lower()}-{i}.{ {'CSV': 'csv.gz'}.get(kind, kind.lower()) }"
        s3.put_object(Bucket=INVENTORY, Key=key, Body=data)
        files.append({"key": key, "size": len(data), "MD5checksum": "0"})
    body = {"sourceBucket": BUCKET, "destinationBucket": f"arn:aws:s3:::{INVENTORY}", "version": "2016-11-30",
            "creationTimestamp": "1514944800000", "fileFormat": kind, "fileSchema": schema, "files": files}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(body))
    s3.put_object(Bucket=INVENTORY, Key=f"inv/{BUCKET}/daily/{kind}/manifest.json", Body=path.read_bytes())
    return path


def columnar(kind: str, rows: list[dict]) -> bytes:
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("bucket", pa.string()), ("key", pa.string()), ("version_id", pa.string()), ("is_latest", pa.bool_()),
        ("is_delete_marker", pa.bool_()), ("size", pa.int64())]))
    sink = pa.BufferOutputStream()
    (pyarrow.orc.write_table if kind == "ORC" else pyarrow.parquet.write_table)(table, sink)
    return sink.getvalue().to_pybytes()


def test_inventory_with_gzipped_csv_data_files_decodes_keys_and_keeps_current_versions(s3, tmp_path):
    rows = inventory_rows()
    path = write_inventory(s3, tmp_path, "CSV", [inventory_csv(rows[:3]), inventory_csv(rows[3:])], CSV_SCHEMA)
    assert read(path, s3) == sorted(OBJECTS)
    assert read(f"s3://{INVENTORY}/inv/{BUCKET}/daily/CSV/manifest.json", s3) == sorted(OBJECTS)


@pytest.mark.parametrize("kind", ["ORC", "Parquet"])
def test_inventory_with_orc_or_parquet_data_files(s3, tmp_path, kind):
    rows = inventory_rows()
    path = write_inventory(s3, tmp_path, kind, [columnar(kind, rows[:2]), columnar(kind, rows[2:])],
                           "struct<bucket:string,key:string,version_id:string,is_latest:boolean,"
                           "is_delete_marker:boolean,size:bigint>")
    assert read(path, s3) == sorted(OBJECTS)


def test_inventory_without_sizes_gives_unknown_sizes(s3, tmp_path):
    data = gzip.compress("".join(f'"{BUCKET}","{urllib.parse.quote_plus(k, safe="/")}"\n' for k, _ in OBJECTS)
                         .encode())
    path = write_inventory(s3, tmp_path, "CSV", [data], "Bucket, Key")
    assert read(path, s3) == sorted((key, -1) for key, _ in OBJECTS)


def test_inventory_csv_malformed_lines_are_named_by_number(s3, tmp_path):
    good = inventory_csv(inventory_rows()[:2])
    bad = gzip.compress(gzip.decompress(good) + f'"{BUCKET}","photos/x.jpg"\n'.encode())
    path = write_inventory(s3, tmp_path, "CSV", [bad], CSV_SCHEMA)
    with pytest.raises(manifest.ManifestError, match=r"csv-0.csv.gz has 1 malformed line\(s\): line 3: 2 fields, "
                                                     r"expected 7"):
        read(path, s3)


def test_a_broken_inventory_manifest_is_a_clear_error(s3, tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"fileFormat": "CSV", "files": []}))
    with pytest.raises(manifest.ManifestError, match=r"is not an S3 Inventory manifest\.json .*KeyError.*"
                                                     "destinationBucket"):
        read(path, s3)
    path.write_text(json.dumps({"fileFormat": "Avro", "files": [], "destinationBucket": "arn:aws:s3:::x"}))
    with pytest.raises(manifest.ManifestError, match="fileFormat 'AVRO' is not CSV, ORC or Parquet"):
        read(path, s3)


# --- the command line


def test_cli_dry_run_reads_the_bucket_and_keys_from_a_manifest(moto_endpoint, logits_prefix, tmp_path, runner):
    from demo import make_demo

    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="manifest-cli")
    for suffix in ("-symbol.json", "-0000.params"):
        s3.upload_file(f"{logits_prefix}{suffix}", "manifest-cli", f"model/digits{suffix}")
    (_, _), (test_x, _) = make_demo.digits_split()
    for i in range(3):
        s3.put_object(Bucket="manifest-cli", Key=f"imgs/{i}.png", Body=make_demo.digit_png(test_x[i]))
    path = tmp_path / "keys.csv"
    path.write_text("".join(f"manifest-cli,imgs/{i}.png\n" for i in (2, 0, 1, 7)))  # imgs/7.png does not exist
    args = ["--endpoint-url", moto_endpoint, "--model", "s3://manifest-cli/model/digits", "--labels", "",
            "--input-shape", "3,32,32", "--std", "255", "--input-manifest", str(path), "--dry-run"]
    result = runner.invoke(infer_main.main, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["input"] == str(path)
    assert plan["images"] == 4 and plan["first_key"] == "imgs/0.png" and plan["last_key"] == "imgs/7.png"
    assert plan["sample"]["key"] == "imgs/0.png" and len(plan["sample"]["predictions"]) == 5


def test_cli_refuses_a_manifest_file_that_does_not_exist(tmp_path, runner):
    result = runner.invoke(infer_main.main, ["--input-manifest", str(tmp_path / "nope.txt"), "--model",
                                             "s3://m/r18", "--output", "s3://out/p.jsonl"])
    assert result.exit_code == 2
    assert "--input-manifest" in result.output and "no such file" in result.output


def test_cli_reports_a_multi_bucket_manifest_and_exits_1(s3, moto_endpoint, tmp_path, runner, logits_prefix):
    path = tmp_path / "two.txt"
    path.write_text("s3://b-one/a.jpg\ns3://b-two/b.jpg\n")
    # A model and an output bucket that exist: the checks made before reading the manifest pass.
    result = runner.invoke(infer_main.main, ["--endpoint-url", moto_endpoint, "--input-manifest", str(path),
                                             "--model", str(logits_prefix), "--output", f"s3://{BUCKET}/p.jsonl"])
    assert result.exit_code == 1
    assert "names keys in 2 buckets (b-one, b-two)" in result.output


# --- the fast reader (pyarrow) against the Python reader


TRICKY_CSV = [
    "bucket,key,size\nb,photos/a.jpg,1\nb,photos/b.jpg,2\n",  # a header
    'b,"photos/café,1.png",20\nb,"photos/say ""hi"".jpg",3\nb,photos/日本.jpg,\n',  # quotes, commas, non-ASCII
    'b,"photos/two\nlines.jpg",4\r\nb,photos/crlf.jpg,5\r\n\r\n\nb,photos/after-blank.jpg,6\n',  # line breaks
    "\ufeffbucket,key\nb,photos/bom.jpg\n",  # a byte-order mark before the header
    " b ,photos/ spaced .jpg, 7 \n , , \nb,photos/dup.jpg,1\nb,photos/dup.jpg,9\n",  # spaces, blank fields, a dup
    'b,photos/mid"quote.jpg,8\nb,"photos/quoted"tail.jpg,9\n',  # quotes where the csv module takes them literally
]
TRICKY_TEXT = [
    "s3://b/photos/a.jpg\n\n  \ns3://b/photos/日本.jpg\r\ns3://b/photos/a b+c,1.jpg\n",
    "photos/bare.jpg\nphotos/ spaced.jpg \n\ufeff",  # no final line break; a stray BOM that is not first
    "\ufeffs3://b/photos/bom.jpg\n",
]


def gathered(reader, *args):
    """``(buckets, keys, sizes)`` one of the manifest's readers gives, its keys as read (nothing spilled)."""
    sorter = manifest.KeySorter()
    buckets = reader(*args, sorter)
    return (buckets, *sorter.columns())


def python_reader(kind: str, path) -> list[tuple[str, int]]:
    """The keys the Python reader gives for a manifest (what the job read before the fast reader)."""
    buckets, keys, sizes = gathered(manifest_text._scan_csv if kind == "csv" else manifest_text._scan_text, str(path),
                                    str(path))
    listing = manifest.Listing.build("b", keys, sizes, suffixes=SUFFIXES)
    return sorted(buckets - {None}), list(listing)


@pytest.mark.parametrize(("kind", "text"), [("csv", t) for t in TRICKY_CSV] + [("txt", t) for t in TRICKY_TEXT])
def test_the_fast_reader_reads_what_the_python_reader_reads(tmp_path, kind, text):
    path = tmp_path / f"keys.{kind}"
    path.write_bytes(text.encode())
    buckets, keys, sizes = gathered(manifest_text._fast_csv if kind == "csv" else manifest_text._fast_text, str(path))
    fast = (sorted(buckets - {None}), list(manifest.Listing.build("b", keys, sizes, suffixes=SUFFIXES)))
    assert fast == python_reader(kind, path)
    assert fast[1], "every tricky manifest names images"


@pytest.mark.parametrize(("kind", "text", "doubt"), [
    # two and three fields in one manifest
    ("csv", "b,photos/a.jpg\nb,photos/b.jpg,12\n", "Expected 2 columns, got 3"),
    # a digit that is not ASCII (the Python reader refuses it)
    ("csv", "b,photos/a.jpg,1\nb,photos/b.jpg,²\n", "a size that is not a whole number"),
    # URIs urlparse cuts or changes
    ("txt", "s3://b/photos/a.jpg?v=1\nS3://b/photos/b.jpg\ns3://b//photos/c.jpg\n", "not plainly s3://BUCKET/KEY"),
    ("txt", "photos/a\rb.jpg\n", "a line break other than"),  # a carriage return inside a key
    ("txt", "photos/a\x1fb.jpg\n", "Expected 1 columns, got 2"),  # the fast reader's field separator inside a key
])
def test_what_the_fast_reader_doubts_is_read_by_the_python_reader(tmp_path, kind, text, doubt):
    path = tmp_path / f"keys.{kind}"
    path.write_bytes(text.encode())
    with pytest.raises(manifest_text._Doubt, match=re.escape(doubt)):
        gathered(manifest_text._fast_csv if kind == "csv" else manifest_text._fast_text, str(path))
    try:
        expected = python_reader(kind, path)[1]
    except manifest.ManifestError as exc:
        with pytest.raises(manifest.ManifestError, match=re.escape(str(exc))):
            read(path, bucket="b")
    else:
        assert read(path, bucket="b") == expected


#: Arrow's peak while a manifest is read and sorted: two copies of the keys' text, offsets and sizes
#: (the read columns, then the sorted ones), the sort's order (8 bytes a key), and one parser block.
ORDER_BYTES_PER_KEY = 8
BLOCK_BYTES = 16 << 20
#: The process's resident peak may add what the allocator keeps of freed blocks and the kernels'
#: scratch: measured 125 to 260 MiB at a million keys, depending on how the allocator's pages fall.
RESIDENT_SLACK_BYTES = 320 << 20

#: The peak is the kernel's VmHWM, which a new program starts afresh; ``ru_maxrss`` would not do: Linux
#: keeps it across exec, so the child would report the forking pytest process's own peak.
MEMORY_PROBE = """
import re, sys
import psutil
import pyarrow as pa
from mxjob.inputs import manifest
base = psutil.Process().memory_info().rss
images = manifest.read_manifest(sys.argv[1], suffixes=[".jpeg"])
with open("/proc/self/status") as status:
    peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)) * 1024
print(len(images), images.nbytes, pa.default_memory_pool().max_memory(), peak - base)
"""


def test_reading_a_million_key_csv_manifest_costs_two_copies_of_the_keys_at_most(tmp_path):
    """A fresh process reads an unsorted million-key manifest: Arrow's peak is two copies of the keys."""
    import subprocess
    import sys

    from tests.support.manifests import write_manifest

    path = tmp_path / "million.csv"
    write_manifest(path, 1_000_000)  # ImageNet-like keys, not in code point order: the sort runs
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path)], capture_output=True, text=True,
                           check=True, cwd=str(Path(__file__).resolve().parents[3]))
    keys, nbytes, arrow_peak, resident_peak = map(int, probe.stdout.split())
    assert keys == 1_000_000
    bound = 2 * nbytes + ORDER_BYTES_PER_KEY * keys + BLOCK_BYTES
    assert arrow_peak <= bound, f"Arrow peak {arrow_peak / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB"
    assert resident_peak <= bound + RESIDENT_SLACK_BYTES, f"resident peak {resident_peak / 2**20:.0f} MiB"
