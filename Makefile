# Everything a fresh machine with python3, gcc and make needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
STORE ?= model_store

.PHONY: setup serve test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch first, pinned: a range would pull CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## Serve the bundled demo models in the foreground (Ctrl-C drains and stops).
serve: setup
	$(BIN)/trioserve demo-store $(STORE)
	$(BIN)/trioserve start --foreground --model-store $(STORE) --models all

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

## Lint, type-check and run the whole test suite.
test: lint typecheck
	$(BIN)/pytest

clean:
	rm -rf $(VENV) $(STORE) logs .mypy_cache .pytest_cache .ruff_cache
