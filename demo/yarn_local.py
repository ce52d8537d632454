"""``make yarn-up`` / ``make yarn-down``: a real single-node YARN on this machine, in the checkout's ``.yarn/``.

A ResourceManager and two NodeManagers (``yarn/src/main/java/LocalYarn.java``)
run in one background JVM and launch real containers, with YARN's
physical-memory enforcement on and its virtual-memory check off, as on EMR.
Their jars come from Maven Central at first use (``yarn/pom.xml``, cached in
``.yarn/m2``) and the launcher is compiled with ``javac`` on first use; nothing
is installed outside the checkout. ``.yarn/conf/`` is the client configuration
(``HADOOP_CONF_DIR``) that ``spark-submit --master yarn`` reads.

As on EMR's master, the ResourceManager's UI and REST API answer on its web
address, and ``.yarn/bin/yarn`` is Hadoop's ``yarn`` command for it
(:func:`write_cli`); :func:`kill_app` kills through the REST API. The same JVM
does on request (:func:`request`) what YARN has no working API for here: it
stops a NodeManager (a lost node), and reports an application's state, its
attempts and containers as ``yarn application -status`` does.

    python -m demo.yarn_local up | down | status | kill APPLICATION_ID | report APPLICATION_ID
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "yarn"
STATE = ROOT / ".yarn"
CONF_DIR = STATE / "conf"
LOG = STATE / "yarn.log"
CLASSES = STATE / "classes"
CLASSPATH = STATE / "classpath.txt"
STATE_FILE = STATE / "state.properties"
#: The ``yarn`` command, as on EMR's master: ``.yarn/bin/yarn application -kill ID`` (:func:`write_cli`).
YARN_CLI = STATE / "bin" / "yarn"

#: Two NodeManagers of 8 GiB and 2 vcores each: the cluster is sized by memory, as on EMR (the
#: capacity scheduler's default resource calculator places containers by memory alone), and two
#: 8 GiB nodes leave 8 of this machine's 24 GiB for moto, the tests and spark-submit's own JVM.
NODES, NODE_MEMORY_MB, NODE_VCORES = 2, 8192, 2

#: Hadoop 3.3's servers reach into the JDK by reflection (Guice, Jersey); Java 17 allows it only when opened.
JAVA_OPENS = [f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio", "java.util",
    "java.util.concurrent", "sun.nio.ch")]

#: How long ``up`` waits for the ResourceManager and every NodeManager to register.
START_TIMEOUT = 120.0


class YarnError(RuntimeError):
    """The local YARN cannot be built, started or asked something: the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Node:
    index: int
    node_id: str
    http_port: int
    running: bool
    log_dir: Path


@dataclasses.dataclass(frozen=True)
class ClusterState:
    """What the running launcher wrote to ``.yarn/state.properties``."""

    pid: int
    rm_address: str
    rm_web: str
    nodes: tuple[Node, ...]
    node_memory_mb: int
    requests: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ClusterState:
        props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        nodes = tuple(
            Node(i, props[f"node.{i}.id"], int(props[f"node.{i}.http"]), props[f"node.{i}.running"] == "true",
                 Path(props[f"node.{i}.log_dirs"]))
            for i in range(int(props["nodes"])))
        requests = tuple(value for key, value in sorted(props.items(), key=lambda kv: _request_order(kv[0]))
                         if key.startswith("request."))
        return cls(int(props["pid"]), props["rm.address"], props["rm.web"], nodes, int(props["node.memory_mb"]),
                   requests)


def _request_order(key: str) -> int:
    return int(key.split(".")[1]) if key.startswith("request.") else -1


def read_state() -> ClusterState | None:
    """The running cluster's state, or ``None`` when none runs (no state file, or its JVM is gone)."""
    try:
        state = ClusterState.parse(STATE_FILE.read_text())
    except FileNotFoundError:
        return None
    try:
        cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes()
    except OSError:
        return None
    return state if b"LocalYarn" in cmdline else None


def _maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise YarnError("Maven (mvn) is not on PATH: install it (apt-get install maven) to fetch YARN's jars")
    return mvn


def build() -> str:
    """The launcher's classpath: YARN's jars resolved by Maven (first use only) and LocalYarn compiled."""
    pom = SOURCE / "pom.xml"
    java_source = SOURCE / "src" / "main" / "java" / "LocalYarn.java"
    STATE.mkdir(exist_ok=True)
    if not CLASSPATH.exists() or CLASSPATH.stat().st_mtime < pom.stat().st_mtime:
        print("== fetching YARN's jars from Maven Central into .yarn/m2 (first use only)", flush=True)
        command = [_maven(), "-q", "-B", "-f", str(pom), f"-Dmaven.repo.local={STATE / 'm2'}",
                   "dependency:build-classpath", f"-Dmdep.outputFile={CLASSPATH}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise YarnError(f"Maven could not fetch YARN's jars (exit {done.returncode}):\n"
                            f"{(done.stdout + done.stderr)[-3000:]}")
    classpath = CLASSPATH.read_text().strip()
    compiled = CLASSES / "LocalYarn.class"
    if not compiled.exists() or compiled.stat().st_mtime < java_source.stat().st_mtime:
        CLASSES.mkdir(exist_ok=True)
        javac = shutil.which("javac")
        if javac is None:
            raise YarnError("javac is not on PATH: the local YARN needs a JDK 17 (apt-get install openjdk-17-jdk)")
        done = subprocess.run([javac, "-d", str(CLASSES), "-cp", classpath, str(java_source)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise YarnError(f"javac failed on {java_source}:\n{done.stderr[-3000:]}")
    write_cli(classpath)
    return f"{CLASSES}{os.pathsep}{classpath}"


def write_cli(classpath: str) -> None:
    """``.yarn/bin/yarn``: Hadoop's own command-line classes for applications, attempts, containers and nodes,
    as ``/usr/bin/yarn`` runs them on EMR, with ``.yarn/conf`` as the client configuration."""
    log4j = STATE / "log4j-cli.properties"
    log4j.write_text("log4j.rootLogger=WARN, console\n"
                     "log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR\n"
                     "log4j.appender.console=org.apache.log4j.ConsoleAppender\n"
                     "log4j.appender.console.target=System.err\n"
                     "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
                     "log4j.appender.console.layout.ConversionPattern=%p %c{1}: %m%n\n")
    YARN_CLI.parent.mkdir(exist_ok=True)
    YARN_CLI.write_text(f"""#!/bin/sh
# The yarn command of the local YARN (make yarn-up; written by demo/yarn_local.py): Hadoop's own classes.
case "$1" in
  application|applicationattempt|container) class=org.apache.hadoop.yarn.client.cli.ApplicationCLI ;;
  node) class=org.apache.hadoop.yarn.client.cli.NodeCLI; shift ;;
  *) echo "usage: yarn application|applicationattempt|container|node OPTIONS (Hadoop's; this local YARN has these)" >&2
     exit 1 ;;
esac
exec java {" ".join(JAVA_OPENS)} -Dlog4j.configuration=file:{log4j} \\
  -cp "{CONF_DIR}{os.pathsep}{classpath}" "$class" "$@"
""")
    YARN_CLI.chmod(0o755)


def emr_yarn_site(emr_yaml: Path = ROOT / "conf" / "emr.yaml") -> dict[str, str]:
    """``conf/emr.yaml``'s yarn-site classification: the local YARN runs with the settings EMR gets."""
    import yaml

    raw = yaml.safe_load(emr_yaml.read_text())
    props = next((c.get("Properties", {}) for c in raw["configurations"] if c["Classification"] == "yarn-site"), {})
    return {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in props.items()}


def up(nodes: int = NODES, node_memory_mb: int = NODE_MEMORY_MB, node_vcores: int = NODE_VCORES,
       quiet: bool = False) -> ClusterState:
    """Start the cluster in the background, or reuse the one that runs; its state once every node registered."""
    state = read_state()
    if state is not None and all(node.running for node in state.nodes):
        if not quiet:
            print(f"== a local YARN already runs (pid {state.pid}, ResourceManager at {state.rm_address}); "
                  "reusing it", flush=True)
        return state
    if state is not None:
        # A test stopped one of its nodes: a fresh cluster has them all.
        down(quiet=quiet)
    classpath = build()
    STATE_FILE.unlink(missing_ok=True)
    log4j = STATE / "log4j.properties"
    log4j.write_text("log4j.rootLogger=INFO, console\n"
                     "log4j.appender.console=org.apache.log4j.ConsoleAppender\n"
                     "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
                     "log4j.appender.console.layout.ConversionPattern=%d{HH:mm:ss.SSS} %p %c{1}: %m%n\n"
                     # Each container's memory, every second: what YARN's check compares with the limit.
                     "log4j.logger.org.apache.hadoop.yarn.server.nodemanager.containermanager.monitor"
                     ".ContainersMonitorImpl=DEBUG\n")
    command = ["java", "-Xmx1g", *JAVA_OPENS, f"-Dlog4j.configuration=file:{log4j}", "-cp", classpath,
               "LocalYarn", str(STATE), str(nodes), str(node_memory_mb), str(node_vcores),
               *(f"{key}={value}" for key, value in emr_yarn_site().items())]
    started = time.monotonic()
    with open(LOG, "ab") as log:
        process = subprocess.Popen(command, cwd=str(STATE), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    while (state := read_state()) is None:
        if process.poll() is not None:
            raise YarnError(f"the local YARN exited with code {process.returncode} while starting; "
                            f"its log: {LOG}\n{_tail(LOG)}")
        if time.monotonic() - started > START_TIMEOUT:
            process.kill()
            raise YarnError(f"the local YARN did not start in {START_TIMEOUT:.0f} s; its log: {LOG}\n{_tail(LOG)}")
        time.sleep(0.2)
    if not quiet:
        print(f"== a local YARN runs (pid {state.pid}, {nodes} NodeManagers of {node_memory_mb} MB, "
              f"started in {time.monotonic() - started:.1f} s); its log: {LOG.relative_to(ROOT)}", flush=True)
    return state


def down(quiet: bool = False) -> bool:
    """Stop the cluster (its containers with it); whether one ran."""
    state = read_state()
    if state is None:
        if not quiet:
            print("== no local YARN runs", flush=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGTERM)
    # Its shutdown stops the NodeManagers, which stop their containers; after a node was stopped by
    # hand it can linger for a minute on threads that no longer matter.
    deadline = time.monotonic() + 15
    while Path(f"/proc/{state.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGKILL)
    for pid in container_processes():  # whatever a container left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    STATE_FILE.unlink(missing_ok=True)
    if not quiet:
        print(f"== stopped the local YARN (pid {state.pid})", flush=True)
    return True


def container_processes() -> list[int]:
    """The processes that run in a container of this cluster (their working folder is a node's)."""
    nodes = str(STATE / "nodes") + os.sep
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(nodes):
                found.append(int(pid))
    return found


def request(name: str, timeout: float = 60.0) -> str:
    """Ask the running launcher for ``name`` (see LocalYarn.java); its one-line outcome."""
    state = read_state()
    if state is None:
        raise YarnError("no local YARN runs: start one with make yarn-up")
    control = STATE / "control"
    (control / name).write_text("")
    deadline = time.monotonic() + timeout
    while (control / name).exists():
        if time.monotonic() > deadline:
            raise YarnError(f"the local YARN did not answer {name} in {timeout:.0f} s")
        time.sleep(0.05)
    outcomes = [line for line in read_state().requests if line.startswith(name + " ")]
    outcome = outcomes[-1] if outcomes else f"{name}: no outcome"
    if not outcome.endswith(" done"):
        raise YarnError(f"the local YARN could not do {outcome}")
    return outcome


def rest(path: str, method: str = "GET", body: dict | None = None) -> dict:
    """The ResourceManager's REST API, ``/ws/v1/cluster/PATH``, as on EMR's master (port 8088 there)."""
    state = read_state()
    if state is None:
        raise YarnError("no local YARN runs: start one with make yarn-up")
    # Unsecured YARN takes the caller's name from user.name (curl's ?user.name=$USER on EMR).
    url = f"http://{state.rm_web}/ws/v1/cluster/{path}?user.name={getpass.getuser()}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Accept": "application/json", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError) as exc:
        raise YarnError(f"the ResourceManager's REST API did not answer {method} {url}: {exc}") from exc


def app_report(app_id: str) -> dict[str, str]:
    """What YARN says of ``app_id``: its state, final status, diagnostics, attempts and containers."""
    request(f"report-app-{app_id}")
    text = (STATE / "reports" / f"{app_id}.properties").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def kill_app(app_id: str, timeout: float = 60.0) -> None:
    """``yarn application -kill app_id``, as ``curl -X PUT .../ws/v1/cluster/apps/ID/state`` does it on EMR:
    returns once YARN says the application ended."""
    rest(f"apps/{app_id}/state", "PUT", {"state": "KILLED"})
    deadline = time.monotonic() + timeout
    while rest(f"apps/{app_id}/state")["state"] not in ("KILLED", "FINISHED", "FAILED"):
        if time.monotonic() > deadline:
            raise YarnError(f"YARN did not end {app_id} in {timeout:.0f} s after the kill")
        time.sleep(0.2)


def stop_node(index: int) -> None:
    """Stop NodeManager ``index``: its containers die and it leaves the cluster, as a lost node does."""
    request(f"stop-node-{index}")


def container_log_dirs(app_id: str) -> list[Path]:
    """Each container's log folder (``stdout``, ``stderr``) of ``app_id``, on every node, in container id order."""
    state = read_state()
    roots = [node.log_dir for node in state.nodes] if state else sorted(STATE.glob("nodes/nm-*/logs"))
    # By container id (attempt, then container), whichever node each ran on.
    return sorted((path for root in roots for path in (root / app_id).glob("container_*")), key=lambda p: p.name)


def web_lines(state: ClusterState) -> str:
    """Where YARN's UI, REST API and command are, as on EMR's master."""
    return (f"YARN's UI: http://{state.rm_web}/cluster; its REST API: curl -s http://{state.rm_web}/ws/v1/cluster/info"
            f"\n   the yarn command: {YARN_CLI.relative_to(ROOT)} application -list -appStates ALL")


def hadoop_conf_line() -> str:
    return f"export HADOOP_CONF_DIR={CONF_DIR}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.yarn_local", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status", "kill", "report"])
    parser.add_argument("application", nargs="?", help="the application id, for kill and report")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            state = up()
            print(f"   use it with:\n   {hadoop_conf_line()}\n   {web_lines(state)}\n"
                  "   stop it with: make yarn-down", flush=True)
        elif args.action == "down":
            down()
        elif args.action == "status":
            state = read_state()
            if state is None:
                print("== no local YARN runs (make yarn-up starts one)")
                return 1
            print(f"== a local YARN runs (pid {state.pid}, ResourceManager at {state.rm_address})")
            for node in state.nodes:
                print(f"   node {node.index}: {node.node_id}, {'running' if node.running else 'stopped'}, "
                      f"container logs in {node.log_dir}")
            print(f"   {hadoop_conf_line()}")
            print(f"   {web_lines(state)}")
        else:
            if not args.application:
                parser.error(f"{args.action} needs an application id (application_..._NNNN)")
            if args.action == "kill":
                kill_app(args.application)
                print(f"== killed {args.application}")
            else:
                for key, value in app_report(args.application).items():
                    print(f"{key}: {value}")
    except YarnError as exc:
        print(f"!! {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
