#!/usr/bin/env bash
# scripts/gotest-json.sh: `go test -json -race` in every module but bench,
# for gotestsum --raw-command (scripts/test.sh). Exits 1 if any module's
# tests failed, after running them all.
#
# Two lanes run side by side: the modules whose tests mostly wait on other
# processes and containers (integration, containertest) in one, every other
# module in the other, one module after another. The second lane's output
# goes to a file and follows the first's, so that no two writers share
# gotestsum's input. LEADERFEED_TEST_LANES=1 runs everything in one lane.
set -uo pipefail
cd "$(dirname "$0")/.."

# run MODULE [go test flags...] tests one module.
run() {
	local m=$1
	shift
	(cd "$m" && go test -json -race -count=1 -timeout 20m "$@" ./...)
}

slow=(integration containertest)
failed=0
lane2_out=""
lane2_pid=""
if [ "${LEADERFEED_TEST_LANES:-2}" != 1 ]; then
	mkdir -p .ci/tmp
	lane2_out=$(mktemp .ci/tmp/lane2.XXXXXX.json)
	(
		status=0
		for m in "${slow[@]}"; do
			[ -f "$m/go.mod" ] || continue
			run "$m" "$@" || status=1
		done
		exit "$status"
	) >"$lane2_out" 2>&1 &
	lane2_pid=$!
fi
for m in $(scripts/modules.sh); do
	[ "$m" = bench ] && continue
	if [ -n "$lane2_pid" ] && [[ " ${slow[*]} " == *" $m "* ]]; then
		continue
	fi
	run "$m" "$@" || failed=1
done
if [ -n "$lane2_pid" ]; then
	wait "$lane2_pid" || failed=1
	cat "$lane2_out"
	rm -f "$lane2_out"
fi
exit "$failed"
