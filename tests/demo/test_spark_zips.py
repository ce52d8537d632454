"""demo.spark_zips: PySpark's and Py4J's zips with this Python's bytecode beside their sources, on copies."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from demo import spark_zips


@pytest.fixture
def home(tmp_path):
    """A SPARK_HOME holding copies of the installed PySpark's two zips, as pip installed them (no bytecode)."""
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    for path in spark_zips.spark_zips(spark_zips.spark_home()):
        with zipfile.ZipFile(path) as old, zipfile.ZipFile(lib / path.name, "w", zipfile.ZIP_DEFLATED) as new:
            for info in old.infolist():
                if not info.filename.endswith(".pyc"):
                    new.writestr(info, old.read(info))
    return tmp_path


def imported_from(zips, modules: str) -> list[str]:
    """Where a fresh Python with only ``zips`` in front of its path finds each of ``modules``."""
    code = f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules.split()!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(map(str, zips))})
    return result.stdout.split()


def test_the_two_zips_are_compiled_and_pyspark_then_imports_from_their_bytecode(home):
    zips = spark_zips.spark_zips(home)
    assert len(zips) == 2 and zips[0].name.startswith("py4j-") and zips[1].name == "pyspark.zip"
    before = {p: zipfile.ZipFile(p).namelist() for p in zips}
    assert not any(map(spark_zips.is_compiled, zips))
    assert all(f.endswith(".py") for f in imported_from(zips, "pyspark.daemon pyspark.worker py4j.java_gateway"))
    assert spark_zips.main(["compile", "--home", str(home)]) == 0
    assert all(map(spark_zips.is_compiled, zips))
    for path, names in before.items():  # every member kept, a .pyc beside each source
        after = zipfile.ZipFile(path).namelist()
        assert set(names) <= set(after) and {n + "c" for n in names if n.endswith(".py")} <= set(after)
    files = imported_from(zips, "pyspark.daemon pyspark.worker py4j.java_gateway")
    assert all(f.endswith(".pyc") and f.startswith(str(home)) for f in files)


def test_if_stale_leaves_a_compiled_zip_alone_and_recompiles_another_pythons_bytecode(home):
    zips = spark_zips.spark_zips(home)
    spark_zips.main(["compile", "--home", str(home)])
    stamps = [p.stat().st_mtime_ns for p in zips]
    spark_zips.main(["compile", "--if-stale", "--home", str(home)])
    assert [p.stat().st_mtime_ns for p in zips] == stamps
    pyspark_zip = zips[1]  # one module's bytecode from another Python (another magic number): stale
    other = home / "other.zip"
    with zipfile.ZipFile(pyspark_zip) as old, zipfile.ZipFile(other, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            new.writestr(info, b"\x00\x00\r\n" + data[4:] if info.filename == "pyspark/__init__.pyc" else data)
    shutil.move(other, pyspark_zip)
    assert not spark_zips.is_compiled(pyspark_zip)
    spark_zips.main(["compile", "--if-stale", "--home", str(home)])
    assert spark_zips.is_compiled(pyspark_zip) and zips[0].stat().st_mtime_ns == stamps[0]


def test_show_names_each_zip_and_what_makes_it(home, capsys):
    spark_zips.main(["show", "--home", str(home)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.endswith("sources only (made by: make spark-zips)") for line in lines)


def test_a_source_this_python_cannot_compile_keeps_its_source_and_the_zip_counts_as_compiled(tmp_path):
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/__init__.py", "VALUE = 1\n")
        archive.writestr("pyspark/future.py", "def f(:\n")  # not Python this version can compile
        archive.writestr("pyspark/data.txt", "kept\n")
    assert spark_zips.compile_zip(lib / "pyspark.zip") == 1
    names = zipfile.ZipFile(lib / "pyspark.zip").namelist()
    assert sorted(names) == ["pyspark/__init__.py", "pyspark/__init__.pyc", "pyspark/data.txt", "pyspark/future.py"]
    assert spark_zips.is_compiled(lib / "pyspark.zip")  # so --if-stale leaves it alone from now on
    stamp = (lib / "pyspark.zip").stat().st_mtime_ns
    spark_zips.main(["compile", "--if-stale", "--home", str(tmp_path)])
    assert (lib / "pyspark.zip").stat().st_mtime_ns == stamp
