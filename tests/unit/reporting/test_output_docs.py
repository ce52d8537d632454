"""Reading the output: the Athena table of each task's Parquet (mxjob.results.athena_table.athena_ddl), the generated
parts of docs/output.md and docs/configuration.md (mxjob/reporting/output_docs.py: Parquet columns, the records'
fields), and the reading code blocks of docs/output.md, run as they are written (docs/library.md's:
tests/demo/test_examples.py).

No Athena here: each statement is checked against the Parquet file pyarrow writes through the job's own Parquet view
(parquet_view.parquet_schema and parquet_batch), leaf column by leaf column, not by running it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mxjob import tasks
from mxjob.reporting import output_docs, record_fields
from mxjob.results import athena_table, parquet_view, part_format, results
from mxjob.tasks import classify, detect, embed
from tests.support.helpers import CLASSES, parquet_of

ROOT = Path(__file__).resolve().parents[3]
ERROR = "struct<stage:string,type:string,message:string>"
#: The Athena type of each column, written out from Athena's type names (int, float, array<...>, struct<...>).
ATHENA = {
    "classify": {"key": "string", "predictions": "array<struct<class_id:int,label:string,probability:float>>",
                 "error": ERROR},
    "embed": {"key": "string", "embedding": "array<float>", "error": ERROR},
    "detect": {"key": "string", "image_size": "array<int>",
               "detections": "array<struct<class_id:int,label:string,score:float,box:array<float>>>", "error": ERROR},
}
#: Parquet's physical (and logical) leaf types as Athena's.
PARQUET_TO_ATHENA = {("INT32", "NONE"): "int", ("INT64", "NONE"): "bigint", ("FLOAT", "NONE"): "float",
                     ("DOUBLE", "NONE"): "double", ("BYTE_ARRAY", "STRING"): "string", ("BOOLEAN", "NONE"): "boolean"}
FAILED = {"stage": "decode", "type": "UnidentifiedImageError", "message": "cannot identify image file"}


# ----------------------------------------------------------------------------
# Each task's rows, written as the job writes Parquet


def task_rows(kind: str, dimension: int = 4) -> results.Results:
    """A batch of ``kind`` with three scored images and one that failed."""
    task = tasks.get(kind)
    made = task.results(task.schema(dimension=dimension) if kind == "embed" else task.schema())
    rng = np.random.RandomState(5)
    for i, key in enumerate(["photos/cat.jpg", "photos/dog.jpg", "photos/owl.jpg"]):
        if kind == "classify":
            made.add(key, classify.prediction_entries([(i, CLASSES[i % 2], 0.75), (i + 1, None, 0.25)]))
        elif kind == "embed":
            vector = rng.randn(dimension).astype(np.float32)
            made.add(key, vector / np.linalg.norm(vector))
        else:
            boxes = [(c, CLASSES[c], 0.9 - c / 10, [1.0 + c, 2.0, 30.5, 40.0]) for c in range(i)]
            made.add(key, ([64, 48], detect.detection_entries(boxes)))
    made.fail("photos/broken.jpg", FAILED)
    return made


def write_parquet(path: Path, batch: pa.RecordBatch) -> None:
    """``batch`` as the job's Parquet output: its Parquet view, zstd, the task in the key-value metadata."""
    schema = parquet_of(batch.schema, {"mxinfer.task": results.kind_of(batch.schema)})
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        writer.write_batch(parquet_view.parquet_batch(batch, schema))


def ddl_columns(ddl: str) -> list[tuple[str, str]]:
    """``(name, type)`` of each column a CREATE EXTERNAL TABLE names, in order, backticks taken off."""
    body = ddl[ddl.index("(\n") + 2: ddl.index("\n)\n")]
    columns = [re.fullmatch(r"  (`[^`]+`|\S+) (.+?),?", line).groups() for line in body.splitlines()]
    return [(name.strip("`"), type_) for name, type_ in columns]


def hive_leaves(type_: str, path: str) -> list[tuple[str, str]]:
    """The scalar leaves of an Athena type as ``(dotted path, type)``, arrays looked through."""
    if type_.startswith("array<"):
        return hive_leaves(type_[len("array<"):-1], path)
    if not type_.startswith("struct<"):
        return [(path, type_)]
    members, depth, start, inner = [], 0, 0, type_[len("struct<"):-1]
    for i, char in enumerate(inner + ","):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            members.append(inner[start:i])
            start = i + 1
    leaves = []
    for member in members:
        name, member_type = member.split(":", 1)
        leaves += hive_leaves(member_type, f"{path}.{name.strip('`')}")
    return leaves


def parquet_leaves(path: Path) -> list[tuple[str, str]]:
    """The file's leaf columns as ``(dotted path, Athena type)``: Parquet's list levels dropped, types mapped."""
    schema = pq.ParquetFile(str(path)).schema
    leaves = []
    for i in range(len(schema)):
        column = schema.column(i)
        dotted = ".".join(part for part in column.path.split(".") if part not in ("list", "element"))
        leaves.append((dotted, PARQUET_TO_ATHENA[(column.physical_type, column.logical_type.type)]))
    return leaves


# ----------------------------------------------------------------------------
# athena_ddl


@pytest.mark.parametrize("kind", ["classify", "embed", "detect"])
def test_each_tasks_table_names_every_column_with_its_athena_type(kind):
    schema = parquet_of(task_rows(kind).record_batch().schema)
    ddl = athena_table.athena_ddl(schema, f"photo_{kind}", f"s3://my-bucket/{kind}/")
    assert ddl.startswith(f"CREATE EXTERNAL TABLE photo_{kind} (\n")
    assert ddl.endswith(f"\n)\nSTORED AS PARQUET\nLOCATION 's3://my-bucket/{kind}/';")
    assert ddl_columns(ddl) == list(ATHENA[kind].items())
    assert "TBLPROPERTIES" not in ddl  # reading needs no compression property


@pytest.mark.parametrize("kind", ["classify", "embed", "detect"])
def test_the_parquet_file_the_job_writes_has_exactly_the_tables_columns_and_types(tmp_path, kind):
    batch = task_rows(kind).record_batch()
    write_parquet(tmp_path / "part-00000.parquet", batch)
    schema = pq.read_schema(tmp_path / "part-00000.parquet")
    ddl = athena_table.athena_ddl(schema, "t", "s3://b/t/")  # from the schema the file holds, as a user would
    assert [name for name, _ in ddl_columns(ddl)] == pq.ParquetFile(str(tmp_path / "part-00000.parquet")) \
        .schema_arrow.names == ["key", *[n for n in ATHENA[kind] if n not in ("key", "error")], "error"]
    declared = [leaf for name, type_ in ddl_columns(ddl) for leaf in hive_leaves(type_, name)]
    assert declared == parquet_leaves(tmp_path / "part-00000.parquet")
    # and pyarrow reads every row back as written, the failed image's nulls (vector, image_size) included
    view = pa.Table.from_batches([parquet_view.parquet_batch(batch, parquet_of(batch.schema))])
    assert pq.read_table(tmp_path / "part-00000.parquet").to_pylist() == view.to_pylist()
    assert view.column(1).null_count == 1


def test_carried_columns_and_object_metadata_follow_with_their_types(tmp_path):
    batch = task_rows("classify").record_batch()
    carried = pa.table({"product_id": ["p-1", "p-2", None, "p-4"], "Shop Name": ["n", "s", "e", "w"],
                        "select": ["a", "b", "c", "d"], "etag": ["e1", "e2", "e3", "e4"],
                        "size": pa.array([10, 20, None, 40], pa.int64())})
    write_parquet(tmp_path / "p.parquet", part_format.carry(batch, carried))
    ddl = athena_table.athena_ddl(pq.read_schema(tmp_path / "p.parquet"), "mydb.photo_classes", "s3://b/c/")
    assert ddl.startswith("CREATE EXTERNAL TABLE mydb.photo_classes (\n")
    assert ddl_columns(ddl)[3:] == [("product_id", "string"), ("Shop Name", "string"), ("select", "string"),
                                    ("etag", "string"), ("size", "bigint")]
    # a name that is not letters, digits and _, or that is a DDL keyword, is in backticks; the others are not
    assert "  `Shop Name` string,\n  `select` string,\n  etag string,\n" in ddl and "  product_id string,\n" in ddl
    declared = [leaf for name, type_ in ddl_columns(ddl) for leaf in hive_leaves(type_, name)]
    assert declared == parquet_leaves(tmp_path / "p.parquet")


@pytest.mark.parametrize(("schema", "location", "match"), [
    (parquet_of(embed.TASK.schema(dimension=8, dtype="float16")), "s3://b/e/",
     r"column embedding: float16 is written as Parquet's FLOAT16 logical type, which Athena"),
    (pa.schema([("key", pa.string()), ("taken", pa.timestamp("ms"))]), "s3://b/e/",
     r"column taken: Arrow type timestamp\[ms\] has no Athena type"),
    (pa.schema([("meta", pa.struct([("tags", pa.list_(pa.dictionary(pa.int8(), pa.string())))]))]), "s3://b/e/",
     r"column meta\.tags: Arrow type dictionary"),
    (pa.schema([("key", pa.string()), ("Key", pa.string())]), "s3://b/e/", r"columns key and Key: .* clash"),
    (pa.schema([("a`b", pa.string())]), "s3://b/e/", r"'a`b' cannot be an Athena name"),
    (pa.schema([("key", pa.string())]), "s3://b/e/part-00000.parquet", r"LOCATION must be an S3 folder"),
    (pa.schema([("key", pa.string())]), "s3://b/e", r"trailing slash: 's3://b/e'"),
    (pa.schema([("key", pa.string())]), "/local/e/", r"LOCATION must be an S3 folder"),
])
def test_a_schema_athena_cannot_read_is_refused_naming_the_column(schema, location, match):
    with pytest.raises(ValueError, match=match):
        athena_table.athena_ddl(schema, "t", location)


def test_float16_is_what_the_parquet_file_holds(tmp_path):
    """The refusal's ground: pyarrow writes a float16 vector as FLOAT16 (a 2-byte fixed-length byte array)."""
    rows = embed.TASK.results(embed.TASK.schema(dimension=3, dtype="float16"))
    rows.add("a", np.array([0.5, 1.0, -2.0], np.float32))
    write_parquet(tmp_path / "h.parquet", rows.record_batch())
    leaf = pq.ParquetFile(str(tmp_path / "h.parquet")).schema.column(1)
    assert (leaf.physical_type, leaf.length, str(leaf.logical_type)) == ("FIXED_LEN_BYTE_ARRAY", 2, "Float16")
    assert pq.read_table(tmp_path / "h.parquet").column("embedding").to_pylist() == [[0.5, 1.0, -2.0]]


# ----------------------------------------------------------------------------
# docs/output.md: the generated parts, and the reading blocks run as written


def test_docs_output_page_parts_are_generated_from_the_result_model():
    page = (ROOT / output_docs.PAGE).read_text(encoding="utf-8")
    assert output_docs.render(page) == page, \
        "docs/output.md's generated parts differ from mxjob.results.results: `make docs`"


def test_a_stale_part_is_found_and_made_anew_and_missing_markers_are_refused():
    page = (ROOT / output_docs.PAGE).read_text(encoding="utf-8")
    stale = page.replace("  embedding array<float>,\n", "  embedding array<double>,\n", 1)
    assert stale != page and output_docs.render(stale) == page
    cut = re.sub(r"<!-- generated: detect .*?<!-- end generated: detect -->", "", page, flags=re.S)
    with pytest.raises(ValueError, match="lacks the markers of the generated part 'detect'"):
        output_docs.render(cut)


def test_the_records_field_tables_are_generated_from_their_declarations():
    for where in (output_docs.PAGE, output_docs.CONFIG_PAGE):
        page = (ROOT / where).read_text(encoding="utf-8")
        assert output_docs.render(page, where) == page, \
            f"{where}'s field tables differ from mxjob.reporting.records: `make docs`"
        for name, record in output_docs.RECORD_PARTS[where]:
            part = page[page.index(f"<!-- generated: {name} "):page.index(f"<!-- end generated: {name}")]
            for field, type_, _, _ in record_fields.field_rows(record):
                assert f"| `{field}` | {type_} |" in part, (name, field)
    page = (ROOT / output_docs.CONFIG_PAGE).read_text(encoding="utf-8")
    stale = page.replace("| `plan_bytes` | integer |", "| `plan_bytes` | number |", 1)
    assert stale != page and output_docs.render(stale, output_docs.CONFIG_PAGE) == page
    cut = re.sub(r"<!-- generated: plan-fields .*?<!-- end generated: plan-fields -->", "", page, flags=re.S)
    with pytest.raises(ValueError, match=r"configuration\.md lacks the markers of the generated part 'plan-fields'"):
        output_docs.render(cut, output_docs.CONFIG_PAGE)


def test_each_generated_part_shows_every_column_of_its_schema_and_the_tables_statement():
    page = (ROOT / output_docs.PAGE).read_text(encoding="utf-8")
    for example in output_docs.examples():
        part = page[page.index(f"<!-- generated: {example.name} "):page.index(f"<!-- end generated: {example.name}")]
        for field in example.schema:
            assert f"| `{field.name}` | `" in part, (example.name, field.name)
        if example.name == "embed-float16":
            assert "No Athena table: column embedding: float16" in part and "CREATE" not in part
        else:
            assert athena_table.athena_ddl(example.schema, example.table, example.location) in part


def code_blocks(page: Path, marker: str) -> list[str]:
    """The code of each fenced block that follows a line holding ``marker``."""
    pattern = re.compile(r"<!--[^\n]*" + re.escape(marker) + r"[^\n]*-->\n```python\n(.*?)\n```", re.S)
    return pattern.findall(page.read_text(encoding="utf-8"))


@pytest.fixture
def dataset(tmp_path) -> tuple[Path, dict]:
    """Three output folders as the job leaves them: two part files each, and its own files under ``_`` names."""
    made = {}
    for kind, folder in (("classify", "classes"), ("embed", "embeddings"), ("detect", "boxes")):
        batch = task_rows(kind).record_batch()
        (tmp_path / folder / "_parts").mkdir(parents=True)
        write_parquet(tmp_path / folder / "part-00000.parquet", batch.slice(0, 2))
        write_parquet(tmp_path / folder / "part-00001.parquet", batch.slice(2))
        (tmp_path / folder / "_SUCCESS").write_bytes(b"")
        (tmp_path / folder / "_summary.json").write_text(json.dumps({"keys_listed": 4}))
        (tmp_path / folder / "_parts" / "00000.arrow.zst").write_bytes(b"not parquet")  # read it and fail
        made[folder] = batch
    return tmp_path, made


def test_the_pages_pyarrow_blocks_read_a_dataset_folder_as_written(dataset):
    root, made = dataset
    blocks = code_blocks(ROOT / output_docs.PAGE, "runs this block against a local folder")
    assert len(blocks) == 3
    for code in blocks:
        folder = re.search(r's3://my-bucket/(\w+)/', code).group(1)
        namespace: dict = {}
        exec(compile(code.replace("s3://my-bucket/", f"{root}/"), f"docs/output.md ({folder})", "exec"), namespace)
        batch = made[folder]
        scored = [i for i, e in enumerate(batch.column("error").to_pylist()) if e is None]
        if folder == "classes":
            assert namespace["scored"].column("key").to_pylist() == [batch.column("key")[i].as_py() for i in scored]
            assert namespace["failed"].column("key").to_pylist() == ["photos/broken.jpg"]
            assert [p["label"] for p in namespace["top1"].to_pylist()] == \
                [batch.column("predictions")[i].as_py()[0]["label"] for i in scored]
        elif folder == "embeddings":
            want = np.array([batch.column("embedding")[i].as_py() for i in scored], np.float32)
            np.testing.assert_array_equal(namespace["matrix"], want)
            assert namespace["nearest"][0] == "photos/cat.jpg"  # itself, at cosine 1
        else:
            per_image = {row["key"]: row["detections"] or [] for row in batch.to_pylist()}
            assert namespace["boxes"].column("key").to_pylist() == [k for k, d in per_image.items() for _ in d]
            assert namespace["boxes"].column("box").to_pylist() == \
                [pytest.approx(x["box"]) for d in per_image.values() for x in d]


def test_the_pages_ddl_block_prints_the_statement_of_a_part_file(dataset, monkeypatch, capsys):
    root, made = dataset
    [code] = code_blocks(ROOT / output_docs.PAGE, "runs this block in a folder of the job's Parquet")
    monkeypatch.chdir(root / "classes")
    exec(compile(code, "docs/output.md (athena_ddl)", "exec"), {})
    schema = parquet_of(made["classes"].schema)
    assert capsys.readouterr().out == athena_table.athena_ddl(schema, "photo_classes", "s3://my-bucket/classes/") + "\n"

