#!/usr/bin/env bash
# Runs every check of the repository against real servers: gofmt, go vet,
# go test -race (extra arguments go to go test), then each fuzz target for
# FUZZTIME (default 10s). scripts/servers.sh installs the servers the tests
# use when they are missing (Debian packages, as root), starts them in
# parallel on free loopback ports, exports their REQLOCK_* addresses and
# stops them on exit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/servers.sh
servers_install
trap servers_stop EXIT
servers_start

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
