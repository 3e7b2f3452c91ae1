# kproxy — two commands: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
K8S_VERSION := $(shell sed -n 's|^\s*k8s.io/kubernetes \(v[0-9][0-9.]*\).*|\1|p' tools/envtest/go.mod | head -1)
# Built binaries live outside the clone so that fresh clones (CI) reuse them.
KPROXY_CACHE ?= $(HOME)/.cache/kproxy
ENVTEST_BIN := $(KPROXY_CACHE)/envtest/$(K8S_VERSION)
export KPROXY_ENVTEST_BIN_DIR := $(ENVTEST_BIN)
HELM_VERSION := $(shell sed -n 's|^\s*\(require \)\?helm.sh/helm/v4 \(v[0-9][0-9.]*\).*|\2|p' tools/helm/go.mod | head -1)
HELM_BIN := $(KPROXY_CACHE)/helm/$(HELM_VERSION)
export KPROXY_HELM_BIN := $(HELM_BIN)/helm
H2SPEC_VERSION := $(shell sed -n 's|^\s*\(require \)\?github.com/summerwind/h2spec \(v[0-9][0-9.a-z+]*\).*|\2|p' tools/h2spec/go.mod | head -1)
H2SPEC_BIN := $(KPROXY_CACHE)/h2spec/$(H2SPEC_VERSION)
export KPROXY_H2SPEC_BIN := $(H2SPEC_BIN)/h2spec
TOXIPROXY_VERSION := $(shell sed -n 's|^\s*\(require \)\?github.com/Shopify/toxiproxy/v2 \(v[0-9][0-9.]*\).*|\2|p' tools/toxiproxy/go.mod | head -1)
TOXIPROXY_BIN := $(KPROXY_CACHE)/toxiproxy/$(TOXIPROXY_VERSION)
export KPROXY_TOXIPROXY_BIN_DIR := $(TOXIPROXY_BIN)
RUN_DIR := .cache/run
PYTEST_ARGS ?=

.PHONY: aiohttp-newest run stop test check unit e2e living helm fuzz lint envtest-bin helm-bin h2spec-bin toxiproxy-bin docs docs-check bench proto clean venv

venv: $(VENV)/.installed

# Installed at the versions requirements.lock (run time) and requirements-dev.lock (tools) pin: a new release
# changes nothing here until `make upgrade`.
$(VENV)/.installed: pyproject.toml examples/readonly-filter/pyproject.toml requirements.lock requirements-dev.lock
	@PYTHON=$(PYTHON) bash tools/check-prereqs.sh python
	@echo "installing kproxy and its dependencies into $(VENV) (about a minute the first time)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip
	sed -n 's/^\([A-Za-z0-9_.-]*==[^ ;]*\).*/\1/p' requirements.lock requirements-dev.lock > $(VENV)/constraints.txt
	$(BIN)/pip install -q --disable-pip-version-check -c $(VENV)/constraints.txt -e '.[dev]' -e examples/readonly-filter
	touch $@

# The newest versions pyproject.toml allows, installed and locked (requirements.lock, requirements-dev.lock);
# then `make test` before committing both.
.PHONY: upgrade
upgrade: venv
	$(BIN)/pip install -q --disable-pip-version-check -U -e '.[dev]' -e examples/readonly-filter
	$(MAKE) lock
	{ sed -n '/^#/p' requirements-dev.lock; $(BIN)/pip freeze --disable-pip-version-check --exclude-editable \
	  | grep -iE "^($$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' requirements-dev.lock | paste -sd'|'))==" | sort -f; } \
	  > $(VENV)/dev.lock && mv $(VENV)/dev.lock requirements-dev.lock
	touch $(VENV)/.installed

# The local cluster's binaries (etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler,
# standin-kubelet, kwok) built from their Go modules; rebuilt only when the pin changes. A cache built before
# some of them existed gets just those.
KWOK_VERSION := $(shell sed -n 's|^\s*sigs.k8s.io/kwok \(v[0-9][0-9.]*\).*|\1|p' tools/kwok/go.mod | head -1)
CLUSTER_BINS := etcd kube-apiserver kubectl kube-controller-manager kube-scheduler standin-kubelet kwok
envtest-bin:
	@if [ "$$(cat $(ENVTEST_BIN)/VERSION 2>/dev/null)" != "$(K8S_VERSION)" ]; then \
	  bash tools/check-prereqs.sh go || exit 1; \
	  echo "building $(CLUSTER_BINS) $(K8S_VERSION) from Go modules into $(ENVTEST_BIN) (cold: about 16 CPU-minutes, 8-9 minutes on 2 idle cores)"; \
	  time bash tools/envtest/build.sh $(ENVTEST_BIN); \
	else \
	  missing=$$(for b in $(CLUSTER_BINS); do [ -x $(ENVTEST_BIN)/$$b ] || echo $$b; done; \
	    [ "$$(cat $(ENVTEST_BIN)/KWOK_VERSION 2>/dev/null)" = "$(KWOK_VERSION)" ] || echo kwok); \
	  if [ -n "$$missing" ]; then \
	    missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	    bash tools/check-prereqs.sh go || exit 1; \
	    echo "building $$missing into $(ENVTEST_BIN)"; \
	    time bash tools/envtest/build.sh --only "$$missing" $(ENVTEST_BIN); \
	  fi; \
	fi

# helm built from its Go module (tools/helm) for the chart tests; rebuilt only when the pin changes.
helm-bin:
	@if [ "$$(cat $(HELM_BIN)/VERSION 2>/dev/null)" != "$(HELM_VERSION)" ]; then \
	  echo "building helm $(HELM_VERSION) from its Go module into $(HELM_BIN)"; \
	  time bash tools/helm/build.sh $(HELM_BIN); \
	fi

# h2spec (HTTP/2 conformance) built from its Go module (tools/h2spec) for tests/e2e/test_h2spec.py; rebuilt
# only when the pin changes.
h2spec-bin:
	@if [ "$$(cat $(H2SPEC_BIN)/VERSION 2>/dev/null)" != "$(H2SPEC_VERSION)" ]; then \
	  echo "building h2spec $(H2SPEC_VERSION) from its Go module into $(H2SPEC_BIN)"; \
	  time bash tools/h2spec/build.sh $(H2SPEC_BIN); \
	fi

# toxiproxy (latency and bandwidth on a TCP link) built from its Go module (tools/toxiproxy) for
# benchmarks/wan.py; not part of `make test`. Rebuilt only when the pin changes.
toxiproxy-bin:
	@if [ "$$(cat $(TOXIPROXY_BIN)/VERSION 2>/dev/null)" != "$(TOXIPROXY_VERSION)" ]; then \
	  echo "building toxiproxy $(TOXIPROXY_VERSION) from its Go module into $(TOXIPROXY_BIN)"; \
	  time bash tools/toxiproxy/build.sh $(TOXIPROXY_BIN); \
	fi

# docs/filters.md is generated from the filters' config models (tests/unit/test_docs.py checks it).
docs: venv
	$(BIN)/python tools/gen_filter_docs.py
	$(BIN)/python tools/gen_chart_schema.py

docs-check: venv
	$(BIN)/python tools/gen_filter_docs.py --check
	$(BIN)/python tools/gen_chart_schema.py --check

# Run kproxy with the recommended chain (CONFIG= another file). With no KUBECONFIG: on the living local
# cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK nodes, the controllers
# reaching the apiserver through kproxy), printing a walk-through; Ctrl-C stops it all. With KUBECONFIG:
# in front of that cluster.
CONFIG ?= config.recommended.yaml
run: venv
	@if [ -n "$$KUBECONFIG" ]; then \
	  echo "kproxy: proxying the cluster of KUBECONFIG=$$KUBECONFIG with $(CONFIG)"; \
	  exec $(BIN)/kproxy run --config $(CONFIG); \
	fi; \
	$(MAKE) --no-print-directory envtest-bin && \
	exec $(BIN)/kproxy envtest run --dir $(RUN_DIR) --config $(CONFIG)

# Stop what `make run` started (if its terminal is gone).
stop: venv
	@$(BIN)/kproxy envtest down --dir $(RUN_DIR)

# The test tiers (docs/developing/testing.md#tiers), pytest markers that tests/conftest.py sets from
# each test's directory and fixtures. A test in none of the other tiers is in the fast one.
OTHER_TIERS := e2e or living or helm or fuzz

# The whole suite: lint, type check and every tier, in one pytest run (one control plane for all).
test: venv envtest-bin helm-bin h2spec-bin lint aiohttp-newest
	$(BIN)/pytest -q -ra $(PYTEST_ARGS)

# The HTTP/1.1 edge's tests on the newest aiohttp release too, when it is not the pinned one (the
# edge reaches into aiohttp's internals: docs/developing/architecture.md#the-aiohttp-seam).
aiohttp-newest: venv
	bash tools/aiohttp-newest/run.sh $(BIN) $(KPROXY_CACHE)

# Before every commit: lint and the fast tier (unit and in-process tests, the examples, the adversarial
# corpus against the recorded upstream: no control plane), with its wall time. tests/e2e holds no fast test.
check: venv
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint && \
	$(BIN)/pytest -q -ra -m "not ($(OTHER_TIERS))" --ignore=tests/e2e $(PYTEST_ARGS); \
	rc=$$?; took=$$(( $$(date +%s) - start )); \
	echo "make check: $$((took / 60)) min $$((took % 60)) s wall (lint and the fast tier)"; \
	exit $$rc

unit: venv
	$(BIN)/pytest -q tests/unit $(PYTEST_ARGS)

# The end-to-end tier: the session control plane, real kproxy processes, kubectl, h2spec.
e2e: venv envtest-bin h2spec-bin
	$(BIN)/pytest -q -ra -m "e2e and not (living or helm or fuzz)" $(PYTEST_ARGS)

# The living cluster's tests: their own control plane with the controllers and KWOK (heavy).
living: venv envtest-bin
	$(BIN)/pytest -q -ra -m living tests/e2e/living $(PYTEST_ARGS)

# The chart tests: helm lint, template and the rendered manifests at the apiserver.
helm: venv envtest-bin helm-bin
	$(BIN)/pytest -q -ra -m helm tests/e2e $(PYTEST_ARGS)

# The differential fuzzer against the apiserver (KPROXY_FUZZ_COUNT, KPROXY_FUZZ_SEED to run it longer).
fuzz: venv envtest-bin
	$(BIN)/pytest -q -ra -m fuzz tests/adversarial $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check kproxy tests examples benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: venv envtest-bin
	$(BIN)/python -m benchmarks.proxies $(BENCH_ARGS)

# The compatibility run (docs/compatibility.md): for each supported minor other than the pinned one
# (tools/compat/v1.*), build its etcd, kube-apiserver and kubectl if missing (cold: about 8 CPU-minutes each,
# cached in $(KPROXY_CACHE)/envtest/<version>) and run the focused e2e set (tools/compat/tests.txt) against a
# control plane of that minor. Not part of `make test` (CI time); COMPAT_MINORS= to run only some.
.PHONY: compat
COMPAT_MINORS ?=
compat: venv
	KPROXY_CACHE=$(KPROXY_CACHE) PYTEST=$(BIN)/pytest bash tools/compat/run.sh $(COMPAT_MINORS)

# The Kubernetes protobuf schema (kproxy/codec/data/) from the Go modules pinned in tools/proto/go.mod.
proto: venv
	bash tools/proto/build.sh

# Release artifacts into dist/: the sdist, the wheel built from it (tools/build_dist.py) and the chart package,
# linted as a release is. `make test` builds and checks the same (tests/e2e/test_release_artifacts.py).
.PHONY: dist lock
dist: venv helm-bin
	$(BIN)/python tools/build_dist.py dist
	$(KPROXY_HELM_BIN) lint --strict deploy/helm/kproxy
	$(KPROXY_HELM_BIN) package deploy/helm/kproxy --destination dist

# requirements.lock, what the image installs (with hashes): kproxy's run-time dependencies and its build
# backend at the versions installed in .venv, which are the versions the suite tests, for Linux and .venv's
# Python (the Dockerfile's PYTHON_VERSION; tests/unit/test_dockerfile.py checks both). Run after an upgrade.
lock: venv
	$(BIN)/pip freeze --disable-pip-version-check --exclude-editable > $(VENV)/tested-versions.txt
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
	  | $(BIN)/uv pip compile --quiet pyproject.toml - --generate-hashes --python-platform linux \
	      --python-version "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
	      --constraint $(VENV)/tested-versions.txt --custom-compile-command "make lock" \
	  | grep -v '^    #   -c ' > requirements.lock

clean:
	-$(BIN)/kproxy envtest down --dir $(RUN_DIR)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
