# pgkvx — the two commands a newcomer needs are `make demo` and `make test`.
# Only `make install` writes into the system's PostgreSQL; the demo, the
# tests and the benchmarks install into a private copy (scripts/pgtree).
SYSTEM_PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config

.PHONY: all deps build install demo test unit cluster-start cluster-stop fmt lint bench bench-quick clean

all: build

deps:
	@scripts/bootstrap

build: deps
	cargo build --release

install: deps
	PG_CONFIG=$(SYSTEM_PG_CONFIG) scripts/install

demo: deps
	scripts/install
	scripts/cluster restart
	scripts/demo

test: deps
	scripts/test

unit:
	cargo test --workspace --lib

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
