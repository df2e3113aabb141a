# The README's two commands are `make demo` and `make test`; both do all the
# set-up they need on a fresh Debian machine (run as root).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# wrk, nginx-light and its stream module: the benchmark, whose small-N smoke run is part of `make test`.
DEB_PACKAGES := openvswitch-switch ovn-central ovn-host haproxy iptables ethtool iproute2 curl openssl wrk nginx-light libnginx-mod-stream
PYTEST_ARGS ?=
# `make test` runs two pytest-xdist workers (tests/conftest.py): the tests on the machine's one OVS
# sandbox on one, the unit tests and the multi-host tests on the other. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# `make bench BENCH_N="10 100"` for a smaller run; BENCH_ARGS adds flags of
# `python -m bench.run --help` (e.g. --p2-seconds 20); BENCH_PROFILE=1 installs
# py-spy and records the agent during P1 and P2.
BENCH_N ?= 100 1000
BENCH_ARGS ?=
BENCH_PROFILE ?=

# $(call apt_install,PACKAGES): install those of PACKAGES that are missing.
# (On these machines policy-rc.d stops package scripts from starting services:
# nginx-light installs without an nginx running.)
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

.PHONY: deps venv lint golden test unit functional test-scale demo demo-down demo-ha bench bench-scale bench-smoke bench-ha clean

# haproxy's workers run as this system user (lbagent.toml [haproxy] user); its master stays root.
HAPROXY_USER := lbagent-haproxy

deps:
	$(call apt_install,$(DEB_PACKAGES))
	@getent passwd $(HAPROXY_USER) >/dev/null || \
	  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin $(HAPROXY_USER)

$(STAMP): pyproject.toml
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(STAMP)

# ruff (lint and format check) over the project, mypy over lbagent/; both configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# A short --basetemp: each worker's directories go under it in popen-gwN/, and the unix
# sockets of haproxy and OVS under a test's directory must stay below 108 bytes.
test: deps venv lint
	@base=$$(mktemp -d /tmp/lbt.XXXX); \
	env -u LBAGENT_UPDATE_GOLDEN $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --basetemp=$$base \
	  --cov=lbagent --cov-branch --cov-report=term $(PYTEST_ARGS); \
	status=$$?; rm -rf --one-file-system $$base; exit $$status

unit: venv
	env -u LBAGENT_UPDATE_GOLDEN $(PY) -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

# Rewrite the golden haproxy configurations from the current templates; review `git diff` after.
golden: venv
	LBAGENT_UPDATE_GOLDEN=1 $(PY) -m pytest -p no:cacheprovider -q tests/unit/haproxy -rs

functional: deps venv
	$(PY) -m pytest -p no:cacheprovider tests/functional $(PYTEST_ARGS)

demo: deps venv
	$(PY) -m devtools.demo up

demo-down: venv
	$(PY) -m devtools.demo down

# Two gateway agents on a multi-host sandbox: one load balancer with `ha`, its active host killed,
# the failover the client saw. Runs to completion and removes everything.
demo-ha: deps venv
	$(PY) -m devtools.demo_ha

# 2,500 load balancers through one agent: serving, a reload, lbagent cleanup (about ten minutes).
test-scale: deps venv
	LBAGENT_SCALE=1 $(PY) -m pytest -p no:cacheprovider --timeout=2400 tests/functional/test_scale_ceiling.py $(PYTEST_ARGS)

# The full benchmark: one table, bench/results.json. It queues for the
# machine's one OVS sandbox for up to LBAGENT_SANDBOX_WAIT seconds (default 1200).
bench: deps venv
	$(if $(BENCH_PROFILE),$(PY) -m pip install -q py-spy)
	LBAGENT_SANDBOX_WAIT=$${LBAGENT_SANDBOX_WAIT:-1200} $(PY) -m bench.run --n $(BENCH_N) \
	  $(if $(BENCH_PROFILE),--profile) $(BENCH_ARGS)

# P7 and P8 at scale: P1 (with its floor) and the agent's memory at 1,000 and 3,000 load balancers,
# then `lbagent cleanup` of the 3,000 timed; one table, bench/results-scale.json.
BENCH_SCALE_N ?= 1000 3000
bench-scale: deps venv
	LBAGENT_SANDBOX_WAIT=$${LBAGENT_SANDBOX_WAIT:-1200} $(PY) -m bench.run --scale --n $(BENCH_SCALE_N) $(BENCH_ARGS)

# High availability on a multi-host sandbox (H1-H6, about four minutes): one table,
# bench/results-ha.json. BENCH_HA_ARGS adds flags of `python -m bench.ha --help`
# (e.g. --crashes 3 --h6-n 200 for a quick run).
BENCH_HA_ARGS ?=
bench-ha: deps venv
	$(PY) -m bench.ha $(BENCH_HA_ARGS)

# The benchmark's code path at N=3 with short durations (also part of `make test`).
bench-smoke: deps venv
	$(PY) -m pytest -p no:cacheprovider tests/functional/test_bench_smoke.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .coverage .coverage.* htmlcov
