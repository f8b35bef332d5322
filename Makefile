# Convenience targets; the README's two commands are scripts/run.sh and scripts/test.sh.
# Options for `make bench` go in BENCH_ARGS, e.g.
#   make bench BENCH_ARGS="--duration 30 --rounds 5 --threads 8,32 --table-size 200000"

BENCH_ARGS ?=

.PHONY: run test bench bench-smoke

run:
	scripts/run.sh

test:
	scripts/test.sh

bench:
	python3 bench/bench.py $(BENCH_ARGS)

bench-smoke:
	python3 bench/bench.py --smoke $(BENCH_ARGS)
