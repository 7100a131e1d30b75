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
# files resolves, to a file and to a heading (scripts/check-links.awk), and
# that the excerpts of code files the docs quote (docs/EXTENDING.md's
# walk-through) are in those files word for word (below).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck disable=SC2046 # file names without spaces, one word each
if ! awk -f scripts/check-links.awk $(git ls-files -- '*.md'); then
	echo "check-docs: a link in the docs leads nowhere (above)"
	exit 1
fi

# Excerpts: a ```go block right after a line <!-- excerpt: PATH --> quotes
# the file PATH of this checkout (relative to the root), word for word;
# the excerpts of one file come in its order. The docs quote the code
# rather than copy it, so the code is said once: the files quoted are
# gofmt-clean and their packages, tests included, pass go vet.
git ls-files -- README.md 'docs/*.md' | xargs awk -v out="$tmp" '
FNR == 1 { want = ""; inblock = 0 }
inblock && /^```[ \t]*$/ { inblock = 0; close(f); next }
inblock { print > f; next }
/^<!-- excerpt: [^ ]+ -->$/ { want = $3; next }
want != "" && /^```go[ \t]*$/ {
	n++; f = out "/e" n
	printf "" > f
	print "e" n " " want " " FILENAME ":" FNR > (out "/excerpts")
	inblock = 1; want = ""; next
}
{ want = "" }
'
if [ -s "$tmp/excerpts" ]; then
	declare -A rest=()
	files=()
	while read -r e path at; do
		if [ ! -f "$path" ]; then
			echo "check-docs: $at: the excerpt quotes $path, which does not exist"
			exit 1
		fi
		if [ -z "${rest[$path]+set}" ]; then
			rest[$path]=$(cat "$path")
			files+=("$path")
		fi
		block=$(cat "$tmp/$e")
		if [[ ${rest[$path]} != *"$block"* ]]; then
			echo "check-docs: $at: the excerpt is not in $path word for word, or comes out of its order; quote the file as it is"
			i=0
			while IFS= read -r line; do
				i=$((i + 1))
				if ! grep -qxF -- "$line" "$path"; then
					echo "  line $i of the excerpt is nowhere in the file: $line"
					break
				fi
			done <"$tmp/$e"
			exit 1
		fi
		rest[$path]=${rest[$path]#*"$block"}
	done <"$tmp/excerpts"
	if unformatted=$(gofmt -l "${files[@]}") && [ -n "$unformatted" ]; then
		echo "check-docs: files quoted by the docs are not gofmt-clean: $unformatted"
		exit 1
	fi
	for d in $(dirname "${files[@]}" | sort -u); do
		if ! (cd "$d" && go vet . >"$tmp/vet.log" 2>&1); then
			echo "check-docs: $d, quoted by the docs, does not pass go vet:"
			cat "$tmp/vet.log"
			exit 1
		fi
	done
	echo "check-docs: $(wc -l <"$tmp/excerpts") excerpts quote ${files[*]} word for word; gofmt and vet clean"
fi
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
