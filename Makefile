# Run `make help` for the targets. The two that matter first:
#   make run-local   the whole job on this machine against a local S3 server
#   make test        the unit and integration tests
SHELL := /bin/bash
PYTHON ?= python3
# The stack every target builds, runs and tests on: emr7 (Spark 3.5, the default) or emr8 (Spark 4.0 on
# Python 3.11, as EMR 8 runs it). Each has its venv; stacks/STACK.txt holds the pins that differ from
# requirements.txt (docs/running.md, "Two stacks").
STACK ?= emr7
# Whether a python is 3.11, EMR 8's interpreter here: MXNet 1.9.1 needs numpy<1.24, whose wheels stop at 3.11.
IS_PY311 := -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'
$(if $(filter $(STACK),emr7 emr8),,$(error STACK must be emr7 or emr8, not '$(STACK)'))
VENV := $(if $(filter emr7,$(STACK)),.venv,.venv-$(STACK))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The light venv of the targets that only watch a job or deploy it (watch, check-job, upload and
# the emr-* ones): requirements-ops.txt, no Spark, MXNet or test tools. They use the full .venv
# instead where it is installed, so that a developer builds one venv, not two.
LIGHT_VENV ?= .venv-ops
LIGHT_STAMP := $(LIGHT_VENV)/.installed
# Any full venv serves them, this stack's first, else either stack's: they need neither Spark nor MXNet.
FULL_VENVS := .venv .venv-emr8
OPS_VENV := $(firstword $(foreach v,$(VENV) $(FULL_VENVS),$(if $(wildcard $(v)/.installed),$(v))) $(LIGHT_VENV))
OPS_PY := $(OPS_VENV)/bin/python
OPS_STAMP := $(OPS_VENV)/.installed

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): requirements.txt requirements-dev.txt stacks/$(STACK).txt deploy/stack_pins.py
	@[ "$(STACK)" != emr8 ] || $(PYTHON) $(IS_PY311) || { echo \
		"EMR 8's stack runs on Python 3.11 (MXNet 1.9.1 needs numpy<1.24, whose wheels stop at 3.11): give PYTHON=python3.11" >&2; exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PYTHON) deploy/stack_pins.py requirements.txt stacks/$(STACK).txt > $(VENV)/requirements.txt
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r $(VENV)/requirements.txt -r requirements-dev.txt
	@touch $(STAMP)

# What every target that runs the venv's Spark makes first: the JVMs' archives and the compiled Python zips
# below, each a no-op once made.
LOCAL_SPARK := jvm-archives spark-zips

.PHONY: venv
venv: $(STAMP) $(LOCAL_SPARK) ## Create .venv from the pinned requirements (STACK=emr8: .venv-emr8, Spark 4.0; done by the other targets when needed)

# Spark's JVMs start from class-data sharing archives made from the venv's jars (demo/jvm_options.py,
# about 15 s once); made again when the Java or the jars change, a no-op otherwise.
.PHONY: jvm-archives
jvm-archives: $(STAMP) ## Make the class-data sharing archives the local Spark's JVMs start from, if missing or stale (make venv does)
	@$(PY) -m demo.jvm_options build --if-stale

.PHONY: spark-zips
spark-zips: $(STAMP) ## Compile the local PySpark's and Py4J's zips (first on every Spark Python process's path) if they lack this Python's bytecode (make venv does)
	@$(PY) -m demo.spark_zips compile --if-stale

# requirements.txt too: requirements-ops.txt takes its versions from it.
$(LIGHT_STAMP): requirements-ops.txt requirements.txt
	@test -x $(LIGHT_VENV)/bin/python || $(PYTHON) -m venv $(LIGHT_VENV)
	$(LIGHT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LIGHT_VENV)/bin/python -m pip install --quiet -r requirements-ops.txt
	@touch $(LIGHT_STAMP)

.PHONY: venv-ops
venv-ops: $(LIGHT_STAMP) ## Create .venv-ops (about 330 MB) from requirements-ops.txt: what watch, check-job, upload and the emr-* targets run with where there is no .venv

.PHONY: run-local
run-local: $(STAMP) $(LOCAL_SPARK) ## Run the job on local-cluster[1,1,2048] (one executor for this host, as EMR runs one per node) against a local moto S3 server (KEEP_S3=1: keep the server up to rerun by hand; ICEBERG=1: write an Iceberg table in a local SQL catalog)
	$(PY) -m demo.run_local $(if $(KEEP_S3),--keep-s3) $(if $(ICEBERG),--iceberg)

.PHONY: examples
examples: $(STAMP) ## Write the files docs/library.md's examples read into run/examples/ (digits, a photo, a small detector), and the demo model into run/demo/model/ if missing; offline, no S3 or Spark
	$(PY) -m demo.examples run/examples run/demo

.PHONY: submit
submit: $(STAMP) $(LOCAL_SPARK) ## spark-submit the job on local-cluster[1,1,2048] from any shell, printing the whole command: ARGS='--config conf/demo.yaml --endpoint-url URL'. make itself exits 2 on any failure: the job's code is on the last line, and the printed == line, run by hand, exits with it
	$(PY) -m demo.submit $(ARGS)

# --- a real YARN on this machine: docs/running.md, "On a real YARN here" ---
.PHONY: yarn-up
yarn-up: $(STAMP) ## Start a local YARN (a ResourceManager, two NodeManagers, real containers) in the background, or reuse it; prints the HADOOP_CONF_DIR line
	$(PY) -m demo.yarn_local up

.PHONY: yarn-down
yarn-down: $(STAMP) ## Stop the local YARN and its containers
	$(PY) -m demo.yarn_local down

.PHONY: yarn-status
yarn-status: $(STAMP) ## Whether the local YARN runs, its nodes and where their containers' logs are
	$(PY) -m demo.yarn_local status

.PHONY: run-yarn
run-yarn: $(STAMP) ## The demo as an EMR step runs it: spark-submit --deploy-mode cluster on the local YARN (starts it), job config from S3; prints the app id, final state, demo accuracy, container logs
	$(PY) -m demo.run_yarn --demo

.PHONY: submit-yarn
submit-yarn: $(STAMP) ## Rehearse your EMR step on the local YARN: ARGS='--config s3://bucket/job.yaml' (conf/emr.yaml's Spark settings, scaled)
	$(PY) -m demo.run_yarn $(ARGS)

# --- a second, independent reader of the Iceberg output: demo/iceberg_spark.py ---
.PHONY: iceberg-spark
iceberg-spark: $(STAMP) ## A second reader of the Iceberg output: pyiceberg writes a small table on moto in two commits, Spark with Iceberg's jars (fetched into .iceberg-jars/ by Maven at first use) reads it; both views printed, exit 1 on any difference (about 30 s)
	$(PY) -m demo.iceberg_spark --self-check

.PHONY: test
test: $(STAMP) $(LOCAL_SPARK) ## Run ruff, the import layers and every test (unit and spark-submit integration), then the EMR 8 leg (test-emr8); installs chromium (report tests) as root
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed and not root: the report's browser tests will be skipped" >&2; }
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	@if [ "$(STACK)" != emr7 ]; then :; \
	elif $(EMR8_PYTHON) $(IS_PY311) 2>/dev/null; then \
		$(MAKE) --no-print-directory test-emr8 PYTHON=$(EMR8_PYTHON); \
	else echo "the EMR 8 leg is skipped: it needs Python 3.11 ($(EMR8_PYTHON) is not); make test-emr8 PYTHON=python3.11 runs it" >&2; fi

# make test's second leg: what tells Spark 4 from Spark 3.5 (the tests marked stacks: the job end to end, the
# event-log and Iceberg readers, cluster mode on the local YARN, a signal to spark-submit's JVM) and the install
# tests (the wheel into a fresh venv), on EMR 8's stack.
# The interpreter of the EMR 8 leg: python3.11 where it is on PATH, else python3 (which must then be 3.11).
EMR8_PYTHON ?= $(if $(shell command -v python3.11),python3.11,$(PYTHON))
.PHONY: test-emr8
test-emr8: ## The tests marked stacks or install, again on EMR 8's stack (.venv-emr8: Spark 4.0.2); make test runs it after the rest
	$(MAKE) --no-print-directory venv STACK=emr8
	.venv-emr8/bin/pytest -m "stacks or install" $(PYTEST_ARGS)

.PHONY: watch
watch: $(OPS_STAMP) ## Print a running job's progress until it ends: OUTPUT=s3://bucket/key [ENDPOINT=http://127.0.0.1:5000]. make itself exits 2 on any failure: the job's code is on the last line, and .venv/bin/python -m mxjob.reporting.watch OUTPUT (.venv-ops/bin/python without .venv) exits with it
	@[[ "$(OUTPUT)" == s3://?* ]] || { echo "set OUTPUT=s3://bucket/key (the job's --output)" >&2; exit 2; }
	$(OPS_PY) -m mxjob.reporting.watch "$(OUTPUT)" $(if $(ENDPOINT),--endpoint-url "$(ENDPOINT)")

.PHONY: lint
lint: $(STAMP) ## ruff, and the import layers of .importlinter (import-linter)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

.PHONY: docs
docs: $(STAMP) ## Regenerate docs/options.md and conf/defaults.yaml (mxjob/options/settings.py), docs/output.md's Parquet columns and Athena tables, and the summary's, status file's (docs/output.md) and dry-run plan's (docs/configuration.md) field tables (mxjob/reporting/output_docs.py, mxjob/reporting/records.py), and docs/layout.md's map of the code (deploy/layout_docs.py)
	$(PY) -m mxjob.options.settings_docs .
	$(PY) -m mxjob.reporting.output_docs .
	$(PY) deploy/layout_docs.py .

# --- benchmarks: docs/performance.md and docs/input.md say what they measure ---
BENCH_ARGS ?=

.PHONY: bench
bench: $(STAMP) $(LOCAL_SPARK) ## Throughput (L, S, E), what each tuning option gains, and memory on this machine, printed as a table (about 25 min; BENCH_ARGS='--option-rounds 0': about 4, without the option rows; BENCH_ARGS=--quick; BENCH_ARGS='--tasks embed,detect': embed and detect rows beside classify on the first --models model, five more spark-submit runs)
	$(PY) -m bench.run_bench $(BENCH_ARGS)

.PHONY: bench-int8
bench-int8: $(STAMP) ## --int8-exclude auto on the real EfficientNet-Lite0: configurations, layers kept, agreement, speed-up, CPU (about 5 min; BENCH_ARGS='--held-out 50')
	$(PY) -m bench.int8_search $(BENCH_ARGS)

.PHONY: bench-recipes
bench-recipes: $(STAMP) ## Faster JPEG decodes than the recipe: CPU per JPEG, input difference, EfficientNet-Lite0's agreement, CPU (about a minute; BENCH_ARGS='--images 100')
	$(PY) -m bench.decode_alternatives $(BENCH_ARGS)

.PHONY: bench-listing
bench-listing: $(STAMP) ## Parallel vs sequential listing of 200,000 keys on moto behind a 50 ms proxy (about 2 min; BENCH_ARGS='--layout flat')
	$(PY) -m bench.listing $(BENCH_ARGS)

.PHONY: bench-manifest
bench-manifest: $(STAMP) $(LOCAL_SPARK) ## A job from a manifest of 100,000 keys, half missing: one line per key (long; BENCH_ARGS='--keys 2000')
	$(PY) -m bench.manifest_job $(BENCH_ARGS)

.PHONY: bench-scale
bench-scale: $(STAMP) $(LOCAL_SPARK) ## Driver time and memory, per-task overhead at 100,000 and 1,000,000 keys, fake fast scorer (long; BENCH_ARGS=--quick)
	$(PY) -m bench.scale $(BENCH_ARGS)

.PHONY: bench-worker
bench-worker: $(STAMP) ## The worker's CPU per image beyond the forward pass, step by step: GET, decode, resize, normalise, glue, the whole task in process; the task with ResNet-18's real forward pass in fp32 and int8 and the share of int8's gain it keeps; 12 MP photos (about 2 min; BENCH_ARGS='--model none': about 15 s)
	$(PY) -m bench.worker_steps $(BENCH_ARGS)

.PHONY: bench-estimate
bench-estimate: $(STAMP) $(LOCAL_SPARK) ## The estimate against the measured time: --dry-run's projection beside the run, 128 and 1,280 JPEGs, and the EMR layout modelled (about 2 min; BENCH_ARGS='--sizes 16,64 --layout 10x16 --node-price 0.96')
	$(PY) -m bench.estimate_check $(BENCH_ARGS)

.PHONY: bench-startup
bench-startup: $(STAMP) $(LOCAL_SPARK) ## Where a small run's start-up goes: each step's end from spark-submit's start to the first durable batch (the driver, the listing, the executors' JVMs and Python workers, the warm-up's MXNet import, model load, first forward pass and sample, the first batch), medians of 3 cold runs, CPU by process (about 2 min; BENCH_ARGS='--images 16 --runs 1')
	$(PY) -m bench.startup $(BENCH_ARGS)

# The peers' own venv: Daft and Ray need Python 3.10+, so they are bench dependencies only, never the job's.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/requirements-peers.txt requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
		|| { echo "Daft and Ray need Python 3.10 or later: make bench-peers PYTHON=python3.11" >&2; exit 2; }
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	@touch $(PEERS_STAMP)

.PHONY: bench-peers
bench-peers: $(STAMP) $(LOCAL_SPARK) $(PEERS_STAMP) ## This job (three layouts) beside Daft, Ray Data and Spark's predict_batch_udf, each peer at the fastest of its configurations, on the same images, model, recipe and S3 stand-in: E and E/L, whole-job time at 128 and 1,280 images, CPU by process, top-1 agreement, targets, CPU (about 30 min; makes .venv-peers; BENCH_ARGS='--sizes 8,16 --rounds 1 --no-sweep')
	$(PY) -m bench.peers $(BENCH_ARGS)

# --- EMR deploy ---
# docs/emr.md walks through these. S3 is the prefix the cluster reads the job
# from; everything else comes from conf/emr.yaml (EMR_CONF).
DIST ?= dist
EMR_CONF ?= $(if $(filter emr8,$(STACK)),conf/emr8.yaml,conf/emr.yaml)
S3 ?=
CLUSTER_ID ?=
JOB ?=
JOB_CONFIG ?=
ARGS ?=
AWS ?= $(OPS_VENV)/bin/aws
need-s3 = @[[ "$(S3)" == s3://?* ]] || { echo "set S3=s3://bucket/prefix (got '$(S3)')" >&2; exit 2; }
# The step reads JOB_CONFIG, else S3/job.yaml, of which JOB (make upload's) is the
# local copy: deploy/emr.py then checks it with ARGS, as the job will read them.
job-config-args = $(if $(JOB_CONFIG),--job-config "$(JOB_CONFIG)",$(if $(JOB),--job-file "$(JOB)"))

.PHONY: check-job
check-job: $(OPS_STAMP) ## Check JOB=my-job.yaml [ARGS='--top-k 3'] as infer_main.py reads them, with no S3 or Spark (make upload runs it first)
	@[[ -n "$(JOB)" ]] || { echo "set JOB=my-job.yaml (the job config)" >&2; exit 2; }
	$(OPS_PY) deploy/emr.py check-job --job-file "$(JOB)" -- $(ARGS)

.PHONY: package
package: ## Build dist/ (or DIST=...): infer_main.py, mxinfer_job.zip (--py-files: mxinfer.py, utils.py, mxjob/), install-deps.sh + the stack's requirements.txt, conf/
	rm -rf "$(DIST)"
	mkdir -p "$(DIST)/conf"
	cp infer_main.py bootstrap/install-deps.sh "$(DIST)/"
	$(PYTHON) deploy/stack_pins.py requirements.txt stacks/$(STACK).txt > "$(DIST)/requirements.txt"
	cp $(sort conf/defaults.yaml conf/emr.yaml $(EMR_CONF)) "$(DIST)/conf/"
	$(PYTHON) deploy/package.py "$(DIST)/mxinfer_job.zip"

.PHONY: upload
# check-job first: a bad or missing JOB file is refused before dist/ is built or anything uploaded.
upload: $(if $(JOB),check-job) package $(OPS_STAMP) ## Copy dist/ to S3=s3://bucket/prefix; JOB=my-job.yaml (checked first) also goes up as S3/job.yaml
	$(need-s3)
	$(AWS) s3 cp --recursive "$(DIST)/" "$(S3:%/=%)/"
	$(if $(JOB),$(AWS) s3 cp "$(JOB)" "$(S3:%/=%)/job.yaml")

.PHONY: emr-cluster
emr-cluster: $(OPS_STAMP) ## aws emr create-cluster from conf/emr.yaml (or EMR_CONF=...), bootstrapped from S3=s3://bucket/prefix
	$(need-s3)
	$(OPS_PY) deploy/emr.py create-cluster --config "$(EMR_CONF)" --s3 "$(S3)"

.PHONY: emr-submit
emr-submit: $(OPS_STAMP) ## Add the cluster-mode spark-submit step, ARGS checked first: CLUSTER_ID=j-... S3=... [JOB_CONFIG=s3://...] [ARGS='--top-k 3']
	$(need-s3)
	$(OPS_PY) deploy/emr.py add-step --config "$(EMR_CONF)" --s3 "$(S3)" --cluster-id "$(CLUSTER_ID)" \
		$(job-config-args) -- $(ARGS)

.PHONY: emr-run
emr-run: $(OPS_STAMP) ## One run on a cluster of its own, terminated when the step ends: S3=... [JOB_CONFIG=s3://...] [ARGS='--top-k 3']
	$(need-s3)
	$(OPS_PY) deploy/emr.py run-job --config "$(EMR_CONF)" --s3 "$(S3)" $(job-config-args) -- $(ARGS)
# --- end EMR deploy ---

.PHONY: clean
clean: ## Remove build outputs and run-local's work folder (the local YARN's .yarn/ stays: make clean-yarn)
	rm -rf dist build run .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +

.PHONY: clean-yarn
clean-yarn: ## Stop the local YARN and remove .yarn/ (its jars, logs and state; Maven fetches the jars again)
	@if [ -x $(PY) ]; then $(PY) -m demo.yarn_local down; fi
	rm -rf .yarn

.PHONY: clean-venv
clean-venv: ## Remove the virtual environments (.venv, .venv-ops, and the peers bench's .venv-peers) and make iceberg-spark's jars (.iceberg-jars)
	rm -rf $(VENV) $(LIGHT_VENV) $(PEERS_VENV) .iceberg-jars
