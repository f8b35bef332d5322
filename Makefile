# Convenience targets; the README's two commands are scripts/run.sh and scripts/test.sh.
# Options for `make bench` go in BENCH_ARGS, e.g.
#   make bench BENCH_ARGS="--duration 30 --rounds 5 --threads 8,32 --table-size 200000"

BENCH_ARGS ?=

# Options for `make soak` (not run in CI) go in SOAK_ARGS, e.g.
#   make soak SOAK_ARGS="--duration 3600 --restart-every 60 --auth passthrough"
SOAK_ARGS ?=

# `make fuzz` runs every fuzz target for FUZZ_SECONDS each (nightly Rust and cargo-fuzz,
# installed on first use); new inputs that raise coverage are added to fuzz/corpus/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS = client_handshake server_packet response_stream request_stream compressed sql rw digest proxy_header

.PHONY: run test bench bench-smoke soak fuzz pgo

run:
	scripts/run.sh

test:
	scripts/test.sh

bench:
	python3 bench/bench.py $(BENCH_ARGS)

bench-smoke:
	python3 bench/bench.py --smoke $(BENCH_ARGS)

# A profile-guided build of sluice: target/pgo/release/sluice (`make bench BENCH_ARGS=--pgo`
# measures it beside the plain build in the floor and tidb suites).
pgo:
	scripts/pgo.sh

soak:
	python3 bench/soak.py $(SOAK_ARGS)

fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		cargo +nightly fuzz run $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -max_len=65536 || exit 1; \
	done
