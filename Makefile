# Quick start: `make run` (proxy + store + API) and `make test`. Both set themselves up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLIENTS_STAMP := $(VENV)/.clients-installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: install run test lint mutate bench bench-smoke demo clean

install: $(STAMP) $(CLIENTS_STAMP)

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

# The real servers and official SDK clients of the end-to-end tests and `make demo`
# (llama-cpp-python[server], llm-katan, openai, anthropic, google-genai; SmolLM2 GGUF), into the
# same venv, constrained by requirements.lock so no core pin moves. llama-cpp-python builds
# from source once (~4 min on 2 cores) into LLAMA_WHEELS, which every later install reuses.
# It is built for a portable x86-64 set (AVX2, FMA, F16C; no AVX-512, no AMX): a native build on
# a CPU that reports AMX died with SIGILL on its first token where the kernel does not grant the
# AMX tile state (a virtual machine), and so did every later run from the cached wheel. The
# wheel is cached under its own name so an earlier native one is never reused.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEELS := $(HOME)/.cache/observer/llama-wheels-portable
# And the Node.js clients of docs/ca-install.md's snippets (undici, openai, @anthropic-ai/sdk; pinned in
# tests/node/package-lock.json) into tests/node/node_modules; without npm their tests are skipped.
$(CLIENTS_STAMP): $(STAMP) requirements.lock requirements-clients.lock requirements-nodeps.lock tests/node/package-lock.json
	@ls $(LLAMA_WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || { \
	  echo "building llama-cpp-python 0.3.36 from source (once, kept in $(LLAMA_WHEELS); a few minutes on 2 cores)..."; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-$$(nproc)} \
	    $(PY) -m pip wheel -q --no-cache-dir --no-deps -w $(LLAMA_WHEELS) llama_cpp_python==0.3.36; }
	$(PY) -m pip install -q -c requirements.lock --find-links $(LLAMA_WHEELS) -r requirements-clients.lock
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.lock
	@if command -v npm >/dev/null; then npm ci --prefix tests/node --no-audit --no-fund --loglevel=error; \
	  else echo "npm not found: the Node.js client tests (tests/e2e/test_docs_snippets.py) will be skipped"; fi
	@touch $(CLIENTS_STAMP)

run: $(STAMP)
	$(VENV)/bin/observer run

# The whole suite with branch coverage of observer/; fails under the floor of pyproject.toml's
# [tool.coverage.report] fail_under (the worker subprocess is not measured).
test: install $(BENCH_STAMP)
	$(PY) -m pytest --cov=observer --cov-branch --cov-report=term:skip-covered $(PYTEST_ARGS)

# ruff (configured in pyproject.toml): the linter, and the formatter's check (`ruff format .`
# rewrites the tree to it; no `# fmt: skip` anywhere).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The mutation checks alone (they also run in `make test`): each breaks the code under test on
# purpose (a fast lane, the purity guard's input, a quadratic join) and expects a check to fail.
mutate: $(STAMP)
	$(PY) -m pytest -m mutation tests/unit $(PYTEST_ARGS)

# The benchmarks' own tools (httpx-sse: the core-throughput baseline; py-spy and pyinstrument:
# profiling), constrained by requirements.lock like the clients.
$(BENCH_STAMP): $(STAMP) requirements.lock requirements-bench.lock
	$(PY) -m pip install -q -c requirements.lock -r requirements-bench.lock
	@touch $(BENCH_STAMP)

# Every benchmark suite, figures against a baseline measured in the same run (< 45 min on 2 cores: the query suite builds two 1M stores).
bench: $(BENCH_STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

# Each suite at smoke size (seconds): checks that they run, asserts no figure.
bench-smoke: $(BENCH_STAMP)
	$(PY) bench/run_all.py --smoke $(BENCH_ARGS)

# A real model (SmolLM2-135M-Instruct on llama-cpp-python's server) behind `observer run`: one
# chat completion streamed through the proxy with the openai SDK, tokens printed as they arrive,
# then the stored record from the query API. Everything on 127.0.0.1, bounded, cleaned up.
demo: install
	$(PY) scripts/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .coverage .coverage.*
