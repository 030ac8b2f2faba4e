# Shared by bench/run.sh and bench/httpbench.sh (sourced, not run): the
# checks, the temporary directory, the private redis-server and the reqlock
# snapshot they both need. Each function takes the calling script's name for
# its messages.

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$bench_dir")

# bench_setup checks the tools, makes $tmp, and stops the private Redis and
# removes $tmp on exit.
bench_setup() {
	local name=$1 tool
	for tool in redis-server redis-cli go; do
		if ! command -v "$tool" >/dev/null 2>&1; then
			echo "$name: $tool is not installed (redis-server and redis-cli: apt-get install redis-server redis-tools)" >&2
			exit 1
		fi
	done
	source "$root/scripts/private-redis.sh"
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
	trap 'private_redis_stop; rm -rf "$tmp"' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# bench_snapshot extracts the commit REQLOCK_REF names into $tmp/core and
# sets commit to it.
bench_snapshot() {
	commit=$(git -C "$root" rev-parse --verify "${REQLOCK_REF}^{commit}")
	mkdir "$tmp/core"
	git -C "$root" archive "$commit" | tar -x -C "$tmp/core"
}

# bench_tree_note prints what a build from the working tree measures.
bench_tree_note() {
	local what=$1 head changed
	head=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
	changed=$(git -C "$root" status --porcelain -- . ':(exclude)bench' 2>/dev/null | wc -l | tr -d ' ')
	echo "$what from the working tree at $head, $changed changed or untracked paths outside bench/"
}

# bench_redis starts the private redis-server, sets port, and says so.
bench_redis() {
	local name=$1
	private_redis_start "$tmp"
	port=$PRIVATE_REDIS_PORT
	echo "$name: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port" >&2
}
