# The lock module: build, run and test. `make help` lists the targets.

SHELL := /bin/bash
MODULE := target/release/libredislock.so
# Root installs directly; anyone else through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
APT_PACKAGES := redis-server redis-tools clang libclang-dev

.PHONY: help deps build run test unit integration lint clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what is missing: Debian's redis-server, clang/libclang-dev (bindgen)
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }

build: deps ## Build the module in release mode (target/release/libredislock.so)
	cargo build --release

run: build ## Build, then start redis-server (port 6390, loopback) with the module loaded
	redis-server redis.conf

test: build ## Run every test: unit tests of the core, then integration tests on real servers
	LOCK_MODULE=$(CURDIR)/$(MODULE) cargo test --release -- --test-threads=4

unit: ## Unit tests of the pure core only (no Redis needed)
	cargo test --release --lib

integration: build ## Integration tests only (real redis-server processes)
	LOCK_MODULE=$(CURDIR)/$(MODULE) cargo test --release --test integration -- --test-threads=4

lint: ## rustfmt and clippy, as before every commit
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings

clean: ## Remove build output and local data files
	cargo clean
	rm -rf dump.rdb appendonlydir
