#!/usr/bin/env bash
# scripts/modules.sh: print the folder of every Go module of the repository,
# the root first, one a line (found from the go.mod files git knows, so a new
# module needs no list to be edited).
set -euo pipefail
cd "$(dirname "$0")/.."
{
	echo .
	git ls-files --cached --others --exclude-standard '*/go.mod' | xargs -r -n1 dirname | sort
} | awk '!seen[$0]++'
