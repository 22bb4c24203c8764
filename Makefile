# The two quickstart commands: `make demo` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch pinned here only: on this project's machines this takes the local CPU wheel;
	# pyproject.toml keeps the range open for users.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/specdec bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
