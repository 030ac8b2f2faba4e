# shellcheck shell=bash
# Sourced by scripts/test.sh: installs the servers the tests run against and
# starts them, in parallel, each on free loopback ports with private data
# under one temporary directory, and stops them all again.
#
#   source scripts/servers.sh
#   servers_install          # one apt-get call for whatever is missing (as root)
#   trap servers_stop EXIT   # stops every server, removes the directory
#   servers_start            # exports the REQLOCK_* variables below
#
# Variables servers_start exports (addresses are host:port on 127.0.0.1):
#
#   REQLOCK_REDIS_ADDR       one Redis
#   REQLOCK_REDIS_NODES      5 independent Redis nodes (Redlock), comma-separated
#   REQLOCK_REDIS_CLUSTER    a Redis Cluster, 3 masters and 3 replicas, comma-separated
#   REQLOCK_SENTINEL_ADDRS   3 Sentinels monitoring 1 master and 1 replica, comma-separated
#   REQLOCK_SENTINEL_MASTER  the name the Sentinels know that master by
#   REQLOCK_ETCD_ENDPOINTS   a single etcd, as a client URL
#   REQLOCK_ETCD_CLUSTER     a 3-member etcd cluster, comma-separated client URLs
#   REQLOCK_ZK_ADDR          a standalone ZooKeeper
#   REQLOCK_MYSQL_DSN        MariaDB: user:pass@tcp(127.0.0.1:port)/reqlock
#   REQLOCK_POSTGRES_DSN     PostgreSQL: postgres://user:pass@127.0.0.1:port/reqlock?sslmode=disable
#
# and, for the same servers, a URL that works verbatim as the -store flag of
# examples/inventory (and as the URL of the store package's Open):
#
#   REQLOCK_STORE_REDIS          redis://127.0.0.1:port/0
#   REQLOCK_STORE_REDLOCK        redlock://host:port,... (the 5 nodes, admitted:
#                                each holds redlockstore.MarkerKey)
#   REQLOCK_STORE_ETCD           etcd://127.0.0.1:port
#   REQLOCK_STORE_ETCD_CLUSTER   etcd://host:port,host:port,host:port
#   REQLOCK_STORE_ZK             zk://127.0.0.1:port
#   REQLOCK_STORE_MYSQL          mysql://user:pass@127.0.0.1:port/reqlock
#   REQLOCK_STORE_POSTGRES       postgres://user:pass@127.0.0.1:port/reqlock?sslmode=disable
#
# Every server's process id goes to $SERVERS_DIR/pids the moment it starts,
# so servers_stop stops them whatever point the start reached, and a
# watchdog stops them too if the shell that sourced this file dies without
# running its EXIT trap (SIGKILL). Ports are drawn at random below the
# kernel's ephemeral range (so no outgoing connection holds one), reserved
# within the run, and a set whose server exits at start (its port was taken
# by another process meanwhile) is started again on new ports. Readiness
# checks also make sure the server that answers is this run's own.
#
# SERVERS_TIMEOUT (default 60) bounds each readiness wait, in seconds.
# REQLOCK_SERVERS_TMPDIR chooses where the directory goes (default /dev/shm
# when writable, so fsync costs nothing, else $TMPDIR or /tmp).

SERVERS_TIMEOUT=${SERVERS_TIMEOUT:-60}
SERVERS_DIR=                       # the run's directory, set by servers_start
SERVERS_SENTINEL_MASTER=reqlock    # the monitored master's name
SERVERS__JOBS=()                   # pids of the start jobs still running
SERVERS__WATCHDOG=
SERVERS__ZK_JARS=/usr/share/java/zookeeper.jar
SERVERS__REDLOCK_MARKER=reqlock:redlock:node # redlockstore.MarkerKey

# The start jobs, ZooKeeper first: the JVM is the slowest to come up.
SERVERS__NAMES=(zookeeper etcd-cluster redis-cluster mariadb postgres sentinel etcd redis-nodes redis)

# servers_install installs, in one apt-get call, the Debian packages of the
# servers and tools that are missing. It needs root for that; otherwise it
# names the missing packages and fails.
servers_install() {
	local missing=()
	servers__find redis-server >/dev/null || missing+=(redis-server)
	servers__find redis-cli >/dev/null || missing+=(redis-tools)
	servers__find redis-sentinel >/dev/null || missing+=(redis-sentinel)
	servers__find etcd >/dev/null || missing+=(etcd-server)
	servers__find etcdctl >/dev/null || missing+=(etcd-client)
	if ! servers__find java >/dev/null || [[ ! -f $SERVERS__ZK_JARS ]]; then
		missing+=(zookeeper)
	fi
	servers__find mariadbd >/dev/null || missing+=(mariadb-server)
	servers__find mariadb >/dev/null || missing+=(mariadb-client)
	servers__find initdb >/dev/null || missing+=(postgresql)
	servers__find setpriv >/dev/null || missing+=(util-linux)
	((${#missing[@]} > 0)) || return 0
	if [[ $(id -u) -ne 0 ]]; then
		echo "servers: missing packages: ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
		return 1
	fi
	echo "servers: installing ${missing[*]}"
	apt-get update -qq || return 1
	# A package's postinst must not start its own daemon (on 6379, 5432,
	# ...): it would outlive this script. policy-rc.d is Debian's switch
	# for that; put one in place only for this install if there is none.
	local policy=/usr/sbin/policy-rc.d added='' rc=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" || rc=$?
	if [[ -n $added ]]; then rm -f "$policy"; fi
	return "$rc"
}

# servers_start starts every server in parallel and waits until all are
# ready, printing one line per server and the total time, then exports the
# REQLOCK_* variables. On failure it prints what went wrong, with the tail
# of the failing server's log, and returns 1; servers_stop cleans up.
servers_start() {
	local t0=$EPOCHREALTIME base name i failed=()
	base=${REQLOCK_SERVERS_TMPDIR:-}
	if [[ -z $base ]]; then
		if [[ -d /dev/shm && -w /dev/shm ]]; then base=/dev/shm; else base=${TMPDIR:-/tmp}; fi
	fi
	SERVERS_DIR=$(mktemp -d "$base/reqlock-servers.XXXXXX") || return 1
	chmod 711 "$SERVERS_DIR" # the postgres user reaches its own directory inside
	mkdir "$SERVERS_DIR/ports" "$SERVERS_DIR/env" "$SERVERS_DIR/out" || return 1
	: >"$SERVERS_DIR/pids"
	servers__watchdog

	SERVERS__JOBS=()
	for name in "${SERVERS__NAMES[@]}"; do
		servers__job "$name" </dev/null >"$SERVERS_DIR/out/$name.log" 2>&1 &
		SERVERS__JOBS+=("$!")
	done
	for i in "${!SERVERS__NAMES[@]}"; do
		wait "${SERVERS__JOBS[$i]}" || failed+=("${SERVERS__NAMES[$i]}")
	done
	SERVERS__JOBS=()
	if ((${#failed[@]} > 0)); then
		for name in "${failed[@]}"; do
			cat "$SERVERS_DIR/out/$name.log" >&2
		done
		echo "servers: could not start: ${failed[*]}" >&2
		return 1
	fi
	for name in "${SERVERS__NAMES[@]}"; do
		# shellcheck disable=SC1090
		source "$SERVERS_DIR/env/$name" || return 1
		cat "$SERVERS_DIR/out/$name.line"
	done
	echo "servers: all ready in $(servers__since "$t0") (in $SERVERS_DIR)"
}

# servers_stop stops every server servers_start started (SIGTERM, or SIGINT
# for PostgreSQL's fast shutdown; SIGKILL for any still running after 15s)
# and removes the directory. It is safe to call at any point, and again.
servers_stop() {
	[[ -n ${SERVERS_DIR:-} ]] || return 0
	local pid
	if [[ -n $SERVERS__WATCHDOG ]]; then kill "$SERVERS__WATCHDOG" 2>/dev/null || true; fi
	for pid in ${SERVERS__JOBS[@]+"${SERVERS__JOBS[@]}"}; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	SERVERS__WATCHDOG=
	SERVERS__JOBS=()
	servers__stop_all "$SERVERS_DIR"
	SERVERS_DIR=
}

# ---------------------------------------------------------------------------
# Helpers shared by the start jobs.

# servers__find NAME prints the path of a program, looking also where Debian
# puts daemons (/usr/sbin) and PostgreSQL (/usr/lib/postgresql/VERSION/bin,
# newest version first).
servers__find() {
	local p
	if p=$(command -v "$1" 2>/dev/null) && [[ -n $p ]]; then
		echo "$p"
		return 0
	fi
	for p in /usr/sbin/"$1" $(printf '%s\n' /usr/lib/postgresql/*/bin/"$1" | sort -rV); do
		if [[ -x $p ]]; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# servers__since T0 prints the time since T0 (an $EPOCHREALTIME) as 1.2s.
servers__since() {
	local now=${EPOCHREALTIME//[.,]/} then=${1//[.,]/} ms
	ms=$(((now - then) / 1000))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# servers__secret prints 16 random hex digits, for passwords: a server
# that accepts this run's password is this run's server.
servers__secret() {
	od -An -N8 -tx1 /dev/urandom | tr -d ' \n'
}

# servers__port prints a free loopback port. It draws at random from below
# the ephemeral range and reserves the port for this run with mkdir, which
# the parallel jobs cannot both win.
servers__port() {
	local lo=20000 hi=32767 eph p
	read -r eph _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph=32768
	if ((eph - 1 < hi)); then hi=$((eph - 1)); fi
	if ((hi - lo < 1000)); then lo=10000; fi
	for _ in $(seq 500); do
		p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
		mkdir "$SERVERS_DIR/ports/$p" 2>/dev/null || continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	echo "servers: no free port found" >&2
	return 1
}

# servers__starttime PID prints the process's start time (in clock ticks
# since boot): with the pid it names one process even after the pid is reused.
servers__starttime() {
	local stat f
	{ read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
	read -ra f <<<"${stat##*) }"
	echo "${f[19]}"
}

# servers__same PID STARTTIME succeeds while that process runs (a zombie
# has ended).
servers__same() {
	local stat f
	{ read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
	read -ra f <<<"${stat##*) }"
	[[ ${f[0]} != Z && ${f[19]} == "$2" ]]
}

# servers__spawn SIGNAL LOG COMMAND... starts COMMAND in the background with
# its output in LOG and records it: in $SERVERS_DIR/pids for servers_stop,
# in the job's attempt for a retry, with SIGNAL as the signal that stops it.
# It sets SERVERS__PID.
servers__spawn() {
	local sig=$1 log=$2 st
	shift 2
	"$@" </dev/null >>"$log" 2>&1 &
	SERVERS__PID=$!
	st=$(servers__starttime "$SERVERS__PID") || st=gone
	echo "$SERVERS__PID $sig $st" >>"$SERVERS_DIR/pids"
	SERVERS__ATTEMPT+=("$SERVERS__PID,$sig,$st,$log")
}

# servers__kill RECORD... stops the recorded processes (pid,signal,start
# time[,log]): the signal, then up to 15s to exit, then SIGKILL.
servers__kill() {
	local rec pid sig st live=()
	for rec; do
		IFS=, read -r pid sig st _ <<<"$rec"
		if servers__same "$pid" "$st"; then
			kill -s "$sig" "$pid" 2>/dev/null || true
			kill -s CONT "$pid" 2>/dev/null || true # a stopped process cannot exit
			live+=("$pid,$st")
		fi
	done
	servers__await_exit 15 ${live[@]+"${live[@]}"} && return 0
	for rec in "${SERVERS__LIVE[@]}"; do
		echo "servers: pid ${rec%,*} ignored its stop signal for 15s; killing it" >&2
		kill -s KILL "${rec%,*}" 2>/dev/null || true
	done
	servers__await_exit 5 "${SERVERS__LIVE[@]}"
}

# servers__await_exit SECONDS PID,STARTTIME... waits until those processes
# have exited, for SECONDS at most; SERVERS__LIVE keeps those that have not.
servers__await_exit() {
	local deadline=$((SECONDS + $1)) rec next
	shift
	SERVERS__LIVE=("$@")
	while ((${#SERVERS__LIVE[@]} > 0)); do
		next=()
		for rec in "${SERVERS__LIVE[@]}"; do
			if servers__same "${rec%,*}" "${rec#*,}"; then next+=("$rec"); fi
		done
		SERVERS__LIVE=(${next[@]+"${next[@]}"})
		((${#SERVERS__LIVE[@]} > 0)) || return 0
		((SECONDS < deadline)) || return 1
		servers__nap
	done
}

# servers__stop_all DIR stops every process recorded in DIR/pids and
# removes DIR.
servers__stop_all() {
	local dir=$1 pid sig st recs=()
	if [[ -f $dir/pids ]]; then
		while read -r pid sig st; do
			recs+=("$pid,$sig,$st")
		done <"$dir/pids"
	fi
	servers__kill ${recs[@]+"${recs[@]}"}
	rm -rf "$dir"
}

# servers__watchdog starts a process that stops every server if the shell
# running this file dies without its EXIT trap (SIGKILL).
servers__watchdog() {
	local owner=$$ dir=$SERVERS_DIR
	(
		trap '' INT HUP
		trap 'exit 0' TERM
		while kill -0 "$owner" 2>/dev/null; do servers__nap 1; done
		servers__stop_all "$dir"
	) </dev/null >/dev/null 2>&1 &
	SERVERS__WATCHDOG=$!
	disown "$SERVERS__WATCHDOG" # so that the caller's bare wait does not wait for it
}

# servers__fail WHAT [REASON [LOG...]] prints why a start failed and the
# last lines of the LOGs or else of the logs of the attempt's servers: those
# that exited, or all of them.
servers__fail() {
	local what=$1 reason=${2:-} rec pid st log dead=() all=()
	shift $(($# < 2 ? $# : 2))
	for rec in ${SERVERS__ATTEMPT[@]+"${SERVERS__ATTEMPT[@]}"}; do
		IFS=, read -r pid _ st log <<<"$rec"
		all+=("$log")
		servers__same "$pid" "$st" || dead+=("$log")
	done
	((${#dead[@]} == 0)) || all=("${dead[@]}")
	(($# == 0)) || all=("$@")
	echo "servers: $SERVERS__JOB: $what${reason:+: $reason}" >&2
	for log in ${all[@]+"${all[@]}"}; do
		echo "--- last lines of $log:" >&2
		tail -n 15 "$log" >&2 2>/dev/null || true
	done
}

# servers__wait WHAT CHECK... polls CHECK (every 50ms) until it succeeds.
# It returns 2 when a server of this attempt exited meanwhile (most likely
# its port was taken: the job retries on new ports) and 1 after
# SERVERS_TIMEOUT seconds, printing the logs' tails either way.
servers__wait() {
	local what=$1 deadline=$((SECONDS + SERVERS_TIMEOUT)) rec pid st
	shift
	while :; do
		if "$@" >/dev/null 2>&1; then
			servers__attempt_alive && return 0
		elif ! servers__attempt_alive; then
			:
		elif ((SECONDS >= deadline)); then
			servers__fail "$what" "not ready after ${SERVERS_TIMEOUT}s"
			return 1
		else
			servers__nap
			continue
		fi
		servers__fail "$what" "a server exited"
		return 2
	done
}

# servers__nap [SECONDS] waits 50ms (or SECONDS) without starting a
# process, as a read that times out on a pipe nobody writes to: polls run
# often, and forks cost CPU the starting servers need.
servers__nap() {
	if [[ -z ${SERVERS__NAP:-} ]]; then exec {SERVERS__NAP}<> <(:); fi
	read -r -t "${1:-0.05}" -u "$SERVERS__NAP" _ || true
}

# servers__attempt_alive succeeds while every server of the attempt runs.
servers__attempt_alive() {
	local rec pid st
	for rec in ${SERVERS__ATTEMPT[@]+"${SERVERS__ATTEMPT[@]}"}; do
		IFS=, read -r pid _ st _ <<<"$rec"
		servers__same "$pid" "$st" || return 1
	done
}

# servers__job NAME runs the start function of one job, up to 3 times while
# a server exits at start, stopping what a failed attempt started. The
# function leaves its variables in $SERVERS_DIR/env/NAME and its line in
# $SERVERS_DIR/out/NAME.line.
servers__job() {
	SERVERS__JOB=$1
	local attempt rc t0=$EPOCHREALTIME
	for attempt in 1 2 3; do
		SERVERS__ATTEMPT=()
		SERVERS__T0=$t0
		"servers__start_${SERVERS__JOB//-/_}" && return 0
		rc=$?
		servers__kill ${SERVERS__ATTEMPT[@]+"${SERVERS__ATTEMPT[@]}"}
		((rc == 2)) || return 1
		echo "servers: $SERVERS__JOB: attempt $attempt failed; starting again on new ports" >&2
	done
	return 1
}

# servers__done ADDR VAR=VALUE... records the job's variables and its line.
servers__done() {
	local addr=$1 kv
	shift
	for kv; do
		printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
	done >"$SERVERS_DIR/env/$SERVERS__JOB"
	printf 'servers: %-14s %s (ready in %s)\n' "$SERVERS__JOB" "$addr" "$(servers__since "$SERVERS__T0")" \
		>"$SERVERS_DIR/out/$SERVERS__JOB.line"
}

# servers__dir NAME makes a fresh directory for one attempt's server.
servers__dir() {
	mktemp -d "$SERVERS_DIR/$1.XXXXXX"
}

# servers__join SEP ITEM... joins items with SEP.
servers__join() {
	local sep=$1 out='' item
	shift
	for item; do out+=${out:+$sep}$item; done
	echo "$out"
}

# ---------------------------------------------------------------------------
# Redis, Redis Cluster and Sentinel.

# servers__redis DIR PORT [CONFIG LINE...] writes DIR/redis.conf (no
# persistence) and starts redis-server with it; SERVERS__PID is its pid.
servers__redis() {
	local dir=$1 port=$2
	shift 2
	{
		printf '%s\n' "port $port" "bind 127.0.0.1" "protected-mode no" "dir \"$dir\"" \
			'save ""' "appendonly no" "daemonize no" 'logfile ""' "repl-diskless-sync-delay 0"
		printf '%s\n' "$@"
	} >"$dir/redis.conf"
	servers__spawn TERM "$dir/redis.log" redis-server "$dir/redis.conf"
}

# servers__redis_query PORT COMMAND sends one inline command to the Redis
# on PORT and sets SERVERS__REPLY to the reply, a status line or a bulk
# string, with \r removed. It fails on an error reply or no reply. It is
# bash alone, starting no process.
servers__redis_query() {
	local LC_ALL=C fd line ok=1
	SERVERS__REPLY=
	exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf '%s\r\n' "$2" >&"$fd"
	if IFS= read -r -t 2 line <&"$fd"; then
		line=${line%$'\r'}
		case $line in
		'$'[0-9]*) IFS= read -r -t 2 -N "${line#?}" SERVERS__REPLY <&"$fd" && ok=0 ;;
		'+'* | ':'*) SERVERS__REPLY=${line#?} && ok=0 ;;
		esac
	fi
	exec {fd}>&-
	SERVERS__REPLY=${SERVERS__REPLY//$'\r'/}
	return "$ok"
}

# servers__redis_is PORT PID succeeds when the Redis answering on PORT is
# process PID: this run's, not another's that took the port.
servers__redis_is() {
	servers__redis_query "$1" "INFO server" && [[ $SERVERS__REPLY == *$'\n'"process_id:$2"$'\n'* ]]
}

# servers__redis_start_ready PORT [CONFIG LINE...] starts a Redis and waits
# until it answers as itself.
servers__redis_start_ready() {
	local port=$1 dir
	shift
	dir=$(servers__dir "redis-$port") || return 1
	servers__redis "$dir" "$port" "$@"
	servers__wait "redis-server on port $port did not answer" servers__redis_is "$port" "$SERVERS__PID"
}

servers__start_redis() {
	local port
	port=$(servers__port) || return 1
	servers__redis_start_ready "$port" || return
	servers__done "127.0.0.1:$port" "REQLOCK_REDIS_ADDR=127.0.0.1:$port" \
		"REQLOCK_STORE_REDIS=redis://127.0.0.1:$port/0"
}

servers__start_redis_nodes() {
	local ports=() addrs=() port i
	for i in 1 2 3 4 5; do
		port=$(servers__port) || return 1
		ports+=("$port")
		addrs+=("127.0.0.1:$port")
		servers__redis "$(servers__dir "node-$port")" "$port" || return 1
		SERVERS__PIDS[port]=$SERVERS__PID
	done
	for port in "${ports[@]}"; do
		servers__wait "Redis node on port $port did not answer" servers__redis_is "$port" "${SERVERS__PIDS[$port]}" || return
	done
	# Admit the new nodes, as redlockstore's documentation tells operators
	# of a new deployment to: else they stay out of quorums for the max TTL.
	for port in "${ports[@]}"; do
		if ! servers__redis_query "$port" "SET $SERVERS__REDLOCK_MARKER 0"; then
			servers__fail "could not admit the Redis node on port $port for Redlock"
			return 1
		fi
	done
	local list
	list=$(servers__join , "${addrs[@]}")
	servers__done "$list" "REQLOCK_REDIS_NODES=$list" "REQLOCK_STORE_REDLOCK=redlock://$list"
}

# servers__cluster_ok PORT... succeeds when every node sees the whole
# cluster healthy (state ok, all slots, all nodes) and every replica's link
# to its master is up.
servers__cluster_ok() {
	local port
	for port; do
		servers__redis_query "$port" "CLUSTER INFO" &&
			[[ $SERVERS__REPLY == *cluster_state:ok* && $SERVERS__REPLY == *cluster_slots_ok:16384* &&
				$SERVERS__REPLY == *"cluster_known_nodes:$#"$'\n'* ]] || return 1
		servers__replica_ok "$port" || return 1
	done
}

servers__start_redis_cluster() {
	local ports=() addrs=() port bus dir i
	for i in 1 2 3 4 5 6; do
		port=$(servers__port) && bus=$(servers__port) || return 1
		dir=$(servers__dir "cluster-$port") || return 1
		ports+=("$port")
		addrs+=("127.0.0.1:$port")
		# The bus port is set too: the default, port+10000, may be taken.
		servers__redis "$dir" "$port" "cluster-enabled yes" "cluster-port $bus" \
			"cluster-config-file \"$dir/nodes.conf\"" "cluster-node-timeout 5000" || return 1
		SERVERS__PIDS[port]=$SERVERS__PID
	done
	for port in "${ports[@]}"; do
		servers__wait "cluster node on port $port did not answer" servers__redis_is "$port" "${SERVERS__PIDS[$port]}" || return
	done
	if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
		>"$SERVERS_DIR/redis-cluster-create.log" 2>&1; then
		servers__fail "redis-cli --cluster create failed" "" "$SERVERS_DIR/redis-cluster-create.log"
		return 1
	fi
	servers__wait "cluster_state:ok not reached on every node" servers__cluster_ok "${ports[@]}" || return
	local list
	list=$(servers__join , "${addrs[@]}")
	servers__done "$list" "REQLOCK_REDIS_CLUSTER=$list"
}

# servers__sentinel_ok PORT MASTER succeeds when the Sentinel on PORT sees
# the master up at port MASTER, its replica, and the 2 other Sentinels.
servers__sentinel_ok() {
	servers__redis_query "$1" "INFO sentinel" &&
		[[ $SERVERS__REPLY == *"name=$SERVERS_SENTINEL_MASTER,status=ok,address=127.0.0.1:$2,slaves=1,sentinels=3"$'\n'* ]]
}

# servers__replica_ok PORT succeeds when the Redis on PORT is a master, or a
# replica whose link to its master is up.
servers__replica_ok() {
	servers__redis_query "$1" "INFO replication" &&
		[[ $SERVERS__REPLY != *role:slave* || $SERVERS__REPLY == *master_link_status:up* ]]
}

servers__start_sentinel() {
	local master replica port dir ports=() addrs=() i
	master=$(servers__port) && replica=$(servers__port) || return 1
	servers__redis_start_ready "$master" || return
	servers__redis_start_ready "$replica" "replicaof 127.0.0.1 $master" || return
	servers__wait "replica on port $replica did not sync with its master" servers__replica_ok "$replica" || return
	for i in 1 2 3; do
		port=$(servers__port) || return 1
		dir=$(servers__dir "sentinel-$port") || return 1
		ports+=("$port")
		addrs+=("127.0.0.1:$port")
		printf '%s\n' "port $port" "bind 127.0.0.1" "dir \"$dir\"" "daemonize no" 'logfile ""' \
			"sentinel monitor $SERVERS_SENTINEL_MASTER 127.0.0.1 $master 2" \
			"sentinel down-after-milliseconds $SERVERS_SENTINEL_MASTER 1000" \
			"sentinel failover-timeout $SERVERS_SENTINEL_MASTER 3000" \
			"sentinel parallel-syncs $SERVERS_SENTINEL_MASTER 1" >"$dir/sentinel.conf"
		servers__spawn TERM "$dir/sentinel.log" redis-sentinel "$dir/sentinel.conf"
		SERVERS__PIDS[port]=$SERVERS__PID
	done
	for port in "${ports[@]}"; do
		servers__wait "Sentinel on port $port did not answer" servers__redis_is "$port" "${SERVERS__PIDS[$port]}" || return
	done
	for port in "${ports[@]}"; do
		servers__wait "Sentinel on port $port did not find the replica and the other Sentinels" \
			servers__sentinel_ok "$port" "$master" || return
	done
	local list
	list=$(servers__join , "${addrs[@]}")
	servers__done "$list master $SERVERS_SENTINEL_MASTER" \
		"REQLOCK_SENTINEL_ADDRS=$list" "REQLOCK_SENTINEL_MASTER=$SERVERS_SENTINEL_MASTER"
}

# ---------------------------------------------------------------------------
# etcd.

# servers__http PORT METHOD PATH [BODY] sends an HTTP/1.0 request to
# 127.0.0.1:PORT and sets SERVERS__REPLY to the whole response (bash alone).
servers__http() {
	local fd body=${4:-}
	SERVERS__REPLY=
	exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf '%s %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s' "$2" "$3" "${#body}" "$body" >&"$fd"
	IFS= read -r -t 2 -d '' SERVERS__REPLY <&"$fd" || true
	exec {fd}>&-
	[[ $SERVERS__REPLY == "HTTP/1."?" 200 "* ]]
}

# servers__etcd_ok PORT NAME succeeds when the etcd member with client port
# PORT is healthy (it has a leader and commits) and is this run's member
# NAME.
servers__etcd_ok() {
	servers__http "$1" GET /health && [[ $SERVERS__REPLY == *'"health":"true"'* ]] &&
		servers__http "$1" POST /v3/cluster/member/list '{}' && [[ $SERVERS__REPLY == *"\"name\":\"$2\""* ]]
}

# servers__etcd_cluster N VAR STOREVAR starts an N-member etcd cluster and
# records its client URLs in VAR, its etcdstore URL in STOREVAR.
servers__etcd_cluster() {
	local n=$1 var=$2 store=$3 token names=() urls=() peers=() initial=() dir i cport pport
	token=reqlock-$(servers__secret)
	for ((i = 1; i <= n; i++)); do
		cport=$(servers__port) && pport=$(servers__port) || return 1
		names+=("$token-$i")
		urls+=("http://127.0.0.1:$cport")
		peers+=("http://127.0.0.1:$pport")
		initial+=("$token-$i=http://127.0.0.1:$pport")
	done
	for ((i = 0; i < n; i++)); do
		dir=$(servers__dir "etcd-$((i + 1))") || return 1
		# SIGKILL: on SIGTERM the members of a cluster stopping together
		# wait seconds for each other, and nothing here needs keeping.
		servers__spawn KILL "$dir/etcd.log" etcd --name "${names[$i]}" --data-dir "$dir/data" \
			--listen-client-urls "${urls[$i]}" --advertise-client-urls "${urls[$i]}" \
			--listen-peer-urls "${peers[$i]}" --initial-advertise-peer-urls "${peers[$i]}" \
			--initial-cluster "$(servers__join , "${initial[@]}")" \
			--initial-cluster-token "$token" --initial-cluster-state new \
			--logger zap --log-outputs stderr
	done
	for ((i = 0; i < n; i++)); do
		servers__wait "etcd member ${urls[$i]} is not healthy" servers__etcd_ok "${urls[$i]##*:}" "${names[$i]}" || return
	done
	local list
	list=$(servers__join , "${urls[@]}")
	servers__done "$list" "$var=$list" "$store=etcd://$(servers__join , "${urls[@]#http://}")"
}

servers__start_etcd() {
	servers__etcd_cluster 1 REQLOCK_ETCD_ENDPOINTS REQLOCK_STORE_ETCD
}

servers__start_etcd_cluster() {
	servers__etcd_cluster 3 REQLOCK_ETCD_CLUSTER REQLOCK_STORE_ETCD_CLUSTER
}

# ---------------------------------------------------------------------------
# ZooKeeper.

# servers__zk PORT WORD sends a four-letter word and sets SERVERS__REPLY to
# the answer (bash alone).
servers__zk() {
	local fd
	SERVERS__REPLY=
	exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf '%s' "$2" >&"$fd"
	IFS= read -r -t 2 -d '' SERVERS__REPLY <&"$fd" || true
	exec {fd}>&-
}

# servers__zk_ok PORT DATADIR succeeds when the ZooKeeper on PORT serves
# and keeps its data in DATADIR (so it is this run's).
servers__zk_ok() {
	servers__zk "$1" ruok && [[ $SERVERS__REPLY == imok ]] &&
		servers__zk "$1" conf && [[ $SERVERS__REPLY == *"dataDir=$2/"* ]]
}

servers__start_zookeeper() {
	local port dir cp
	port=$(servers__port) || return 1
	dir=$(servers__dir zookeeper) || return 1
	mkdir "$dir/data" || return 1
	printf '%s\n' "tickTime=500" "initLimit=10" "syncLimit=5" "maxSessionTimeout=60000" \
		"dataDir=$dir/data" "clientPort=$port" "clientPortAddress=127.0.0.1" \
		"admin.enableServer=false" "4lw.commands.whitelist=ruok,srvr,stat,conf,mntr,isro" >"$dir/zoo.cfg"
	cp=$SERVERS__ZK_JARS # its manifest names the other jars
	if [[ -f /usr/share/java/slf4j-simple.jar ]]; then cp+=:/usr/share/java/slf4j-simple.jar; fi
	# A small heap, serial GC and C1 only: the JVM is up in well under a second.
	servers__spawn TERM "$dir/zookeeper.log" java -Xms16m -Xmx256m -XX:+UseSerialGC \
		-XX:TieredStopAtLevel=1 -Xshare:auto -cp "$cp" -Dzookeeper.log.dir="$dir" \
		-Dorg.slf4j.simpleLogger.defaultLogLevel=info \
		org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg"
	servers__wait "ZooKeeper on port $port did not answer imok" servers__zk_ok "$port" "$dir/data" || return
	servers__done "127.0.0.1:$port" "REQLOCK_ZK_ADDR=127.0.0.1:$port" "REQLOCK_STORE_ZK=zk://127.0.0.1:$port"
}

# ---------------------------------------------------------------------------
# MariaDB and PostgreSQL: a database reqlock owned by a user reqlock with a
# random password.

# servers__socket_then SOCKET COMMAND... runs COMMAND once SOCKET exists.
servers__socket_then() {
	[[ -S $1 ]] && "${@:2}"
}

servers__start_mariadb() {
	local port dir pw mariadbd user=() sql dsn
	port=$(servers__port) || return 1
	dir=$(servers__dir mariadb) || return 1
	pw=$(servers__secret)
	mariadbd=$(servers__find mariadbd) || return 1
	if [[ $(id -u) -eq 0 ]]; then user=(--user=root); fi
	if ! mariadb-install-db --no-defaults "${user[@]}" --datadir="$dir/data" \
		--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
		>"$dir/install.log" 2>&1; then
		servers__fail "mariadb-install-db failed" "" "$dir/install.log"
		return 1
	fi
	servers__spawn TERM "$dir/mariadb.log" "$mariadbd" --no-defaults "${user[@]}" \
		--datadir="$dir/data" --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" \
		--port="$port" --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin \
		--performance-schema=OFF --innodb-buffer-pool-size=64M --innodb-log-file-size=16M \
		--innodb-flush-log-at-trx-commit=2 --innodb-buffer-pool-dump-at-shutdown=0 \
		--innodb-buffer-pool-load-at-startup=0 --max-connections=500
	servers__wait "MariaDB did not answer on its socket" \
		servers__socket_then "$dir/mysqld.sock" mariadb --no-defaults -S "$dir/mysqld.sock" -uroot -e 'select 1' || return
	# root keeps only its socket login; the tests log in over TCP as reqlock.
	sql="CREATE DATABASE reqlock;
		CREATE USER 'reqlock'@'%' IDENTIFIED BY '$pw';
		GRANT ALL ON reqlock.* TO 'reqlock'@'%';
		DELETE FROM mysql.global_priv WHERE User = 'root' AND Host <> 'localhost';
		FLUSH PRIVILEGES;"
	if ! mariadb --no-defaults -S "$dir/mysqld.sock" -uroot -e "$sql" >>"$dir/install.log" 2>&1; then
		servers__fail "could not create the reqlock database and user" "" "$dir/install.log"
		return 1
	fi
	servers__wait "MariaDB did not answer reqlock over TCP on port $port" \
		mariadb --no-defaults -h127.0.0.1 -P"$port" -ureqlock -p"$pw" reqlock -e 'select 1' || return
	dsn="reqlock:$pw@tcp(127.0.0.1:$port)/reqlock"
	servers__done "127.0.0.1:$port" "REQLOCK_MYSQL_DSN=$dsn" \
		"REQLOCK_STORE_MYSQL=mysql://reqlock:$pw@127.0.0.1:$port/reqlock"
}

servers__start_postgres() {
	local port dir pw bin as=() dsn
	port=$(servers__port) || return 1
	dir=$(servers__dir postgres) || return 1
	pw=$(servers__secret)
	bin=$(servers__find initdb) || return 1
	bin=$(dirname "$(readlink -f "$bin")") # where psql and postgres are too
	# PostgreSQL refuses to run as root: run it as the postgres user the
	# package created, with setpriv, which execs (so the pid is the server's).
	if [[ $(id -u) -eq 0 ]]; then
		chown postgres: "$dir" || return 1
		as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
	fi
	printf '%s\n' "$pw" >"$dir/pwfile"
	if ! (cd "$dir" && "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" \
		--auth-local=trust --auth-host=scram-sha-256 --no-sync -E UTF8 --locale=C) \
		>"$dir/initdb.log" 2>&1; then
		servers__fail "initdb failed" "" "$dir/initdb.log"
		return 1
	fi
	rm -f "$dir/pwfile"
	# SIGINT is PostgreSQL's fast shutdown (SIGTERM would wait for clients).
	# shellcheck disable=SC2016 # the inner bash expands them
	servers__spawn INT "$dir/postgres.log" bash -c 'cd "$1" && shift && exec "$@"' _ "$dir" \
		"${as[@]}" "$bin/postgres" -D "$dir/data" -c listen_addresses=127.0.0.1 -p "$port" \
		-c unix_socket_directories="$dir" -c fsync=off -c synchronous_commit=off \
		-c full_page_writes=off -c max_connections=300 -c dynamic_shared_memory_type=mmap
	servers__wait "PostgreSQL did not answer on its socket" \
		servers__socket_then "$dir/.s.PGSQL.$port" "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -Atc 'select 1' || return
	if ! "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
		-c "CREATE ROLE reqlock LOGIN PASSWORD '$pw'" -c "CREATE DATABASE reqlock OWNER reqlock" \
		>>"$dir/initdb.log" 2>&1; then
		servers__fail "could not create the reqlock database and user" "" "$dir/initdb.log"
		return 1
	fi
	dsn="postgres://reqlock:$pw@127.0.0.1:$port/reqlock?sslmode=disable"
	servers__wait "PostgreSQL did not answer reqlock over TCP on port $port" \
		"$bin/psql" "$dsn" -Atc 'select 1' || return
	servers__done "127.0.0.1:$port" "REQLOCK_POSTGRES_DSN=$dsn" "REQLOCK_STORE_POSTGRES=$dsn"
}
