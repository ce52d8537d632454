"""Per-process state: the one cache type (keyed, locked, least recently used out) and the zip that ships it."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import zipfile

import pytest

from deploy.package import build_zip, zip_members
from mxjob.core import state
from mxjob.model import device
from tests.support.helpers import ROOT


def test_the_least_recently_used_entry_is_evicted_and_on_evict_sees_it():
    evicted = []
    cache = state.ProcessCache("t", 2, on_evict=evicted.append)
    cache.get("a", lambda: "A")
    cache.get("b", lambda: "B")
    assert cache.get("a", lambda: "not made: a hit") == "A"  # a is now the most recent
    cache.get("c", lambda: "C")
    assert evicted == ["B"] and "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2


def test_a_failing_make_keeps_nothing_and_the_next_call_makes_again():
    cache = state.ProcessCache("t", 2)

    def broken():
        raise OSError("weights unreachable")

    with pytest.raises(OSError, match="weights unreachable"):
        cache.get("m", broken)
    assert "m" not in cache and cache.get("m", lambda: 7) == 7


def test_threads_asking_for_one_key_at_once_make_it_once():
    cache = state.ProcessCache("t", 2)
    made, start = [], threading.Barrier(8)

    def make():
        made.append(1)
        return object()

    results = []

    def ask():
        start.wait()
        results.append(cache.get("model", make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(r) for r in results}) == 1


def test_capacity_below_one_is_refused():
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        state.ProcessCache("models", 0)


def test_a_listener_hears_its_key_only_until_forgotten_and_the_oldest_goes_past_capacity():
    heard: list = []
    listeners = state.Listeners("t", 2)
    assert listeners.notify("a", 1) is False  # nobody listens yet: nothing happens
    listeners.listen("a", heard.append)
    listeners.listen("b", lambda *args: heard.append(("b", *args)))
    assert listeners.notify("a", 1) and listeners.notify("b", 2) and heard == [1, ("b", 2)]
    listeners.forget("a", print)  # another listener's forget leaves it
    assert "a" in listeners
    listeners.forget("a", heard.append)  # a bound method equal to, not the same object as, the one given
    assert "a" not in listeners and not listeners.notify("a", 3)
    listeners.listen("c", heard.append)
    listeners.listen("d", heard.append)
    assert "b" not in listeners and "c" in listeners and "d" in listeners
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        state.Listeners("t", 0)


def test_clear_forgets_models_and_handlers():
    state.models.get("k", lambda: 1)
    state.handlers.get("h", lambda: 2)
    state.clear()
    assert "k" not in state.models and "h" not in state.handlers


@pytest.mark.parametrize(("name", "parsed"), [("cpu", ("cpu", None)), ("gpu", ("gpu", None)), ("gpu:3", ("gpu", 3))])
def test_one_context_grammar(name, parsed):
    assert device.parse_context(name) == parsed


@pytest.mark.parametrize("name", ["cpu:0", "gpu:", "gpu:x", "tpu", "GPU", ""])
def test_a_malformed_context_is_refused_by_every_caller(name):
    with pytest.raises(ValueError, match="context must be cpu, gpu or gpu:N"):
        device.parse_context(name)
    with pytest.raises(ValueError, match="context must be cpu, gpu or gpu:N"):
        device.choose_context(name, None, 0, 1)
    with pytest.raises(ValueError, match="context must be cpu, gpu or gpu:N"):
        device.mx_context(name)


def test_the_py_files_zip_holds_every_module_and_imports_from_itself_alone(tmp_path):
    archive = build_zip(tmp_path / "job.zip")
    names = zipfile.ZipFile(archive).namelist()
    package = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "mxjob").rglob("*.py"))
    sources = ["mxinfer.py", "utils.py", *package]
    assert names == [name for source in sources for name in (source, source + "c")]  # each .py, then its .pyc
    assert [m.as_posix() for m in zip_members()] == sources
    assert build_zip(tmp_path / "again.zip").read_bytes() == archive.read_bytes()  # same sources, same bytes
    # From an empty folder, with only the zip on the path: every module imports, from its compiled code.
    modules = ["mxinfer", "utils", *[n[:-3].replace("/", ".").removesuffix(".__init__") for n in package]]
    code = f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(archive)}, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    files = result.stdout.split()
    assert len(files) == len(modules) and all(f.startswith(str(archive)) and f.endswith(".pyc") for f in files)


def test_a_compiled_module_in_the_py_files_zip_is_used_only_with_its_own_source(tmp_path):
    # A .pyc beside a different source (a zip mended by hand) is not used: the source is what runs.
    archive = build_zip(tmp_path / "job.zip")
    mended = tmp_path / "mended.zip"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(mended, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename == "utils.py":
                data += b"\nMENDED = 'by hand'\n"
            new.writestr(info, data)
    code = "import utils; print(utils.__file__, getattr(utils, 'MENDED', None), sep='|')"
    for path, loaded in ((archive, ["utils.pyc", "None"]), (mended, ["utils.py", "by hand"])):
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path)}, check=True)
        file, value = result.stdout.split("|")
        assert [file.rsplit("/", 1)[-1], value.strip()] == loaded


def test_outside_yarn_a_driver_that_started_no_spark_starts_none_at_exit(monkeypatch):
    # Only YARN's ApplicationMaster needs a SparkContext from every driver; a test or a laptop run does not.
    from mxjob.run import cluster

    monkeypatch.delenv("CONTAINER_ID", raising=False)
    monkeypatch.setattr(state.counters, "spark_contexts", 0)
    started = []
    monkeypatch.setattr("pyspark.SparkContext.getOrCreate", lambda *a: started.append(a))
    cluster.satisfy_application_master()
    monkeypatch.setenv("CONTAINER_ID", "container_1795664432297_0003_01_000001")
    monkeypatch.setattr(state.counters, "spark_contexts", 1)  # it ran its Spark job
    cluster.satisfy_application_master()
    assert started == []


def test_another_python_version_ignores_the_zips_compiled_modules_and_imports_the_sources(tmp_path):
    # EMR 7 runs Python 3.9: a zip built by another version still imports there, from its sources.
    other = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    if not other or sys.version_info[:2] == (3, 9):
        pytest.skip("needs a Python 3.9 beside a Python of another version")
    archive = build_zip(tmp_path / "job.zip")
    code = "import sys, mxjob.core.errors; print(sys.version_info[:2] == (3, 9), mxjob.core.errors.__file__)"
    result = subprocess.run([other[-1], "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(archive)}, check=True)
    assert result.stdout.split() == ["True", f"{archive}/mxjob/core/errors.py"]
