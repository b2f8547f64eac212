# Set-up and tests on a fresh machine; `make test` is what .ci/run calls.
PYTHON ?= python3
VENV ?= .venv

.PHONY: install test

install:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt torch==2.13.0 -e '.[test]'

test: install
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile
