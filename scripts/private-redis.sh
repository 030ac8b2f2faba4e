# Sourced by the scripts that need a private redis-server (test.sh, bench.sh,
# bench/run.sh): it starts one on a free loopback port, with no persistence,
# in a directory the caller owns and removes.
#
#   source scripts/private-redis.sh
#   trap private_redis_stop EXIT
#   private_redis_start "$dir" || exit 1   # sets PRIVATE_REDIS_PORT

PRIVATE_REDIS_PID=
PRIVATE_REDIS_PORT=

# private_redis_start DIR starts redis-server on a free port between 20000 and
# 60000, trying up to 20 ports, and waits (about 10s at most each) until it
# answers PING. On failure it prints the server's last log lines and returns 1.
private_redis_start() {
	local dir=$1 candidate
	for _ in $(seq 20); do
		candidate=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
		if (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
			continue # something listens there
		fi
		redis-server --port "$candidate" --bind 127.0.0.1 --save "" --appendonly no \
			--dir "$dir" >"$dir/redis.log" 2>&1 &
		PRIVATE_REDIS_PID=$!
		for _ in $(seq 100); do # 100 x 0.1s
			if [[ $(redis-cli -h 127.0.0.1 -p "$candidate" ping 2>/dev/null || true) == PONG ]]; then
				PRIVATE_REDIS_PORT=$candidate
				return 0
			fi
			kill -0 "$PRIVATE_REDIS_PID" 2>/dev/null || break # exited: the port was taken meanwhile
			sleep 0.1
		done
		private_redis_stop
	done
	echo "could not start redis-server; last log:" >&2
	tail -n 20 "$dir/redis.log" >&2 || true
	return 1
}

# private_redis_stop stops the server private_redis_start started, if any.
private_redis_stop() {
	if [[ -n $PRIVATE_REDIS_PID ]]; then
		kill "$PRIVATE_REDIS_PID" 2>/dev/null || true
		wait "$PRIVATE_REDIS_PID" 2>/dev/null || true
	fi
	PRIVATE_REDIS_PID=
}
