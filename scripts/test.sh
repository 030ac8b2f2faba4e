#!/usr/bin/env bash
# Runs every check of the repository against a real Redis: gofmt, go vet,
# go test -race (extra arguments go to go test), then each fuzz target for
# FUZZTIME (default 10s). Installs redis-server when missing and running as
# root; starts a private one on a free loopback port and stops it on exit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]]; then
		echo "test.sh: installing redis-server and redis-cli"
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server redis-tools
	else
		echo "test.sh: redis-server or redis-cli is not installed; install them (apt-get install redis-server redis-tools) or run as root" >&2
		exit 1
	fi
fi

source scripts/private-redis.sh
redis_dir=$(mktemp -d "${TMPDIR:-/tmp}/reqlock-test-redis.XXXXXX")
cleanup() {
	private_redis_stop
	rm -rf "$redis_dir"
}
trap cleanup EXIT
private_redis_start "$redis_dir"
port=$PRIVATE_REDIS_PORT
export REQLOCK_REDIS_ADDR=127.0.0.1:$port
echo "test.sh: redis-server on $REQLOCK_REDIS_ADDR"

echo "test.sh: gofmt"
unformatted=$(gofmt -l .)
if [[ -n $unformatted ]]; then
	echo "test.sh: gofmt would change these files:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "test.sh: go mod tidy -diff"
go mod tidy -diff

echo "test.sh: go vet"
go vet ./...

echo "test.sh: go test -race"
go test -race -count=1 "$@" ./...

echo "test.sh: bench module (lockbench against bsm/redislock and redsync): go vet, go test -race"
(cd bench && go vet ./... && go test -race -count=1 ./...)

echo "test.sh: metrics/prometheus module (Prometheus adapter): go mod tidy -diff, go vet, go test -race"
(
	cd metrics/prometheus
	go mod tidy -diff
	go vet ./...
	go test -race -count=1 ./...
)

fuzztime=${FUZZTIME:-10s}
while IFS=: read -r file name; do
	dir=$(dirname "$file")
	echo "test.sh: fuzz $name in ./$dir for $fuzztime"
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" -fuzzminimizetime=2s "./$dir" </dev/null
done < <(grep -rHoE --include='*_test.go' --exclude-dir=testdata --exclude-dir=vendor --exclude-dir=.git \
	'^func Fuzz[A-Za-z0-9_]*' . |
	sed -E 's#^\./##; s#:func #:#' | sort)

echo "test.sh: PASS: gofmt, go vet, go test -race and fuzzing all passed"
