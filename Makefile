# pgkvx — the two commands a newcomer needs are `make demo` and `make test`.
PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
export PG_CONFIG

.PHONY: all deps build install demo test unit cluster-start cluster-stop fmt lint bench bench-quick clean

all: build

deps:
	@scripts/bootstrap

build: deps
	cargo build --release

install: deps
	scripts/install

demo: install
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

bench: install
	bench/run

bench-quick: install
	bench/run --quick

clean:
	cargo clean
	scripts/cluster destroy
