"""extsort: manifests sorted out of core give the keys, plan bytes and dry-run plan of the in-memory sort."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import infer_main
from mxjob.inputs import batch_list, extsort, listing, manifest
from tests.support.helpers import make_s3_client

SUFFIXES = (".jpg", "PNG")
#: A few hundred bytes: every manifest below is spilled in many runs.
TINY = 2_000


def tricky_manifest(path: Path, count: int = 3_000, seed: int = 5) -> Path:
    """A CSV manifest: unsorted, keys repeated far apart (other runs) with other sizes, unicode, other suffixes,
    keys outside the prefix, sizes missing."""
    rng = random.Random(seed)
    names = ["a", "B", "é", "日本", "😀", "z z", "\u00ff", "~"]
    rows = []
    for _ in range(count):
        key = f"p/{rng.choice(names)}/{rng.randint(0, count // 3)}.{rng.choice(['jpg', 'JPG', 'png', 'txt'])}"
        rows.append((rng.choice(["p/", "q/", "p"]) + key[2:], rng.choice([None, rng.randint(0, 999)])))
    rows += rows[:50]  # the same keys again at the end: in the last run
    path.write_text("".join(f'b,"{key}",{"" if size is None else size}\n' for key, size in rows), encoding="utf-8")
    return path


def plan_of(keys, batch_size: int) -> tuple[list, bytes]:
    pieces: list[bytes] = []
    spans = batch_list.write_batches(keys, batch_size, pieces.append)
    return spans, b"".join(pieces)


@pytest.mark.parametrize("limit", [None, 1, 300])
@pytest.mark.parametrize("in_memory", [True, False])
def test_out_of_core_keys_and_plan_equal_the_in_memory_sorts(tmp_path, limit, in_memory):
    path = str(tricky_manifest(tmp_path / "keys.csv"))
    options = {"prefix": "p/", "suffixes": SUFFIXES, "limit": limit}
    held = manifest.read_manifest(path, **options)
    spilled = manifest.read_manifest(path, spill=extsort.Spill(TINY, str(tmp_path), in_memory=in_memory), **options)
    assert isinstance(held, listing.Listing)
    assert isinstance(spilled, listing.Listing if in_memory else extsort.SpilledListing)
    assert list(spilled) == list(held) and len(spilled) == len(held) == (limit or len(held))
    assert spilled[0] == held[0] and spilled[-1] == held[-1]
    for batch_size in (1, 64, 1_000_000):
        assert plan_of(spilled, batch_size) == plan_of(held, batch_size)
    # What the filter dropped is counted alike, whichever way the keys were sorted: never silently.
    assert spilled.manifest["skipped"] == held.manifest["skipped"]
    assert set(held.manifest["skipped"]) == {"outside_input", "not_image"}
    if limit is None:
        assert spilled.manifest["duplicates"] == held.manifest["duplicates"] > 0


def test_runs_that_overlap_merge_to_one_row_per_key_with_the_larger_size(tmp_path):
    sorter = extsort.KeySorter(spill_bytes=1, directory=str(tmp_path))  # every chunk is a run
    chunks = [(["k/b", "k/a", "k/c"], [1, 5, None]), (["k/a", "k/d", "k/b"], [7, 2, 3]), (["k/b", "k/0"], [None, 4])]
    for keys, sizes in chunks:
        sorter.add(pa.array(keys, listing.KEY_TYPE), pa.array(sizes, pa.int64()))
    assert sorter.spilled
    merged = pa.concat_tables(list(sorter.merge()))
    assert merged.to_pylist() == [{"key": "k/0", "size": 4}, {"key": "k/a", "size": 7}, {"key": "k/b", "size": 3},
                                  {"key": "k/c", "size": -1}, {"key": "k/d", "size": 2}]
    sorter.close()
    assert os.listdir(tmp_path) == []  # the runs and their folder are gone


def test_a_spilled_listing_reads_rows_across_its_batches_and_removes_its_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(extsort, "SPILLED_ROWS", 10)
    keys = [f"k/{i:04d}.jpg" for i in range(95)]
    sorter = extsort.KeySorter(spill_bytes=TINY, directory=str(tmp_path))
    for start in range(0, 95, 20):
        chunk = keys[start:start + 20][::-1]  # each chunk backwards: every run is sorted
        sorter.add(pa.array(chunk, listing.KEY_TYPE), pa.array(range(len(chunk)), pa.int64()))
    spilled = sorter.spilled_listing("bkt")
    assert len(spilled) == 95 and spilled.bucket == "bkt" and spilled.num_batches(64) == 2
    assert [key for key, _ in spilled] == keys
    assert spilled[37][0] == keys[37] and spilled[-1][0] == keys[-1]
    assert [key for key, _ in spilled[8:23]] == keys[8:23] and [k for k, _ in spilled[64:128]] == keys[64:]
    assert [k for k, _ in spilled.load()] == keys
    with pytest.raises(IndexError, match="index 95 out of range for 95 keys"):
        spilled[95]
    spilled.close()
    assert os.listdir(tmp_path) == []


def test_a_manifest_the_fast_reader_doubts_is_read_again_from_its_start(tmp_path):
    path = tmp_path / "keys.csv"
    rows = [f"b,p/{i:05d}.jpg,{i}\n" for i in range(2_000)]
    # A bad size at the end, after runs were spilled: the Python reader reads again and names it.
    path.write_text("".join(rows) + "b,p/late.jpg,12kB\nb,p/x.jpg,1\n")
    with pytest.raises(manifest.ManifestError, match=r"1 malformed line\(s\): line 2001: size '12kB'"):
        manifest.read_manifest(str(path), spill=extsort.Spill(TINY, str(tmp_path)))
    path.write_text("".join(rows) + 'b,"p/quoted"tail.jpg,5\n')  # the fast reader doubts; the Python one reads it
    spilled = manifest.read_manifest(str(path), spill=extsort.Spill(TINY, str(tmp_path), in_memory=False))
    assert len(spilled) == 2_001 and list(spilled) == list(manifest.read_manifest(str(path)))


def test_the_dry_run_plan_is_the_same_sorted_out_of_core(moto_endpoint, logits_prefix, tmp_path, runner, monkeypatch):
    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="extsort-cli")
    for suffix in ("-symbol.json", "-0000.params"):
        s3.upload_file(f"{logits_prefix}{suffix}", "extsort-cli", f"model/digits{suffix}")
    path = tmp_path / "keys.csv"
    path.write_text("".join(f"extsort-cli,imgs/{i % 700}.png\n" for i in range(2_100, 0, -1)))
    args = ["--endpoint-url", moto_endpoint, "--model", "s3://extsort-cli/model/digits", "--labels", "",
            "--input-shape", "3,32,32", "--input-manifest", str(path), "--batch-size", "16", "--limit", "500",
            "--estimate-images", "0", "--dry-run"]
    held = runner.invoke(infer_main.main, args)
    assert held.exit_code == 0, held.output
    monkeypatch.setattr(extsort, "SPILL_BYTES", TINY)
    monkeypatch.setenv(extsort.SPILL_DIR_ENV, str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    spilled = runner.invoke(infer_main.main, args)
    assert spilled.exit_code == 0, spilled.output
    plan, out_of_core = json.loads(held.stdout.splitlines()[-1]), json.loads(spilled.stdout.splitlines()[-1])
    plan.pop("sample_seconds"), out_of_core.pop("sample_seconds")
    assert out_of_core == plan and plan["images"] == 500 and plan["batches"] == 32
    assert os.listdir(tmp_path / "spill") == []  # nothing left behind


#: Arrow's peak while a million-key manifest is sorted out of core with runs of 4 MiB: pyarrow's CSV
#: reader's read-ahead (about 36 MiB measured, whatever the file's size), a run being gathered and
#: sorted (about 2.2 runs) and the merge's windows. The in-memory sort holds the keys twice.
PEAK_BOUND = 56 << 20
MEMORY_PROBE = """
import sys
import pyarrow as pa
from mxjob.inputs import extsort, manifest
images = manifest.read_manifest(sys.argv[1], suffixes=[".jpeg"], spill=extsort.Spill(4 << 20, in_memory=False))
peak = pa.default_memory_pool().max_memory()
print(len(images), peak, images.load().nbytes)
"""


def test_sorting_a_million_keys_out_of_core_holds_a_run_not_two_copies_of_the_keys(tmp_path):
    from tests.support.manifests import write_manifest

    path = tmp_path / "million.csv"
    write_manifest(path, 1_000_000)
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path)], capture_output=True, text=True,
                           check=True, cwd=str(Path(__file__).resolve().parents[3]))
    # The keys are held in the probe, not here: a large test process would raise a forked child's peak.
    keys, arrow_peak, held = map(int, probe.stdout.split())  # held: about 50 MiB
    assert keys == 1_000_000
    assert arrow_peak <= PEAK_BOUND < 2 * held, f"Arrow peak {arrow_peak / 2**20:.0f} MiB, keys {held / 2**20:.0f} MiB"
