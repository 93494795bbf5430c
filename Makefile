# pgkvx — the two commands a newcomer needs are `make demo` and `make test`.
# Only `make install` writes into the system's PostgreSQL; the demo, the
# tests and the benchmarks install into a private copy (scripts/pgtree).
# PG=16, 17 or 18 builds for and runs on that major instead of 15 (Debian's);
# `make test` without PG tests every supported major (scripts/test-versions).
SYSTEM_PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PG ?=
export PG

.PHONY: all deps build install demo check test unit cluster-start cluster-stop fmt lint bench bench-quick clean

all: build

deps:
	@scripts/bootstrap

build: deps
	cargo build --release --no-default-features --features pg$${PG:-15}

install: deps
	PG_CONFIG=$(SYSTEM_PG_CONFIG) scripts/install

demo: deps
	scripts/install
	scripts/cluster restart
	scripts/demo

# The two-minute loop: lint, unit, pgrx, regress and isolation on one major
# (PG=15 unless given), on a fresh cluster of its own.
check: deps
	scripts/test --check

test: deps
	@if [ -z "$(PG)" ]; then scripts/test-versions; else scripts/test; fi

unit:
	scripts/test unit

cluster-start:
	scripts/cluster start

cluster-stop:
	scripts/cluster stop

fmt:
	cargo fmt

lint:
	scripts/test lint

bench: deps
	scripts/install
	bench/run

bench-quick: deps
	scripts/install
	bench/run --quick

clean:
	cargo clean
	scripts/cluster destroy
	scripts/pgtree --clean
