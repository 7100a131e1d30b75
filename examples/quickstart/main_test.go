package main

import (
	"bytes"
	"regexp"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo must show an election, a failover after the crash, a handover
// after the resignation, and a clean stop, in that order.
func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := []string{
		`node-\d +elected, term 1 `,
		`\*\*\* crashes`,
		`unelected from term 1: lease-expired`,
		`elected, term 2 `,
		`\*\*\* took over \S+ after the crash`,
		`\*\*\* resigns`,
		`unelected from term 2: resigned`,
		`elected, term 3 `,
		`\*\*\* took over \S+ after the resignation`,
		`unelected from term 3: stopped`,
	}
	rest := out.String()
	for _, w := range want {
		loc := regexp.MustCompile(w).FindStringIndex(rest)
		if loc == nil {
			t.Fatalf("output lacks %q after the earlier steps:\n%s", w, out.String())
		}
		rest = rest[loc[1]:]
	}
}
