#!/usr/bin/env bash
# Runs httpbench (cmd/httpbench): the example service examples/inventory
# against the same service hand-written with bsm/redislock
# (internal/redislockshop), both on one private redis-server on a free
# loopback port (no persistence, in a temporary directory), which it stops
# afterwards. Arguments go to httpbench, which httpbench.sh gives -redis,
# -inventory and -note itself:
#
#   bench/httpbench.sh                                  # 3 rounds of 5s per service, 50 clients, 1000 SKUs
#   bench/httpbench.sh -duration 10s -rounds 5 -clients 20
#   bench/httpbench.sh -scenario library                # the lock alone: ginlock on rueidis and go-redis, bsm/redislock
#
# By default examples/inventory is built from the working tree (../ of this
# module). REQLOCK_REF=<git ref> builds it from a clean snapshot of that
# commit instead (git archive into the temporary directory), so that a run
# does not depend on uncommitted edits:
#
#   REQLOCK_REF=HEAD bench/httpbench.sh
#
# The baseline does not use reqlock: it is always this module's own code.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup httpbench.sh

# Build first: a build error should not leave a server starting for nothing.
if [[ -n ${REQLOCK_REF:-} ]]; then
	bench_snapshot
	(cd "$tmp/core" && go -C examples/inventory build -o "$tmp/inventory" .)
	note="examples/inventory at $commit (clean snapshot of $REQLOCK_REF)"
else
	(cd "$root" && go -C examples/inventory build -o "$tmp/inventory" .)
	note=$(bench_tree_note examples/inventory)
fi
(cd "$bench_dir" && go build -o "$tmp/httpbench" ./cmd/httpbench)
echo "httpbench.sh: $note" >&2

bench_redis httpbench.sh

"$tmp/httpbench" -redis "127.0.0.1:$port" -inventory "$tmp/inventory" -note "$note" "$@"
