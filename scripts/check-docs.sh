#!/usr/bin/env bash
# scripts/check-docs.sh: every complete program in the docs compiles against
# this checkout. A complete program is a ```go block of README.md or of a
# Markdown file under docs/ whose code starts with `package main` (after
# comments and blank lines); other blocks are fragments and are not checked.
# Each program becomes a package of one throwaway module, pointed at this
# checkout's modules with replace directives (as scripts/check-deps.sh does),
# and one `go build` compiles them all. Each file starts with a //line
# directive, so the compiler names the Markdown file and line; the messages
# of a failing program follow a "# FILE:LINE" header naming its fence.
#
# It also checks that every relative link of the repository's Markdown
# files resolves, to a file and to a heading (scripts/check-links.awk).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# shellcheck disable=SC2046 # file names without spaces, one word each
if ! awk -f scripts/check-links.awk $(git ls-files -- '*.md'); then
	echo "check-docs: a link in the docs leads nowhere (above)"
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
M=example.com/leaderfeeddocs

{
	echo "module $M"
	echo
	echo "go 1.26"
	echo
	for m in $(scripts/modules.sh); do
		echo "replace $(awk '/^module /{print $2}' "$m/go.mod") => $root/$m"
	done
} >"$tmp/go.mod"

# Extract: p<N>/main.go for the Nth program, and "p<N> FILE:LINE" (the line
# of its opening fence) in index. Every fence is followed, so that a ```go
# line inside a block of another language opens nothing. A fence may be
# indented (inside a list); the indentation is removed from the code.
git ls-files -- README.md 'docs/*.md' | xargs awk -v out="$tmp" -v root="$root" '
function emit(   dir, f) {
	n++
	dir = out "/p" n
	system("mkdir -p " dir)
	f = dir "/main.go"
	printf "//line %s/%s:%d\n%s", root, FILENAME, start + 1, code > f
	close(f)
	print "p" n " " FILENAME ":" start > (out "/index")
}
FNR == 1 { inblock = 0 }
!inblock && /^[ \t]*```/ {
	inblock = 1; start = FNR; code = ""
	state = /^[ \t]*```go[ \t]*$/ ? "head" : "other"
	match($0, /^[ \t]*/); indent = RLENGTH
	next
}
inblock && /^[ \t]*```[ \t]*$/ {
	inblock = 0
	if (state == "main") emit()
	next
}
inblock {
	line = $0
	for (i = 0; i < indent && substr(line, 1, 1) ~ /[ \t]/; i++) line = substr(line, 2)
	code = code line "\n"
	if (state == "head" && line !~ /^[ \t]*(\/\/.*)?$/)
		state = (line ~ /^package main([ \t]|\/\/|$)/) ? "main" : "fragment"
}
'
if [ ! -s "$tmp/index" ]; then
	echo "check-docs: found no package main program in README.md nor docs/: the extraction is broken"
	exit 1
fi

# Require every module of the checkout, so that a program's imports of their
# dependencies (pgx, the MongoDB driver...) resolve to the versions they
# require; tidy drops what no program imports.
reqs=()
for m in $(scripts/modules.sh); do
	reqs+=("-require=$(awk '/^module /{print $2}' "$m/go.mod")@v0.0.0-00010101000000-000000000000")
done
# rename turns the packages' import paths into the fences they come from.
rename=$(awk -v M="$M" '{printf "s#%s/%s\\b#%s#g\n", M, $1, $2}' "$tmp/index")
if ! (cd "$tmp" && go mod edit "${reqs[@]}" && GOWORK=off go mod tidy) >"$tmp/log" 2>&1 ||
	! (cd "$tmp" && GOWORK=off go build ./...) >"$tmp/log" 2>&1; then
	echo "check-docs: a program in the docs does not compile:"
	sed -e "$rename" -e "s#$root/##g" "$tmp/log"
	exit 1
fi
echo "check-docs: $(wc -l <"$tmp/index") programs compile: $(cut -d' ' -f2 "$tmp/index" | tr '\n' ' ')"
