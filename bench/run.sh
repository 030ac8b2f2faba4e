#!/usr/bin/env bash
# Runs lockbench against a private redis-server on a free loopback port (no
# persistence, in a temporary directory) and stops the server afterwards.
# Arguments go to lockbench, which run.sh gives -redis and -note itself, and
# -charts bench/charts (a wait-distribution chart per workload run,
# bench/charts/wait-<workload>.svg; a -charts of your own overrides it, and
# -charts '' writes none):
#
#   bench/run.sh                                  # every workload and library, 10s each
#   bench/run.sh -duration 10s -json results.json
#   bench/run.sh -workload hot -lib reqlock,redislock -charts ''
#
# By default reqlock is built from the working tree (../ of this module).
# REQLOCK_REF=<git ref> builds it from a clean snapshot of that commit instead
# (git archive into the temporary directory), so that a run does not depend on
# uncommitted edits:
#
#   REQLOCK_REF=HEAD bench/run.sh -duration 10s
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_setup run.sh

# Build first: a build error should not leave a server starting for nothing.
# The builds run in subshells in bench/, lockbench in the caller's directory
# (so a relative -json path is relative to where run.sh was called).
if [[ -n ${REQLOCK_REF:-} ]]; then
	bench_snapshot
	cp "$bench_dir/go.mod" "$tmp/go.mod"
	cp "$bench_dir/go.sum" "$tmp/go.sum"
	(
		cd "$bench_dir"
		go mod edit -modfile="$tmp/go.mod" -replace "github.com/reqlock/reqlock=$tmp/core" \
			-replace "github.com/reqlock/reqlock/stores/redisstore/rueidisstore=$tmp/core/stores/redisstore/rueidisstore"
		# -mod=mod lets the build add go.sum lines the snapshot needs, to the copies only.
		go build -mod=mod -modfile="$tmp/go.mod" -o "$tmp/lockbench" ./cmd/lockbench
	)
	note="reqlock at $commit (clean snapshot of $REQLOCK_REF)"
else
	(cd "$bench_dir" && go build -o "$tmp/lockbench" ./cmd/lockbench)
	note=$(bench_tree_note reqlock)
fi
echo "run.sh: $note" >&2

bench_redis run.sh

"$tmp/lockbench" -redis "127.0.0.1:$port" -note "$note" -charts "$bench_dir/charts" "$@"
