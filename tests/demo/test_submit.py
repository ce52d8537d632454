"""The README's local command, copied from the README and run from a clean shell (no venv activated)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from demo import submit
from demo.run_local import rerun_command, upload_demo
from demo.submit import shell_line, uses_local_s3
from tests.support.helpers import ROOT, make_s3_client

MARKER = "<!-- tests/demo/test_submit.py runs this command as it is written here -->"
IMAGES = 30


def readme_command() -> str:
    """The one-line command in the ```bash block after MARKER in the README."""
    after = (ROOT / "README.md").read_text().split(MARKER, 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    [line] = block.strip().splitlines()
    return line


def fresh_shell_env() -> dict:
    """What a new terminal has: no venv on PATH, no PYSPARK_*, SPARK_* or AWS_* variables."""
    path = ["/usr/local/bin", "/usr/bin", "/bin"]
    java = shutil.which("java")  # wherever this machine keeps Java (Spark needs it), but never .venv/bin
    if java and os.path.dirname(java) not in path:
        path.append(os.path.dirname(java))
    env = {"PATH": ":".join(path), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


def run_in_fresh_shell(line: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], env=fresh_shell_env(), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def demo_bucket(moto_endpoint, demo_dir, tmp_path_factory):
    """conf/demo.yaml's bucket on the test server: the demo model and a few of its digits."""
    subset = tmp_path_factory.mktemp("subset")
    for path in sorted((demo_dir / "images").rglob("*.png"))[:IMAGES]:
        (subset / path.parent.name).mkdir(exist_ok=True)
        shutil.copy(path, subset / path.parent.name / path.name)
    s3 = make_s3_client(moto_endpoint)
    made = {"model_prefix": str(demo_dir / "model" / "digits"), "images": str(subset)}
    assert upload_demo(s3, made, "demo-bucket", "models/digits", "digits/test/") == IMAGES
    return s3


@pytest.mark.parametrize("args, local", [
    (["--endpoint-url", "http://127.0.0.1:5000"], True),
    (["--endpoint-url=http://localhost:9000"], True),
    (["--endpoint-url", "https://s3.eu-west-1.amazonaws.com"], False),
    (["--input", "s3://b/p/"], False),
])
def test_fake_keys_only_for_a_server_on_this_machine(args, local):
    assert uses_local_s3(args) is local


def test_the_printed_line_quotes_what_a_shell_would_split():
    command = ["spark-submit", "--master", "local-cluster[2,1,1024]", "--top-k", "2"]
    line = shell_line(command, {"A": "x y"})
    assert line == "A='x y' spark-submit --master 'local-cluster[2,1,1024]' --top-k 2"
    assert shlex.split(line) == ["A=x y", *command]


def test_a_relative_config_path_is_made_absolute_against_the_callers_directory(tmp_path):
    args = ["--config", "conf/demo.yaml", "--top-k", "2"]
    assert submit.absolute_config(args, str(tmp_path)) == ["--config", str(tmp_path / "conf" / "demo.yaml"),
                                                          "--top-k", "2"]
    assert submit.absolute_config(["--config=job.yaml"], "/home/me") == ["--config=/home/me/job.yaml"]
    unchanged = ["--config", "s3://b/job.yaml", "--output", "out.jsonl"]  # a URI, and no other option's value
    assert submit.absolute_config(unchanged, str(tmp_path)) == unchanged
    assert submit.absolute_config(["--config", "/etc/job.yaml"], str(tmp_path)) == ["--config", "/etc/job.yaml"]


def test_make_submit_prints_and_runs_the_config_path_from_the_callers_directory(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(submit, "run_and_wait", lambda command, **kwargs: ran.append((command, kwargs)) or 0)
    monkeypatch.setattr(submit, "spark_submit_command", lambda job_args: ["spark-submit", "infer_main.py", *job_args])
    monkeypatch.chdir(tmp_path)
    assert submit.main(["--config", "job.yaml", "--endpoint-url", "http://127.0.0.1:5000"]) == 0
    [(command, kwargs)] = ran
    assert command[-3:] == [str(tmp_path / "job.yaml"), "--endpoint-url", "http://127.0.0.1:5000"]
    assert kwargs["cwd"] == str(ROOT)  # spark-submit runs in the checkout: the path must not depend on it
    printed = capsys.readouterr().out
    assert shlex.split(printed.splitlines()[0][3:])[-4:] == ["--config", str(tmp_path / "job.yaml"), "--endpoint-url",
                                                              "http://127.0.0.1:5000"]


@pytest.mark.parametrize(("code", "last"), [
    (1, "exit 1: the job failed"), (3, "exit 3: more images failed than --max-errors allows"),
    (130, "exit 130: interrupted by SIGINT"), (143, "exit 143: interrupted by SIGTERM"),
])
def test_make_submit_prints_the_jobs_code_as_its_last_line_when_it_is_not_0(monkeypatch, capsys, code, last):
    # make exits 2 for any failed recipe: the job's own code must be on the screen.
    monkeypatch.setattr(submit, "run_and_wait", lambda command, **kwargs: code)
    monkeypatch.setattr(submit, "spark_submit_command", lambda job_args: ["spark-submit", "infer_main.py", *job_args])
    assert submit.main(["--top-k", "2"]) == code
    assert capsys.readouterr().err.splitlines()[-1] == last


#: A stand-in for spark-submit: traps SIGTERM (unless told to ignore it), says "ready" in the file argv[1] once it
#: does, and on SIGTERM takes half a second to stop (as the driver writes its last status), then exits 143.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    time.sleep(0.5)
    with out.open("a") as f:
        f.write("stopped\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[2] == "ignore" else stop)
out.write_text("ready\\n")
for _ in range(200):  # 20 s at most, so that a test whose signal goes astray fails instead of hanging
    time.sleep(0.1)
"""


def terminate_this_process_once_ready(ready: Path) -> threading.Thread:
    """A thread that sends SIGTERM to this process (as make does to make submit) once the child traps it."""
    def terminate():
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        if ready.exists():
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=terminate, daemon=True)
    thread.start()
    return thread


def test_run_and_wait_forwards_sigterm_and_returns_only_after_the_job_has_stopped(tmp_path):
    # make submit returned before spark-submit stopped: "Resume with:" then came after the shell's prompt.
    log = tmp_path / "child.log"
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    thread = terminate_this_process_once_ready(log)
    code = submit.run_and_wait([sys.executable, "-c", CHILD, str(log), "trap"])
    thread.join()
    assert code == 143
    assert log.read_text() == "ready\nstopped\n"  # its last line was printed before run_and_wait returned
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_run_and_wait_kills_a_job_that_outlives_the_grace_after_the_signal(tmp_path):
    log = tmp_path / "child.log"
    thread = terminate_this_process_once_ready(log)
    started = time.time()
    code = submit.run_and_wait([sys.executable, "-c", CHILD, str(log), "ignore"], grace=0.5)
    thread.join()
    assert code == 128 + signal.SIGKILL and time.time() - started < 15
    assert log.read_text() == "ready\n"


def test_the_rerun_commands_replace_the_output_the_first_run_wrote():
    # make run-local has written conf/demo.yaml's output by the time it prints its rerun line.
    printed = rerun_command(["--config", "conf/demo.yaml", "--endpoint-url", "http://127.0.0.1:5000"])
    assert printed == "make submit ARGS='--config conf/demo.yaml --endpoint-url http://127.0.0.1:5000 --overwrite'"
    assert "--overwrite" in shlex.split(readme_command().split("ARGS=", 1)[1])[0].split()


@pytest.mark.spark
def test_the_readmes_local_command_runs_from_a_fresh_shell_and_prints_a_line_that_does_too(
        demo_bucket, moto_endpoint):
    line = readme_command()
    assert line.startswith("make submit ARGS=") and "http://127.0.0.1:PORT" in line
    # As after make run-local: the output exists, and the README's command replaces it.
    demo_bucket.put_object(Bucket="demo-bucket", Key="predictions/digits.jsonl", Body=b"the first run's output\n")
    result = run_in_fresh_shell(line.replace("http://127.0.0.1:PORT", moto_endpoint))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    body = demo_bucket.get_object(Bucket="demo-bucket", Key="predictions/digits.jsonl")["Body"].read()
    rows = [json.loads(row) for row in body.decode().splitlines()]
    assert len(rows) == IMAGES and all(len(row["predictions"]) == 2 for row in rows)  # the README's --top-k 2

    # The spark-submit line it printed, with its environment, runs as it is too.
    [printed] = [x[3:] for x in result.stdout.splitlines() if x.startswith("== ") and "spark-submit" in x]
    assert ".venv/bin/spark-submit" in printed and "PYSPARK_PYTHON=" in printed
    again = run_in_fresh_shell(f"{printed} --dry-run --output s3://demo-bucket/predictions/dry.jsonl")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    plan = json.loads(again.stdout.splitlines()[-1])
    assert plan["images"] == IMAGES and len(plan["sample"]["predictions"]) == 2
