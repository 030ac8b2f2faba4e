#!/usr/bin/env bash
# Runs every check of the repository against real servers: gofmt, the Go
# floor (scripts/gofloor.sh), go vet, go test -race (extra arguments go to
# go test), then each fuzz target for FUZZTIME (default 10s).
# scripts/servers.sh installs the servers the tests use when they are
# missing (Debian packages, as root), starts them in parallel on free
# loopback ports, exports their REQLOCK_* addresses and stops them on exit.
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

# One Go floor: the README's, in every go.mod and kept by go mod tidy in a
# fresh user module of each importable module (issue 20).
echo "test.sh: Go floor"
./scripts/gofloor.sh

# Every Go module of the repository: the root (the core) and the nested ones
# (heavy optional integrations and the benchmarks, each with its own
# go.mod, so that users of the core do not inherit their dependencies).
mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
for m in "${modules[@]}"; do
	echo "test.sh: module $m: go mod tidy -diff, go vet, go test -race"
	(
		cd "$m"
		go mod tidy -diff
		go vet ./...
		go test -race -count=1 "$@" ./...
	)
done

# Allocation counts are exact only without the race detector, whose
# runtime allocates for itself: the pin of what a lock adds to a request
# runs once more without -race.
echo "test.sh: allocations per locked request, without -race"
go test -count=1 -run '^TestAllocsPerLockedRequest$' ./internal/bench

# moduleOf prints the directory of the module that holds directory $1.
moduleOf() {
	local d=$1
	while [[ ! -f $d/go.mod ]]; do
		d=$(dirname "$d")
	done
	echo "$d"
}

fuzztime=${FUZZTIME:-10s}
while IFS=: read -r file name; do
	dir=$(dirname "$file")
	mod=$(moduleOf "$dir")
	rel=${dir#"$mod"}
	rel=${rel#/}
	echo "test.sh: fuzz $name in ./$dir for $fuzztime"
	fuzzOnce() {
		(cd "$mod" && go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" -fuzzminimizetime=2s "./$rel" </dev/null)
	}
	corpus=$dir/testdata/fuzz/$name
	corpusFiles() { ls "$corpus" 2>/dev/null | sort || true; } # none yet: no directory
	before=$(corpusFiles)
	if ! fuzzOnce; then
		# Go's fuzz coordinator can fail a target at the -fuzztime deadline
		# with "context deadline exceeded" and no input (go.dev/issue/75804,
		# fixed in Go 1.27), mostly on a loaded machine. A failure that
		# wrote a reproducer is real; one that wrote none is run once more.
		if [[ $(corpusFiles) != "$before" ]]; then
			echo "test.sh: fuzz $name found a failing input in $corpus" >&2
			exit 1
		fi
		echo "test.sh: fuzz $name failed without a failing input (go.dev/issue/75804); running it once more"
		fuzzOnce
	fi
done < <(grep -rHoE --include='*_test.go' --exclude-dir=testdata --exclude-dir=vendor --exclude-dir=.git \
	'^func Fuzz[A-Za-z0-9_]*' . |
	sed -E 's#^\./##; s#:func #:#' | sort)

echo "test.sh: PASS: gofmt, go vet, go test -race and fuzzing all passed"
