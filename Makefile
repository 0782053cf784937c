# The two commands of the README:
#   make book   build the rendered book into _build/html, executing every chapter
#   make test   run every test: fmlab's unit tests, the notebook checks, every chapter under
#               nbval, and the rendered book in headless Chromium (it builds the book first)
# Both create the virtual environment .venv first when it is missing.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# No progress bars in stored outputs; the on-disk model cache is shared by book and tests.
export FMLAB_PROGRESS = 0
# The models are small: one intra-op thread is as fast as two on an idle 2-core machine,
# and much faster when anything else runs beside it (measured per chapter).
export OMP_NUM_THREADS ?= 1
export PYDEVD_DISABLE_FILE_VALIDATION = 1

.PHONY: book test seeds clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	bash scripts/web_assets.sh
	$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going
	@echo "The book is in _build/html/index.html"

test: book
	$(BIN)/python -m pytest tests notebooks --nbval-lax --nbval-current-env

# The robustness run (not part of test): every chapter at seed offsets 1-4.
seeds: $(STAMP)
	$(BIN)/python scripts/check_seeds.py $(SEEDS_ARGS)

clean:
	rm -rf _build .jupyter_cache
