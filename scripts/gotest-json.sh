#!/usr/bin/env bash
# scripts/gotest-json.sh: `go test -json -race` in every module but bench,
# one after the other, for gotestsum --raw-command (scripts/test.sh). Exits 1
# if any module's tests failed, after running them all.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0
for m in $(scripts/modules.sh); do
	[ "$m" = bench ] && continue
	(cd "$m" && go test -json -race -count=1 -timeout 20m "$@" ./...) || failed=1
done
exit "$failed"
