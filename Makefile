# Every target installs what it needs into .venv first (Python >= 3.11, pip, no GPU needed).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
OUT    ?= capture-out
GRAPH  ?= graph.parquet
REPLAY ?= replay-out

.PHONY: install demo test test-fast lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: an open range would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: install   ## capture the default slice (tiny GPT, target tp=8 pp=16 dp=64), build its full-scale graph, replay rank 123
	$(BIN)/prism-capture -o $(OUT) --overwrite
	$(BIN)/prism-build-graph $(OUT) --tp 8 --pp 16 --dp 64 -o $(GRAPH)
	$(BIN)/prism-replay $(GRAPH) --rank 123 -o $(REPLAY) --overwrite

test: install   ## the whole suite, as CI runs it
	$(BIN)/python -m pytest -q

test-fast: install   ## unit tests only
	$(BIN)/python -m pytest -q tests/unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(OUT) $(GRAPH) $(REPLAY) .pytest_cache .ruff_cache .hypothesis
