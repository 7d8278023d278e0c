# gpuops — the two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv when missing, install the package with its test extras, and install the
# Debian packages prometheus, prometheus-alertmanager, curl, victoria-metrics, slurm-wlm and
# munge when their binaries are missing, chromium (the console's browser tests drive it with
# Playwright; no browser is downloaded) and postgresql (the HA tests run a real PostgreSQL: its
# initdb and postgres live in /usr/lib/postgresql/VERSION/bin, found there by tests/postgres.py).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DURATION ?= 180
PYTEST_ARGS ?=
# pytest runs in 3 worker processes (pytest-xdist), one test file per worker at a time, the
# longest files first (tests/conftest.py): the suite mostly waits on Prometheus, Slurm, the
# browser and subprocesses. Then the tests marked serial (timing bounds that a loaded machine
# breaks), in one process. PYTEST_WORKERS=0 runs the first part in one process too (-s, pdb).
PYTEST_WORKERS ?= 3

.PHONY: demo demo-slurm test setup lint types contracts pytest bench clean postgresql

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

/usr/bin/prometheus /usr/bin/promtool /usr/bin/prometheus-alertmanager:
	@echo "installing Debian packages prometheus and prometheus-alertmanager"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager

# curl: the README's commands use it, and tests/integration/test_readme_commands.py runs them
/usr/bin/curl:
	@echo "installing Debian package curl"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl

/usr/bin/chromium:
	@echo "installing Debian package chromium (for the console's browser tests)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

# victoria-metrics: tests/integration/sources/test_victoriametrics.py runs the shipped policy
# tests on it
/usr/bin/victoria-metrics:
	@echo "installing Debian package victoria-metrics"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics

/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged:
	@echo "installing Debian packages slurm-wlm and munge"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge

# slurmdbd and mariadb-server: tests/integration/slurm/test_slurm_accounting.py runs Slurm's
# accounting (slurmdbd on a MariaDB of its own) and reads the jobs back with sacct
/usr/sbin/slurmdbd /usr/sbin/mariadbd:
	@echo "installing Debian packages slurmdbd and mariadb-server"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmdbd mariadb-server

# postgresql: the binaries' directory has the major version in it, so the check is a glob
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing Debian package postgresql"; \
	  apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; }

setup: $(VENV)/.installed /usr/bin/prometheus /usr/bin/promtool /usr/bin/prometheus-alertmanager \
	/usr/bin/curl /usr/bin/chromium /usr/bin/victoria-metrics /usr/sbin/slurmctld /usr/sbin/slurmd \
	/usr/sbin/munged /usr/sbin/slurmdbd /usr/sbin/mariadbd postgresql

demo: setup
	$(BIN)/gpuops demo --duration $(DURATION)

demo-slurm: setup
	$(BIN)/gpuops demo --slurm

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the package (strict, pyproject's [tool.mypy]), then what the tests build an engine with: the
# builder, the fakes (each satisfies the Protocol it stands in for) and the unit tests' tripwire
types: setup
	$(BIN)/mypy
	$(BIN)/mypy tests/builders.py tests/fakes tests/unit/conftest.py

contracts: setup
	$(BIN)/lint-imports

pytest: setup
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" $(PYTEST_ARGS)
	$(BIN)/pytest -q -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: no serial test selected

test: lint types contracts pytest

bench: setup
	$(BIN)/python -m tests.benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
