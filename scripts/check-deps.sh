#!/usr/bin/env bash
# scripts/check-deps.sh: a service that imports only one backend must not get
# the others' drivers nor the test tools in its go.sum. For each backend it
# makes a throwaway module that imports only that backend (pointed at this
# checkout with replace directives), tidies it and fails if its go.sum names
# a module it must not need. otelmetrics is checked the same way: it must
# pull no driver nor the Prometheus exporter (its go.sum does name the
# OpenTelemetry SDK, which only otelmetrics' own tests import: go mod tidy
# records the checksums of the tests of imported packages; nothing of it is
# compiled into the user's program).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
R=github.com/leaderfeed/leaderfeed
tools='testcontainers|moby|docker|lungo'
# "mongo-driver v" is the deprecated driver v1 (go.mongodb.org/mongo-driver v1.x);
# the v2 module, go.mongodb.org/mongo-driver/v2, is what the mongo backend needs.
declare -A forbidden=(
	[postgres]="mongo-driver|rethinkdb-go|$tools"
	[mongo]="pgx|rethinkdb-go|$tools|mongo-driver v"
	[rethink]="pgx|mongo-driver|$tools"
	[otelmetrics]="pgx|mongo-driver|rethinkdb-go|prometheus|$tools"
)
status=0
for b in postgres mongo rethink otelmetrics; do
	d="$tmp/$b"
	mkdir -p "$d"
	cat >"$d/go.mod" <<MOD
module example.com/uses$b

go 1.26

replace $R => $root
replace $R/$b => $root/$b
MOD
	cat >"$d/main.go" <<SRC
package main

import _ "$R/$b"

func main() {}
SRC
	(cd "$d" && go mod edit -require="$R/$b@v0.0.0-00010101000000-000000000000" -require="$R@v0.0.0-00010101000000-000000000000" && go mod tidy >/dev/null 2>"$d/tidy.log") || {
		echo "check-deps: go mod tidy of a module importing $R/$b failed:"; cat "$d/tidy.log"; status=1; continue
	}
	bad=$(grep -E "${forbidden[$b]}" "$d/go.sum" | awk '{print $1}' | sort -u || true)
	if [ -n "$bad" ]; then
		echo "check-deps: a module importing only $R/$b gets go.sum lines for:"; echo "$bad" | sed 's/^/  /'
		status=1
	else
		echo "check-deps: $R/$b: $(wc -l <"$d/go.sum") go.sum lines, none for ${forbidden[$b]}"
	fi
done
# The root module (heartbeat, base, memory) requires nothing but goleak for
# its tests: no OpenTelemetry, no driver, no command dependency.
extra=$(go mod edit -json go.mod | grep '"Path"' | grep -v -e '"github.com/leaderfeed/leaderfeed' -e '"go.uber.org/goleak"' || true)
if [ -n "$extra" ]; then
	echo "check-deps: the root module requires more than goleak:"; echo "$extra"
	status=1
else
	echo "check-deps: the root module requires only goleak"
fi
exit $status
