# The two commands of the README:
#   make book   build the rendered book into _build/html, executing every chapter
#   make test   run every test: ruff, fmlab's unit tests, every chapter under nbval (strict:
#               re-executed and compared with the built pages), the claims index, and the
#               rendered book in headless Chromium (it builds the book first)
# (Chapters 02 and 05b run under nbval inside the wheel test, in a fresh environment
# from the installed wheel; tests/conftest.py leaves them out of the run below.)
# nbval's re-execution compares text only, never images, so its kernels draw no figure
# (FMLAB_DRAW=0; fmlab.viz.drawing); the tests under tests/ draw as usual.
# Both create the virtual environment .venv first when it is missing.
# `make seeds` is the robustness run (every chapter at seed offsets 1-4; not in test).
# `make lab` opens the executed chapters in JupyterLab, rendered as on the pages.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Chapters (and test files) run this many at a time: one per core.
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)

# No progress bars in stored outputs; the on-disk model cache is shared by book and tests.
export FMLAB_PROGRESS = 0
# One intra-op thread per chapter: the models are small, and the build runs one chapter
# per core, so a second thread would only compete with the other chapter.
export OMP_NUM_THREADS ?= 1
export PYDEVD_DISABLE_FILE_VALIDATION = 1

.PHONY: book test seeds clean chapter pdf lab

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# The downloads and the site are rebuilt only when an input changed since the last build
# (scripts/site_inputs.py: the source tree, the commit, the executed chapters and the
# rest, hashed by content); an unchanged rebuild took 41 s.
book: $(STAMP)
	bash scripts/web_assets.sh
	$(BIN)/python scripts/execute_chapters.py --jobs $(JOBS)
	@if $(BIN)/python scripts/site_inputs.py --check; then \
		echo "make book: the site is up to date with its inputs (scripts/site_inputs.py)"; \
	else \
		$(BIN)/python scripts/build_downloads.py && \
		$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going && \
		$(BIN)/python scripts/site_inputs.py --record; \
	fi
	@echo "The book is in _build/html/index.html"

# The browser test runs at the same time as the others, in a process of its own (its
# report follows theirs): its slow line is shaped by its own server, so a busy core slows
# its pages but cannot stall a navigation.
test: book
	$(BIN)/ruff format --check src tests scripts notebooks book/_ext
	$(BIN)/ruff check src tests scripts notebooks book/_ext
	$(BIN)/python -m pytest tests/book/test_browser.py > _build/browser-test.log 2>&1 & \
	browser=$$!; \
	FMLAB_DRAW=0 $(BIN)/python -m pytest -n $(JOBS) --dist loadfile \
		_build/executed tests --ignore tests/book/test_browser.py \
		--nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
		--durations=15; rest=$$?; \
	wait $$browser; status=$$?; \
	echo "--- the browser test (tests/book/test_browser.py) ---"; \
	cat _build/browser-test.log; \
	test $$rest -eq 0 && test $$status -eq 0

# One chapter alone, into the same execution cache: make chapter CH=04
chapter: $(STAMP)
	$(BIN)/python scripts/execute_chapters.py --jobs 1 --only $(CH)

# The robustness run (not part of test): every chapter at seed offsets 1-4.
seeds: $(STAMP)
	$(BIN)/python scripts/check_seeds.py $(SEEDS_ARGS)

# The whole book as one PDF (not part of test): the single-page HTML build, printed by
# the headless Chromium of the browser test. A later `make book` links it.
pdf: $(STAMP)
	$(BIN)/jupyter-book build . --builder singlehtml
	$(BIN)/python scripts/build_pdf.py

# The executed chapters in JupyterLab (not part of test): baked into _build/lab (glued
# numbers, citations, references and numbering as on the pages; scripts/bake_notebooks.py)
# and rendered by jupyterlab-myst. Needs the chapters executed by `make book`.
LAB := _build/lab
lab: $(STAMP)
	@ls _build/executed/*.ipynb >/dev/null 2>&1 || { \
		echo "make lab: the chapters have not been executed yet (no _build/executed)."; \
		echo "make lab: run \`make book\` first, then \`make lab\`."; exit 1; }
	$(BIN)/python scripts/bake_notebooks.py _build/executed $(LAB) --lab
	env -u FMLAB_PROGRESS -u OMP_NUM_THREADS $(BIN)/jupyter lab --notebook-dir=$(LAB) \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

clean:
	rm -rf _build .jupyter_cache
