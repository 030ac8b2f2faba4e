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

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$bench_dir")

for tool in redis-server redis-cli go; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "httpbench.sh: $tool is not installed (redis-server and redis-cli: apt-get install redis-server redis-tools)" >&2
		exit 1
	fi
done

source "$root/scripts/private-redis.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/httpbench.XXXXXX")
cleanup() {
	private_redis_stop
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Build first: a build error should not leave a server starting for nothing.
if [[ -n ${REQLOCK_REF:-} ]]; then
	commit=$(git -C "$root" rev-parse --verify "${REQLOCK_REF}^{commit}")
	mkdir "$tmp/core"
	git -C "$root" archive "$commit" | tar -x -C "$tmp/core"
	(cd "$tmp/core" && go build -o "$tmp/inventory" ./examples/inventory)
	note="examples/inventory at $commit (clean snapshot of $REQLOCK_REF)"
else
	(cd "$root" && go build -o "$tmp/inventory" ./examples/inventory)
	commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
	changed=$(git -C "$root" status --porcelain -- . ':(exclude)bench' 2>/dev/null | wc -l | tr -d ' ')
	note="examples/inventory from the working tree at $commit, $changed changed or untracked paths outside bench/"
fi
(cd "$bench_dir" && go build -o "$tmp/httpbench" ./cmd/httpbench)
echo "httpbench.sh: $note" >&2

private_redis_start "$tmp"
port=$PRIVATE_REDIS_PORT
echo "httpbench.sh: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port" >&2

"$tmp/httpbench" -redis "127.0.0.1:$port" -inventory "$tmp/inventory" -note "$note" "$@"
