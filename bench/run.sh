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

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$bench_dir")

for tool in redis-server redis-cli go; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "run.sh: $tool is not installed (redis-server and redis-cli: apt-get install redis-server redis-tools)" >&2
		exit 1
	fi
done

source "$root/scripts/private-redis.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockbench.XXXXXX")
cleanup() {
	private_redis_stop
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build first: a build error should not leave a server starting for nothing.
# The builds run in subshells in bench/, lockbench in the caller's directory
# (so a relative -json path is relative to where run.sh was called).
if [[ -n ${REQLOCK_REF:-} ]]; then
	commit=$(git -C "$root" rev-parse --verify "${REQLOCK_REF}^{commit}")
	mkdir "$tmp/core"
	git -C "$root" archive "$commit" | tar -x -C "$tmp/core"
	cp "$bench_dir/go.mod" "$tmp/go.mod"
	cp "$bench_dir/go.sum" "$tmp/go.sum"
	(
		cd "$bench_dir"
		go mod edit -modfile="$tmp/go.mod" -replace "github.com/reqlock/reqlock=$tmp/core"
		# -mod=mod lets the build add go.sum lines the snapshot needs, to the copies only.
		go build -mod=mod -modfile="$tmp/go.mod" -o "$tmp/lockbench" ./cmd/lockbench
	)
	note="reqlock at $commit (clean snapshot of $REQLOCK_REF)"
else
	(cd "$bench_dir" && go build -o "$tmp/lockbench" ./cmd/lockbench)
	commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
	changed=$(git -C "$root" status --porcelain -- . ':(exclude)bench' 2>/dev/null | wc -l | tr -d ' ')
	note="reqlock from the working tree at $commit, $changed changed or untracked paths outside bench/"
fi
echo "run.sh: $note" >&2

private_redis_start "$tmp"
port=$PRIVATE_REDIS_PORT
echo "run.sh: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port" >&2

"$tmp/lockbench" -redis "127.0.0.1:$port" -note "$note" -charts "$bench_dir/charts" "$@"
