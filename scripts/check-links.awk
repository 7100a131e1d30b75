# scripts/check-links.awk: the relative links of Markdown files resolve.
# Run by scripts/check-docs.sh as
#	awk -f scripts/check-links.awk FILE.md...
# from the repository's root. For each link [text](target) outside code
# (fenced blocks and `inline code`), except absolute URLs (scheme:), the
# target's path, relative to the linking file, must exist, and its
# #anchor, if any, must be a heading of the target (or of the file
# itself for a bare #anchor), slugged as GitHub does: lower case, spaces
# to hyphens, punctuation dropped. Prints one line per broken link, as
# FILE:LINE: target: why, and exits 1 if there was one.

# slug turns a heading's text into its anchor.
function slug(h) {
	h = tolower(h)
	gsub(/[^a-z0-9 _-]/, "", h)
	gsub(/ /, "-", h)
	return h
}

# anchors reads file f's headings into the set A[f, anchor], once.
function anchors(f,   line, fence, n, h, seen) {
	if ((f, "") in A) return
	A[f, ""] = 1
	fence = 0
	while ((getline line < f) > 0) {
		if (line ~ /^[ \t]*```/) { fence = !fence; continue }
		if (fence || line !~ /^#+[ \t]/) continue
		h = line
		sub(/^#+[ \t]+/, "", h)
		h = slug(h)
		# GitHub numbers repeated headings: x, x-1, x-2...
		n = seen[h]++
		A[f, n ? h "-" n : h] = 1
	}
	close(f)
}

# dir returns the folder of path p, with a trailing slash ("" for the root).
function dir(p) {
	if (p !~ /\//) return ""
	sub(/[^\/]*$/, "", p)
	return p
}

# norm removes "." and "dir/.." from path p.
function norm(p,   n, parts, out, i, k) {
	n = split(p, parts, "/")
	k = 0
	for (i = 1; i <= n; i++) {
		if (parts[i] == "." || parts[i] == "") continue
		if (parts[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
		out[++k] = parts[i]
	}
	p = ""
	for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
	return p
}

function exists(p,   r) {
	r = (system("test -e '" p "'") == 0)
	return r
}

function check(target,   path, anchor, i, f) {
	if (target ~ /^[a-zA-Z][a-zA-Z0-9+.-]*:/) return # http:, mailto:...
	sub(/[ \t]+"[^"]*"$/, "", target)                # a title
	i = index(target, "#")
	path = i ? substr(target, 1, i - 1) : target
	anchor = i ? substr(target, i + 1) : ""
	f = path == "" ? FILENAME : norm(dir(FILENAME) path)
	if (path != "" && !exists(f)) {
		printf "%s:%d: %s: no such file %s\n", FILENAME, FNR, target, f
		bad = 1
		return
	}
	if (anchor == "") return
	if (f !~ /\.md$/) {
		printf "%s:%d: %s: an anchor into a file that is not Markdown\n", FILENAME, FNR, target
		bad = 1
		return
	}
	anchors(f)
	if (!((f, anchor) in A)) {
		printf "%s:%d: %s: %s has no heading #%s\n", FILENAME, FNR, target, f, anchor
		bad = 1
	}
}

FNR == 1 { fence = 0 }
/^[ \t]*```/ { fence = !fence; next }
fence { next }
{
	line = $0
	gsub(/`[^`]*`/, "", line) # inline code is not a link
	while (match(line, /\]\([^)]*\)/)) {
		check(substr(line, RSTART + 2, RLENGTH - 3))
		line = substr(line, RSTART + RLENGTH)
	}
}
END { exit bad }
