#!/usr/bin/env bash
# EMR bootstrap action: install the job's pinned Python dependencies into the
# cluster's python3 on every node, before YARN starts any executor there.
#
# The pins come from requirements.txt and nowhere else. `make package` ships it
# beside this script; on EMR, pass its S3 URI as the first argument, since EMR
# copies only the script itself to the node:
#
#   Path=s3://BUCKET/PREFIX/install-deps.sh,Args=[s3://BUCKET/PREFIX/requirements.txt]
#
# A second argument names the interpreter, since a bootstrap action cannot set
# its own environment. EMR 8's python3 is 3.13 and the job's MXNet needs 3.11
# (numpy<1.24 has no wheels past 3.11), so conf/emr8.yaml gives python3.11:
#
#   Args=[s3://BUCKET/PREFIX/requirements.txt,python3.11]
#
# Locally (a test, or a venv of your own):
#
#   PYTHON=/tmp/venv/bin/python bash install-deps.sh path/to/requirements.txt
#
# Environment:
#   PYTHON        interpreter to install into, if no second argument names it
#                 (default: python3 on PATH, which on EMR 7 is /usr/bin/python3,
#                 the one PYSPARK_PYTHON points at); 3.9 to 3.11
#   EXCLUDE       space-separated requirement names to skip (default: pyspark,
#                 because EMR ships its own Spark and a pip copy would shadow it)
#   PIP_ATTEMPTS  how many times to try pip before giving up (default: 4)
#   PIP_RETRY_DELAY  seconds before the first retry, growing linearly (default: 15)
#
# Safe to run twice: pip leaves requirements that are already satisfied alone.
set -euo pipefail

PYTHON="${2:-${PYTHON:-python3}}"
EXCLUDE="${EXCLUDE:-pyspark}"
PIP_ATTEMPTS="${PIP_ATTEMPTS:-4}"
PIP_RETRY_DELAY="${PIP_RETRY_DELAY:-15}"
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="${1:-${script_dir}/requirements.txt}"

log() {
  printf '%s install-deps: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

die() {
  log "ERROR: $*"
  exit 1
}

workdir="$(mktemp -d)"
trap 'rm -rf "${workdir}"' EXIT

if ! python_path="$(command -v "${PYTHON}")"; then
  die "interpreter '${PYTHON}' not found; set PYTHON to the python3 Spark uses"
fi

# MXNet 1.9.1 needs numpy<1.24, whose wheels stop at Python 3.11: say so now, not deep inside pip.
version="$("${python_path}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "${version}" in
  3.9 | 3.10 | 3.11) ;;
  *) die "${python_path} is Python ${version}; the job's MXNet 1.9.1 needs numpy<1.24, which has wheels for Python 3.9 to 3.11 only. On EMR 8 give python3.11 as this script's second argument (conf/emr8.yaml does) and set PYSPARK_PYTHON to it" ;;
esac

# EMR runs bootstrap actions as the hadoop user, and the system python3's
# site-packages belongs to root: go through sudo only when we cannot write there.
site_packages="$("${python_path}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
use_sudo=""
if [[ ! -w "${site_packages}" ]]; then
  command -v sudo >/dev/null 2>&1 \
    || die "${site_packages} is not writable and sudo is missing; run as its owner"
  use_sudo=1
fi

as_owner() {
  if [[ -n "${use_sudo}" ]]; then
    sudo "$@"
  else
    "$@"
  fi
}

# PEP 503: requirement names compare case-insensitively, with '-', '_', '.' alike.
normalise() {
  printf '%s' "$1" | tr '[:upper:]_.' '[:lower:]--'
}

case "${requirements}" in
  s3://*)
    log "fetching ${requirements}"
    aws s3 cp --only-show-errors "${requirements}" "${workdir}/downloaded.txt"
    requirements="${workdir}/downloaded.txt"
    ;;
esac
[[ -r "${requirements}" ]] || die "cannot read requirements file '${requirements}'"

# Every pin except the excluded names, one per line, comments dropped.
to_install="${workdir}/install.txt"
: >"${to_install}"
names=()
while IFS= read -r line || [[ -n "${line}" ]]; do
  spec="${line%%#*}"
  spec="${spec//[[:space:]]/}"
  [[ -z "${spec}" ]] && continue
  [[ "${spec}" == -* ]] && die "option lines are not supported in ${requirements}: '${line}'"
  name="$(normalise "${spec%%[<>=!~;[@]*}")"
  for excluded in ${EXCLUDE}; do
    if [[ "${name}" == "$(normalise "${excluded}")" ]]; then
      log "skipping ${spec}: excluded"
      continue 2
    fi
  done
  printf '%s\n' "${spec}" >>"${to_install}"
  names+=("${name}")
done <"${requirements}"
((${#names[@]} > 0)) || die "no requirements left to install from ${requirements}"

# EMR 8's python3.11 may come without pip: bring it (ensurepip, else the OS package), as the site's owner.
if ! "${python_path}" -m pip --version >/dev/null 2>&1; then
  log "${python_path} has no pip: installing it"
  as_owner "${python_path}" -m ensurepip --upgrade >&2 \
    || { command -v dnf >/dev/null 2>&1 && sudo dnf install -y "python${version}-pip" >&2; } \
    || true
  "${python_path}" -m pip --version >/dev/null 2>&1 \
    || die "${python_path} has no pip, and neither ensurepip nor dnf could install it; install python${version}-pip on the image first"
fi

log "installing into ${python_path} ($("${python_path}" --version 2>&1)): $(tr '\n' ' ' <"${to_install}")"
attempt=1
until as_owner "${python_path}" -m pip install \
  --disable-pip-version-check --no-input --progress-bar off \
  --requirement "${to_install}"; do
  if ((attempt >= PIP_ATTEMPTS)); then
    die "pip install failed ${attempt} times; see the pip output above"
  fi
  # PyPI or the subnet's NAT gateway can blip while a whole cluster boots at once.
  delay=$((attempt * PIP_RETRY_DELAY))
  log "pip install failed (attempt ${attempt}/${PIP_ATTEMPTS}); retrying in ${delay}s"
  sleep "${delay}"
  attempt=$((attempt + 1))
done

# What is installed now, for the bootstrap log under the cluster's log URI.
while IFS= read -r installed; do
  installed_name="$(normalise "${installed%%==*}")"
  for name in "${names[@]}"; do
    if [[ "${installed_name}" == "${name}" ]]; then
      log "installed ${installed}"
    fi
  done
done < <("${python_path}" -m pip list --disable-pip-version-check --format=freeze)
log "done"
