package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExtendingMatchesCode checks that the code blocks of the walk-through
// in docs/EXTENDING.md, put together, are exactly the files of
// examples/custombackend/logstore, so that a reader who copies them gets the
// code that passes the conformance suite here.
func TestExtendingMatchesCode(t *testing.T) {
	doc, err := os.Open(filepath.Join("..", "..", "docs", "EXTENDING.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer doc.Close()
	files := map[string][]string{} // file -> its blocks, in order
	var file string                // the file the next block belongs to
	var block []string
	inBlock := false
	sc := bufio.NewScanner(doc)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inBlock && line == "```":
			files[file] = append(files[file], strings.Join(block, "\n"))
			inBlock, file, block = false, "", nil
		case inBlock:
			block = append(block, line)
		case strings.HasPrefix(line, "<!-- file: "):
			file = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- file: "), " -->")
		case file != "" && line == "```go":
			inBlock = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"logstore/logstore.go", "logstore/logstore_test.go"} {
		blocks, ok := files[name]
		if !ok {
			t.Errorf("docs/EXTENDING.md has no blocks of %s", name)
			continue
		}
		data, err := os.ReadFile(filepath.FromSlash(name))
		if err != nil {
			t.Fatal(err)
		}
		// The walk-through's module is example.com/logfeed.
		want := strings.ReplaceAll(string(data), "github.com/leaderfeed/leaderfeed/examples/custombackend/", "example.com/logfeed/")
		got := strings.Join(blocks, "\n\n") + "\n"
		if got != want {
			t.Errorf("the blocks of %s in docs/EXTENDING.md differ from the file; make them match:\n%s", name, firstDiff(got, want))
		}
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  doc:  %s\n  file: %s", i+1, gl, wl)
		}
	}
	return ""
}
