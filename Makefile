# Everything a fresh machine with python3, gcc and make needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# MLServer's own client side (its types, codecs, gRPC stubs and converters), which the
# end-to-end tests drive trioserve with. A venv of its own: in the main one, workers would
# import the real mlserver instead of trioserve's (tests/e2e/mlserver_clients.py).
MLS_VENV := .venv-mlserver
MLS_STAMP := $(MLS_VENV)/.installed-stamp
STORE ?= model_store

.PHONY: setup serve test lint typecheck unit clean asan protos image binary docs

NATIVE := trioserve/_collate.abi3.so

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch first, pinned: a range would pull CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The C collator (also built by pip install); rebuilt when its sources change.
$(NATIVE): $(STAMP) native/collate.c native/collate.h native/build_collate.py
	$(BIN)/python native/build_collate.py

$(MLS_STAMP):
	$(PYTHON) -m venv $(MLS_VENV)
	$(MLS_VENV)/bin/pip install --quiet 'mlserver==1.7.1' requests httpx httpx-sse
	touch $(MLS_STAMP)

# Triton's perf_analyzer, for tests/e2e/test_perf_analyzer.py and docs/triton.md (it also
# needs Debian's libb64-0d, which .ci/run installs).
PERF_ANALYZER := .tools/perf_analyzer/perf_analyzer
$(PERF_ANALYZER): | $(STAMP)
	scripts/get_perf_analyzer.sh $(abspath $(BIN))/python

setup: $(STAMP) $(NATIVE) $(MLS_STAMP) $(PERF_ANALYZER)

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

## Regenerate trioserve/_proto/ from proto/*.proto (betterproto2).
protos: setup
	PYTHON=$(abspath $(BIN))/python scripts/gen_protos.sh

## The native tests again, with the C code built under AddressSanitizer + UBSan.
asan: setup
	sh native/sanitize.sh

## The OCI image (Dockerfile): buildah here, docker build elsewhere (docs/docker.md).
image: setup
	sh scripts/build_image.sh

## One file to run: dist/trioserve.pyz, a zipapp that needs only python3 (docs/binary.md);
## e.g. BINARY_ARGS="--python-versions 3.12,3.13" or BINARY_ARGS="--extras torch".
BINARY_ARGS ?=
binary: setup
	$(BIN)/python scripts/build_binary.py $(BINARY_ARGS)

## The documentation site (mkdocs, Material theme) into site/.
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(MLS_VENV) .tools $(STORE) logs build dist site .mypy_cache .pytest_cache .ruff_cache trioserve/_collate*.so
