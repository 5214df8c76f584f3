# txstage — the two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=
BENCH_ARGS ?=
CHAOS_ARGS ?=

.PHONY: install test unit integration lint kafka-up kafka-down registry-up registry-down demo bench bench-latency bench-failover bench-budget chaos image image-test bench-tools bench-workers clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,schemas]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check service tests bench
	$(VENV)/bin/mypy

test: install lint
	$(PY) -m service kafka install
	$(PY) -m service registry install
	TXSTAGE_PROMTOOL="$$(bash deploy/tools/promtool.sh)" $(PY) -m pytest $(PYTEST_ARGS)

unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

kafka-up: install
	$(PY) -m service kafka up

kafka-down: install
	$(PY) -m service kafka down

# A local schema registry (Apicurio, Confluent-compatible API) on 127.0.0.1:8081
registry-up: install
	$(PY) -m service registry up

registry-down: install
	$(PY) -m service registry down

demo: install
	$(PY) -m bench.demo

bench: install
	$(PY) -m bench.throughput $(BENCH_ARGS)

# End-to-end latency at a fixed input rate, e.g. make bench-latency LATENCY_ARGS="--rate 28000"
bench-latency: install
	$(PY) -m bench.latency $(LATENCY_ARGS)

# Fail-over: SIGKILL one of two replicas 10 s into a 10,000 rec/s feed, once per group protocol
FAILOVER_ARGS ?= --rate 10000 --seconds 30 --replicas 2 --kill-after 10
bench-failover: install
	$(PY) -m bench.latency $(FAILOVER_ARGS) --group-protocol classic
	$(PY) -m bench.latency $(FAILOVER_ARGS) --group-protocol consumer

# Transaction modes (per partition, budget, spanning) at 8 and 64 partitions on a backlog,
# e.g. make bench-budget BUDGET_ARGS="--repeat 5"
bench-budget: install
	$(PY) -m bench.budget $(BUDGET_ARGS)

# txstage audit and txstage redrive rates, e.g. make bench-tools TOOLS_ARGS="--records 500000"
bench-tools: install
	$(PY) -m bench.operator_tools $(TOOLS_ARGS)

# TXSTAGE_WORKERS against in-process and two replicas (bench/workers.py), e.g.
# make bench-workers WORKERS_ARGS="--bootstrap 127.0.0.1:9092 --records 100000"
WORKERS_ARGS ?=
bench-workers: install
	$(PY) -m bench.workers $(WORKERS_ARGS)

# A chaos campaign (tests/chaos/campaign.py), e.g.
# make chaos CHAOS_ARGS="--seed 7 --duration 300 --nodes 3 --group-protocol consumer"
chaos: install
	$(PY) -m service kafka install
	$(PY) -m tests.chaos.campaign $(CHAOS_ARGS)

# Container images with docker if a Docker daemon answers, else podman (installed and
# configured by deploy/images/podman-setup.sh): txstage:dev and txstage-backfill:dev.
image:
	bash deploy/images/build.sh

# Builds the images (and the broker/Prometheus stand-ins compose needs when no registry
# is reachable) and tests them: tests/image, the stage and backfill tests in a network
# namespace with loopback only, the compose run beside them. Needs root (netns).
image-test: install
	$(PY) -m service kafka install
	PY=$(PY) bash deploy/images/build.sh stand-ins
	bash deploy/images/offline.sh $(PY) -m pytest tests/image --ignore=tests/image/test_compose.py $(PYTEST_ARGS)
	$(PY) -m pytest tests/image/test_compose.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
