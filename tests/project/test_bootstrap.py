"""The EMR bootstrap action, bootstrap/install-deps.sh.

The quick tests drive the script with a stand-in interpreter whose ``pip
install`` only records what it was asked to do. One module-scoped fixture runs
the packaged script for real, once, into a fresh virtual environment (on
Python 3.9, EMR 7's python3, when this machine has it), downloading the pins
from PyPI; the tests that use it check the result.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from demo import examples
from demo.run_local import spark_env, spark_submit_command
from tests.support.helpers import bucket_with_digits, digits_classifier
from tests.support.library_page import CHECKER, LOCAL, OPTIONS, printed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bootstrap" / "install-deps.sh"
REQUIREMENTS = ROOT / "requirements.txt"
VENV_BIN = Path(sys.executable).parent


def pins(requirements: Path) -> dict[str, str]:
    """``{"mxnet": "1.9.1", ...}`` from a requirements file of ``name==version`` lines."""
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[name.lower()] = version
    return out


def run_script(*args: str, env: dict[str, str], script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_shellcheck_clean():
    result = subprocess.run(
        [str(VENV_BIN / "shellcheck"), "--severity=style", str(SCRIPT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


@pytest.fixture
def fake_python(tmp_path):
    """An interpreter whose ``-m pip install`` fails ``FAILS`` times, then logs its requirements."""
    path = tmp_path / "python"
    path.write_text(
        textwrap.dedent(
            f"""\
            #!/usr/bin/env bash
            if [[ "$1 $2 $3" == "-m pip install" ]]; then
              n=$(cat "{tmp_path}/attempts" 2>/dev/null || echo 0)
              echo $((n + 1)) >"{tmp_path}/attempts"
              if ((n < FAILS)); then echo "simulated: connection reset" >&2; exit 1; fi
              while (($#)); do
                if [[ "$1" == --requirement ]]; then cp "$2" "{tmp_path}/asked.txt"; fi
                shift
              done
              exit 0
            fi
            exec "{sys.executable}" "$@"
            """
        )
    )
    path.chmod(0o755)
    return path


def test_asks_pip_for_every_pin_but_pyspark_and_retries(tmp_path, fake_python):
    result = run_script(
        str(REQUIREMENTS),
        env={"PYTHON": str(fake_python), "FAILS": "1", "PIP_RETRY_DELAY": "0"},
    )
    assert result.returncode == 0, result.stderr
    expected = {name: v for name, v in pins(REQUIREMENTS).items() if name != "pyspark"}
    assert pins(tmp_path / "asked.txt") == expected
    assert (tmp_path / "attempts").read_text().strip() == "2"
    assert "pip install failed (attempt 1/4)" in result.stderr
    assert "skipping pyspark==" in result.stderr


def test_gives_up_after_pip_attempts(tmp_path, fake_python):
    result = run_script(
        str(REQUIREMENTS),
        env={"PYTHON": str(fake_python), "FAILS": "99", "PIP_ATTEMPTS": "3", "PIP_RETRY_DELAY": "0"},
    )
    assert result.returncode == 1
    assert (tmp_path / "attempts").read_text().strip() == "3"
    assert "pip install failed 3 times" in result.stderr


def test_exclude_is_overridable_and_name_normalised(tmp_path, fake_python):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("PyYAML==6.0.3  # comment\n\nPy_Spark==3.5.7\nclick==8.1.8\n")
    result = run_script(
        str(requirements),
        env={"PYTHON": str(fake_python), "FAILS": "0", "EXCLUDE": "pyyaml py-spark"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "asked.txt").read_text() == "click==8.1.8\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read requirements file"),
        ("pyspark==3.5.7\n", "no requirements left to install"),
        ("-r other.txt\nclick==8.1.8\n", "option lines are not supported"),
    ],
)
def test_refuses_unusable_requirements(tmp_path, fake_python, content, message):
    requirements = tmp_path / "requirements.txt"
    if content is not None:
        requirements.write_text(content)
    result = run_script(str(requirements), env={"PYTHON": str(fake_python), "FAILS": "0"})
    assert result.returncode == 1
    assert message in result.stderr
    assert not (tmp_path / "attempts").exists()


def test_the_second_argument_names_the_interpreter(tmp_path, fake_python):
    # EMR 8: a bootstrap action cannot set its own environment, so conf/emr8.yaml passes python3.11 as an argument.
    result = run_script(str(REQUIREMENTS), str(fake_python), env={"PYTHON": "/nonexistent/python3"})
    assert result.returncode == 0, result.stderr
    assert pins(tmp_path / "asked.txt")  # the named interpreter's pip was asked


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_refuses_a_python_mxnet_cannot_run_on_and_says_which_to_give(tmp_path, version):
    python = tmp_path / "python3"
    python.write_text(f'#!/usr/bin/env bash\nif [[ "$1" == -c ]]; then echo {version}; exit 0; fi\nexit 1\n')
    python.chmod(0o755)
    result = run_script(str(REQUIREMENTS), str(python), env={})
    assert result.returncode == 1
    assert f"is Python {version}; the job's MXNet 1.9.1 needs numpy<1.24" in result.stderr
    assert "give python3.11 as this script's second argument" in result.stderr


def test_an_interpreter_without_pip_gets_it_before_the_install(tmp_path):
    python = tmp_path / "python3.11"
    python.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        if [[ "$1 $2" == "-m ensurepip" ]]; then touch "{tmp_path}/has-pip"; exit 0; fi
        if [[ "$1 $2" == "-m pip" ]]; then
          [[ -f "{tmp_path}/has-pip" ]] || exit 1
          if [[ "$3" == install ]]; then touch "{tmp_path}/installed"; fi
          exit 0
        fi
        exec "{sys.executable}" "$@"
        """))
    python.chmod(0o755)
    result = run_script(str(REQUIREMENTS), str(python), env={})
    assert result.returncode == 0, result.stderr
    assert "has no pip: installing it" in result.stderr
    assert (tmp_path / "installed").exists()


def test_refuses_missing_interpreter():
    result = run_script(str(REQUIREMENTS), env={"PYTHON": "/nonexistent/python3"})
    assert result.returncode == 1
    assert "interpreter '/nonexistent/python3' not found" in result.stderr


# ---------------------------------------------------------------------------
# The real install, once per module


def emr_like_python() -> str:
    """Python 3.9 (EMR 7's python3) when this machine has one, else this python3."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    candidates += ["/usr/bin/python3.9", "/usr/local/bin/python3.9"]
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    return "python3"


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory):
    """A fresh venv after the packaged bootstrap ran in it twice: (python, first, second, dist)."""
    tmp = tmp_path_factory.mktemp("bootstrap")
    dist = tmp / "dist"
    subprocess.run(["make", "-s", "package", f"DIST={dist}"], cwd=ROOT, check=True)
    venv = tmp / "venv"
    subprocess.run([emr_like_python(), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # No argument: the script reads the requirements.txt that `make package` put beside it.
    first = run_script(env={"PYTHON": python}, script=dist / "install-deps.sh")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = run_script(env={"PYTHON": python}, script=dist / "install-deps.sh")
    return python, first, second, dist


FORWARD_PASS = """
import boto3, click, yaml
import mxnet as mx
import numpy as np
from PIL import Image

image = Image.fromarray(np.random.RandomState(0).randint(0, 255, (32, 32, 3), dtype=np.uint8))
batch = mx.nd.array(np.asarray(image, dtype=np.float32).transpose(2, 0, 1)[None] / 255)
net = mx.sym.softmax(mx.sym.FullyConnected(mx.sym.flatten(mx.sym.var("data")), num_hidden=10))
module = mx.mod.Module(net, data_names=["data"], label_names=None, context=mx.cpu())
module.bind(data_shapes=[("data", batch.shape)], for_training=False)
module.init_params(mx.init.Xavier())
module.forward(mx.io.DataBatch([batch]), is_train=False)
probs = module.get_outputs()[0].asnumpy()
assert probs.shape == (1, 10), probs.shape
assert abs(float(probs.sum()) - 1.0) < 1e-5, probs.sum()
print("forward ok", mx.__version__, np.__version__)
"""


def test_installed_stack_runs_a_forward_pass(bootstrapped):
    python, _, _, _ = bootstrapped
    result = subprocess.run([python, "-c", FORWARD_PASS], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert f"forward ok {pins(REQUIREMENTS)['mxnet']} {pins(REQUIREMENTS)['numpy']}" in result.stdout


def test_installs_exactly_the_pins_and_logs_them(bootstrapped):
    python, first, _, _ = bootstrapped
    freeze = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    installed = {}
    for line in freeze.splitlines():
        name, version = line.split("==")
        installed[re.sub(r"[-_.]+", "-", name.lower())] = version
    expected = {name: v for name, v in pins(REQUIREMENTS).items() if name != "pyspark"}
    assert {name: installed.get(name) for name in expected} == expected
    assert "pyspark" not in installed
    for name, version in expected.items():
        assert re.search(rf"installed {name}=={re.escape(version)}$", first.stderr, re.I | re.M)


def test_second_run_succeeds_and_installs_nothing(bootstrapped):
    _, first, second, _ = bootstrapped
    assert "Successfully installed" in first.stdout
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Successfully installed" not in second.stdout
    assert "install-deps: done" in second.stderr


def test_packaged_job_and_deploy_tool_load_on_that_python(bootstrapped, tmp_path):
    """The zip's modules and infer_main.py import with only what the bootstrap installed."""
    python, _, _, dist = bootstrapped
    # conf/emr.yaml as a user fills it in: create-cluster refuses the shipped placeholders.
    conf = tmp_path / "emr.yaml"
    conf.write_text((ROOT / "conf" / "emr.yaml").read_text().replace("subnet-CHANGE-ME", "subnet-0123456789abcdef0")
                    .replace("s3://CHANGE-ME-emr-logs", "s3://my-emr-logs").replace("CHANGE-ME", "my-key"))
    job = subprocess.run(
        [python, str(dist / "infer_main.py"), "--help"],
        env={**os.environ, "PYTHONPATH": str(dist / "mxinfer_job.zip")},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    assert "--config URI" in job.stdout
    deploy = subprocess.run(
        [python, str(ROOT / "deploy" / "emr.py"), "create-cluster", "--s3", "s3://b/p", "--config", str(conf),
         "--aws", "aws", "--dry-run"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert deploy.returncode == 0, deploy.stderr
    assert deploy.stdout.startswith("+ aws emr create-cluster ")


def test_the_library_pages_examples_run_as_printed_on_that_python(bootstrapped, tmp_path):
    """docs/library.md's blocks (classify, embed, detect) on that Python, with only what the bootstrap installed and
    the packaged zip, as an EMR 7 node runs them: a call its Python 3.9 or its pins lack fails here."""
    python, _, _, dist = bootstrapped
    examples.make_examples(tmp_path / "run" / "examples", tmp_path / "run" / "demo")
    env = {**os.environ, "PYTHONPATH": str(dist / "mxinfer_job.zip")}
    assert len(LOCAL) >= 3
    for line, code in LOCAL:
        result = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300, check=False)
        assert result.returncode == 0, f"docs/library.md line {line}: {result.stderr[-3000:]}"
        want = printed(code)
        assert CHECKER.check_output(want, result.stdout, OPTIONS), f"line {line}:\n{result.stdout}\nthe page:\n{want}"


@pytest.mark.spark
def test_the_packaged_job_runs_through_spark_submit_on_that_python(bootstrapped, moto_endpoint, demo_dir):
    """The job itself as an EMR 7 step runs it: the packaged ``infer_main.py`` and zip, spark-submit with the
    cluster's own PySpark (Spark's ``python/lib`` zips, not a pip install), the driver and every Python worker on
    the bootstrapped interpreter. Its scores are the library's on this one, and the summary names that Python."""
    import pyspark

    python, _, _, dist = bootstrapped
    s3, keys = bucket_with_digits(moto_endpoint, "emr7-python", demo_dir / "model", 12)
    command = spark_submit_command([
        "--input", "s3://emr7-python/imgs/", "--model", "s3://emr7-python/model/digits",
        "--output", "s3://emr7-python/out.jsonl", "--endpoint-url", moto_endpoint,
        "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4", "--top-k", "2",
    ], "local-cluster[1,1,2048]")
    files = command.index("--py-files")
    command[files + 1:files + 3] = [str(dist / "mxinfer_job.zip"), str(dist / "infer_main.py")]
    env = spark_env({"SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": python,
                     "PYSPARK_DRIVER_PYTHON": python})
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in
            s3.get_object(Bucket="emr7-python", Key="out.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == keys
    model = digits_classifier(demo_dir / "model", 4)
    expected = model.classify_images([s3.get_object(Bucket="emr7-python", Key=key)["Body"].read() for key in keys],
                                     top_k=2)
    assert [[p["class_id"] for p in row["predictions"]] for row in rows] == [[c for c, _, _ in e] for e in expected]
    np.testing.assert_allclose([[p["probability"] for p in row["predictions"]] for row in rows],
                               [[p for _, _, p in e] for e in expected], rtol=1e-4, atol=1e-6)
    summary = json.loads(s3.get_object(Bucket="emr7-python", Key="out.jsonl.summary.json")["Body"].read())
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert summary["spark"]["python"] == version and summary["spark"]["version"] == pyspark.__version__


def shipped_imports() -> set[str]:
    """Top-level modules that the shipped code (the job file, the zip's modules, the package) imports anywhere,
    at module level or inside a function, less the standard library and the project's own modules."""
    import ast
    import sys

    files = [ROOT / "infer_main.py", ROOT / "mxinfer.py", ROOT / "utils.py", *sorted((ROOT / "mxjob").rglob("*.py"))]
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"mxjob", "mxinfer", "utils", "infer_main", "__future__"}


def test_every_module_the_shipped_code_imports_is_pinned_for_the_cluster():
    # The bootstrap installs requirements.txt on every node: a module imported only inside a function (psutil,
    # for the estimate's JVM timing) that is pinned for development alone is missing on EMR and after pip install.
    # A module may also come with a pinned package that requires it (botocore with boto3, urllib3 with botocore).
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    def norm(name: str) -> str:
        return re.split(r"[\s;<>=!~\[(]", name.strip(), maxsplit=1)[0].lower().replace("_", "-")

    def requirements_of(dist: str) -> list[str]:
        try:
            return [req for req in requires(dist) or [] if "extra ==" not in req]
        except PackageNotFoundError:  # a requirement for another Python (importlib-metadata on 3.9)
            return []

    installable = {norm(name) for name in pins(REQUIREMENTS)}
    for _ in range(2):  # the pins' requirements, and theirs
        installable |= {norm(req) for dist in list(installable) for req in requirements_of(dist)}
    distributions = packages_distributions()
    missing = {module: distributions.get(module) for module in shipped_imports()
               if not {norm(d) for d in distributions.get(module, [module])} & installable}
    assert missing == {}
