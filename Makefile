# Two commands do everything on a fresh machine (Python >= 3.10 with venv and pip):
#   make run    set up .venv and start the embedded default stack (4 emulated workers + router on :30000)
#   make test   set up .venv and run lint, type checks and the test suite (what CI runs via .ci/run)
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: run test setup
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

run: setup
	$(PY) -m smetric_router.launch $(ARGS)

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest
