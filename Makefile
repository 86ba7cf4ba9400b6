# Two entry points for a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to the CPU wheel: a loose range can pull several GB of CUDA packages. The
	# platform extra brings the daemons' dependencies (the tests start local clusters).
	$(PY) -m pip install -q "torch==2.13.0" -e ".[platform,test,kernels,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# ruff, then mypy and the layer contract on the hfai packages laid out as installed (tools/typecheck.py,
# tools/importlint.py; the contract is pyproject.toml's [tool.importlinter]), then pytest.
lint: $(STAMP)
	status=0; $(PY) -m ruff check . || status=1; $(PY) tools/typecheck.py || status=1; \
	$(PY) tools/importlint.py || status=1; exit $$status

test: lint
	$(PY) -m pytest -q

# The tests that start no cluster and no worker processes (under a minute): while working.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
