package base_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The causes a leader context can end with (context.Cause of
// Event.LeaderCtx, Feed.LeaderContext and Run's fn's ctx) are said in
// three places besides the code: the block of errors.go that declares
// them, the doc comment of Run and docs/USING.md. This test finds the
// causes the code gives, in the source: an Err... identifier passed to a
// function named like cancel (a context.CancelCauseFunc), returned by a
// function named cause, or set as a field named cause. Each place must
// name exactly those, so a cause added without its documentation fails
// here.
func TestDocumentedCausesAreTheCodes(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var code, declared []string
	var runDoc string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				if d.Tok == token.VAR && d.Doc != nil && strings.HasPrefix(d.Doc.Text(), "Causes of the end of a leader context") {
					for _, s := range d.Specs {
						for _, n := range s.(*ast.ValueSpec).Names {
							declared = append(declared, n.Name)
						}
					}
				}
			case *ast.FuncDecl:
				if d.Name.Name == "Run" && d.Recv != nil {
					runDoc = d.Doc.Text()
				}
				if d.Name.Name == "cause" && d.Body != nil {
					ast.Inspect(d.Body, func(n ast.Node) bool {
						if r, ok := n.(*ast.ReturnStmt); ok {
							for _, e := range r.Results {
								code = appendErr(code, e)
							}
						}
						return true
					})
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if strings.Contains(strings.ToLower(calleeName(n.Fun)), "cancel") {
					for _, a := range n.Args {
						code = appendErr(code, a)
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "cause" {
					code = appendErr(code, n.Value)
				}
			}
			return true
		})
	}
	slices.Sort(code)
	code = slices.Compact(code)
	if len(code) < 5 {
		t.Fatalf("found only %v in the code: the search is broken", code)
	}

	using, err := os.ReadFile(filepath.Join("..", "docs", "USING.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, place := range []struct {
		name  string
		names []string
	}{
		{"the var block \"Causes of the end of a leader context\" of errors.go", declared},
		{"Run's doc comment, after \"context.Cause telling why (\"", listAfter(t, runDoc, "context.Cause telling why (")},
		{"docs/USING.md, after \"`context.Cause` says why:\"", listAfter(t, string(using), "`context.Cause` says why:")},
	} {
		got := slices.Clone(place.names)
		slices.Sort(got)
		if !slices.Equal(got, code) {
			t.Errorf("%s names %v; the code gives a leader context the causes %v", place.name, got, code)
		}
	}
}

// appendErr appends e's name if it is an identifier Err....
func appendErr(names []string, e ast.Expr) []string {
	if id, ok := e.(*ast.Ident); ok && strings.HasPrefix(id.Name, "Err") {
		return append(names, id.Name)
	}
	return names
}

// calleeName returns the name of the function a call calls: f or x.f.
func calleeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

var errName = regexp.MustCompile(`\bErr[A-Za-z]+\b`)

// listAfter returns the Err... names between marker in text and the first
// ";" or ")" after it.
func listAfter(t *testing.T, text, marker string) []string {
	t.Helper()
	text = strings.Join(strings.Fields(text), " ") // one line, as the marker
	_, rest, ok := strings.Cut(text, marker)
	if !ok {
		t.Fatalf("%q not found: the list of causes moved; update this test", marker)
	}
	if i := strings.IndexAny(rest, ";)"); i >= 0 {
		rest = rest[:i]
	}
	return errName.FindAllString(rest, -1)
}
