# Quick start: `make run` (proxy + store + API) and `make test`. Both set themselves up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test bench clean

install: $(STAMP)

# Creates .venv from the first Python >= 3.12 found on PATH or under pyenv, then installs the
# exact pins of requirements.lock (mitmproxy pins its own dependencies exactly) and the project.
$(STAMP): requirements.lock pyproject.toml
	@set -e; py="$$(scripts/find-python)"; \
	  if [ ! -x $(PY) ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	    rm -rf $(VENV); echo "creating $(VENV) with $$py"; "$$py" -m venv $(VENV); fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

run: install
	$(VENV)/bin/observer run

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) bench/latency.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
