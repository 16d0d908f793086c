# The two commands of the README. Each creates .venv and installs into it when missing.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3

.PHONY: reproduce test bench stress lint notebooks-sync clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

## make reproduce: every experiment behind the README's figures and figures/results.md
reproduce: $(STAMP)
	$(PY) -m diloco_lite reproduce

## make test: lint, unit tests, and every notebook executed in quick mode
test: $(STAMP)
	$(VENV)/bin/ruff check diloco_lite tests notebooks/*.py
	$(PY) -m pytest -q tests
	DILOCO_LITE_QUICK=1 $(PY) -m pytest -q --nbmake --nbmake-timeout=900 notebooks

## make bench: speed against a minimal hand-written JAX loop (ratios, tokens/s, FLOP/s)
bench: $(STAMP)
	$(PY) -m diloco_lite bench

## make stress: several trainings at once on this machine, 3 rounds; counts the runs that finish
stress: $(STAMP)
	$(PY) -m diloco_lite bench --stress

## make notebooks-sync: regenerate every .ipynb (outputs stripped) from its .py source of truth
notebooks-sync: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb notebooks/*.py

clean:
	rm -rf $(VENV) data/cache runs
