# The README's two commands are `make demo` and `make test`; both do all the
# set-up they need on a fresh Debian machine (run as root).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEB_PACKAGES := openvswitch-switch ovn-central ovn-host haproxy iptables ethtool iproute2 curl
PYTEST_ARGS ?=

.PHONY: deps venv test unit functional demo demo-down bench clean

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(STAMP)

test: deps venv
	$(PY) -m pytest -p no:cacheprovider --cov=lbagent --cov-branch --cov-report=term $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

functional: deps venv
	$(PY) -m pytest -p no:cacheprovider tests/functional $(PYTEST_ARGS)

demo: deps venv
	$(PY) -m devtools.demo up

demo-down: venv
	$(PY) -m devtools.demo down

clean:
	rm -rf $(VENV) .coverage .coverage.* htmlcov
