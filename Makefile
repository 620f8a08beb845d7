# Each target does its own set-up: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= -m "not slow"

.PHONY: venv test test-all demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement could pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	MOLPREDICT_LOAD_PLUGINS= $(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test-all: PYTEST_ARGS =
test-all: test

# The shared MassBank split and candidate pool when this checkout has them; elsewhere the demo downloads
# MassBank (resumable) and builds a small library from its structures.
SHARED ?= ../shared/data
DEMO_ARGS ?= $(if $(wildcard $(SHARED)/massbank/train_pos.mgf),--data $(SHARED)/massbank \
	--library $(SHARED)/candidates/pool.tsv.gz --val-candidates $(SHARED)/candidates/val_formula256.json \
	--val-candidates $(SHARED)/candidates/val_formula.json \
	--calibration-candidates $(SHARED)/candidates/val_mass.json)

demo: $(STAMP)
	$(PY) -m molpredict.data.demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/engine.py --data $(SHARED)/massbank --out bench-out

clean:
	rm -rf $(VENV) bench-out .pytest_cache
