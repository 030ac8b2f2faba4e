#!/usr/bin/env bash
# Checks the repository's one Go floor (issue 20): the README states it once
# ("Requires Go X.Y or later"), every go.mod's go line is exactly X.Y.0, and
# `go mod tidy` in a fresh user module whose go line is the floor keeps it
# (no raise, no toolchain line) for the core and for each nested module a
# user imports (every module except the benchmarks and the examples). Each
# user module requires one of those modules through a replace to this
# checkout, imports all its non-internal packages (and go-redis for the
# core, as the README's quick start does) and resolves everything else
# through GOPROXY into the shared module cache. Bounded by GOFLOOR_TIMEOUT
# (default 300s) in total.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

fail() {
	echo "gofloor.sh: FAIL: $*" >&2
	exit 1
}

mapfile -t stated < <(grep -oE '^Requires Go [0-9]+\.[0-9]+ or later' README.md || true)
[[ ${#stated[@]} -eq 1 ]] ||
	fail "README.md must state the Go floor once, in a line starting 'Requires Go X.Y or later'; found ${#stated[@]}"
floor=$(sed -E 's/^Requires Go ([0-9.]+) or later/\1/' <<<"${stated[0]}")
want="go $floor.0"
echo "gofloor.sh: the README's floor is Go $floor: every go line must be '$want'"

mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
bad=()
for m in "${modules[@]}"; do
	got=$(grep -E '^go ' "$m/go.mod" || true)
	[[ $got == "$want" ]] || bad+=("$m/go.mod has '$got'")
	if grep -qE '^toolchain ' "$m/go.mod"; then
		bad+=("$m/go.mod has a toolchain line (a user's go command ignores it)")
	fi
done
if [[ ${#bad[@]} -gt 0 ]]; then
	printf '  %s\n' "${bad[@]}" >&2
	fail "go.mod go lines differ from the README's floor '$want'"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GOWORK=off
# -mod=mod only in the user modules: in the checkout, go list must not
# rewrite a go.mod (it would raise the very go line under test).
usermod="${GOFLAGS:+$GOFLAGS }-mod=mod"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly"
deadline=$((SECONDS + ${GOFLOOR_TIMEOUT:-300}))
core=$(cd "$root" && go list -m)
for m in "${modules[@]}"; do
	case $m in */bench | */bench/* | ./examples*) continue ;; esac
	mod=$(cd "$m" && go list -m)
	# Packages a user can import: not internal, not a command.
	if ! listed=$(cd "$m" && go list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./... 2>"$tmp/list.err"); then
		cat "$tmp/list.err" >&2
		fail "go list ./... failed in $m (run go mod tidy there)"
	fi
	mapfile -t pkgs < <(grep -v -e '^$' -e '/internal\(/\|$\)' <<<"$listed" || true)
	((${#pkgs[@]} > 0)) || fail "$m has no package a user can import"
	[[ $mod == "$core" ]] && pkgs+=(github.com/redis/go-redis/v9)
	user=$tmp/user${m//\//_}
	mkdir -p "$user"
	{
		echo "module example.com/user"
		echo
		echo "$want"
	} >"$user/go.mod"
	{
		echo "package user"
		echo
		echo "import ("
		printf '\t_ "%s"\n' "${pkgs[@]}"
		echo ")"
	} >"$user/user.go"
	args=(-require="$mod@v0.0.0-00010101000000-000000000000" -replace="$core=$root")
	[[ $mod == "$core" ]] || args+=(-replace="$mod=$root/${m#./}")
	(cd "$user" && GOFLAGS=$usermod go mod edit "${args[@]}")
	left=$((deadline - SECONDS))
	((left > 0)) || fail "out of time (GOFLOOR_TIMEOUT) before checking $mod"
	if ! out=$(cd "$user" && GOFLAGS=$usermod timeout "$left" go mod tidy 2>&1); then
		echo "$out" >&2
		sed 's/^/  go.mod: /' "$user/go.mod" >&2
		fail "go mod tidy failed in a fresh user module of $mod (output and go.mod above)"
	fi
	got=$(grep -E '^go ' "$user/go.mod" || true)
	tc=$(grep -E '^toolchain ' "$user/go.mod" || true)
	if [[ $got != "$want" || -n $tc ]]; then
		# Name the modules of the user's build list that need more than the floor.
		(cd "$user" && GOFLAGS=$usermod go list -m -f '{{if and .GoVersion (not .Main)}}{{.GoVersion}} {{.Path}} {{.Version}}{{end}}' all |
			awk -v f="$floor" '{ split($1, a, "."); split(f, b, "."); if (a[1] > b[1] || (a[1] == b[1] && a[2] > b[2])) print "  needs go " $0 }') >&2 || true
		fail "go mod tidy in a fresh user module of $mod raised its go line from '$want' to '$got'${tc:+ and added '$tc'}"
	fi
	echo "gofloor.sh: $mod: go mod tidy keeps '$want' (imports: ${#pkgs[@]} packages)"
done
echo "gofloor.sh: PASS: one Go floor ($floor) in README.md, every go.mod and every fresh user module"
