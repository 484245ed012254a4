# make test: what CI runs. It installs redis-server, nginx and HAProxy from
# Debian's packages when they are missing, since the distributed path is
# tested against a real Redis, and the refusals that steer it against real
# rate limiters, and tests every module of the repository: the core with its
# examples, and each module of its own beneath it (bench/, extra/...).
.PHONY: test bench redis-server limiters clients

MODULES := $(sort $(shell find . -name go.mod -not -path './.git/*' -exec dirname {} \;))

# A program built with -race sleeps a second as it exits, so that its other
# goroutines may finish a report (GORACE's atexit_sleep_ms, 1000 by
# default): each test binary, and each process of the fleets the tests
# start, which are copies of their test binary. A race is still reported
# as it is found, and fails its test.
export GORACE ?= atexit_sleep_ms=0

# Every test runs: one whose program (redis-server, nginx...) is missing
# fails, where go test alone skips it (internal/tiers).
export PACE_TEST_ALL = 1

test: redis-server limiters clients
	test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: the files above need formatting"; exit 1; }
	# -p 1: one package at a time. The failover's logic is table-tested on a
	# fake clock, but its end-to-end proofs (the fault fleets, the demo) run
	# up to 9 processes against a real redis-server and assert counts over
	# wall-clock spans; two such packages at once on 2 cores measure each
	# other's load instead. Within a package, the fleets that sleep most of
	# their time run 4 at a time (-parallel 4), and those that use half a
	# core run in pairs (internal/pairs); the rest run alone.
	# go vet builds with -race, so that the tests reuse its builds, and
	# -exec true then builds every test binary without running it, both
	# cores at once, since -p 1 builds one at a time too. Nothing builds
	# beside the tests: even at idle priority, builds on the other core
	# slowed the core's model tests twofold.
	# go test's own vet is off: go vet has run every analyzer on the tests.
	# Two run without the race detector, after: the simulator, whose runs
	# cost four times as much under it (its sweep alone races, over 15
	# seeds of every family), and whose replay needs the goroutines of one
	# instant in their order, which the detector shuffles; and TestFidelity,
	# whose real fleets are held to the simulator's figures for the program
	# users run (the demo's other tests race the same code).
	set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && go vet -race ./... && go test -race -vet=off -exec true ./... >/dev/null && \
		go test -race -vet=off -count=1 -p 1 -parallel 4 -skip '^TestFidelity$$' $$(go list ./... | grep -v /internal/fleetsim$$)); done
	go test -race -vet=off -count=1 -run '^TestSweep$$' ./internal/fleetsim
	go test -vet=off -count=1 ./internal/fleetsim
	cd examples/fleet && go test -vet=off -count=1 -run '^TestFidelity$$' .

# make bench: the benchmarks, each beside its baseline from the same run. The
# core's run on CPU 0 and pin their redis-server to the last CPU, so that
# Redis's time per call is not the benchmark preempting it. Then bench/, a
# module of its own, compares pace with its peers and rewrites BENCHMARKS.md.
bench: redis-server
	$$(command -v taskset >/dev/null && echo taskset -c 0) go test -run '^$$' -bench . -benchtime 2s -count 1 .
	cd bench && go run . -o ../BENCHMARKS.md

redis-server:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$sudo apt-get install -y redis-server redis-tools || { $$sudo apt-get update && $$sudo apt-get install -y redis-server redis-tools; }; \
	}
	@redis-server --version

# The limiters that no one here wrote, which examples/fleet's tests start
# on loopback (internal/limitertest).
limiters:
	@PATH="$$PATH:/usr/sbin"; command -v nginx >/dev/null && command -v haproxy >/dev/null || { \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$sudo apt-get install -y nginx-light haproxy || { $$sudo apt-get update && $$sudo apt-get install -y nginx-light haproxy; }; \
	}
	@PATH="$$PATH:/usr/sbin"; nginx -v && haproxy -v | head -1

# The clients in other languages that cmd/pace's tests of pace serve run:
# Python 3 (its standard library alone) from Debian's packages when it is
# missing, and Node.js with npm, which install the openai package.
clients:
	@command -v python3 >/dev/null || { \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$sudo apt-get install -y python3-minimal || { $$sudo apt-get update && $$sudo apt-get install -y python3-minimal; }; \
	}
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$sudo apt-get install -y nodejs npm || { $$sudo apt-get update && $$sudo apt-get install -y nodejs npm; }; \
	}
	@python3 --version && node --version
