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
	// The events of the nodes are printed by their own goroutines and the
	// demo's steps by the main one, so each stream is checked on its own.
	events := []string{
		`node-\d +elected, term 1 `,
		`unelected from term 1: lease-expired`,
		`elected, term 2 `,
		`unelected from term 2: resigned`,
		`elected, term 3 `,
		`unelected from term 3: stopped`,
	}
	steps := []string{
		`\*\*\* crashes`,
		`\*\*\* took over \S+ after the crash`,
		`\*\*\* resigns`,
		`\*\*\* took over \S+ after the resignation`,
		`\*\*\* stop`,
	}
	for _, want := range [][]string{events, steps} {
		rest := out.String()
		for _, w := range want {
			loc := regexp.MustCompile(w).FindStringIndex(rest)
			if loc == nil {
				t.Fatalf("output lacks %q after the earlier steps:\n%s", w, out.String())
			}
			rest = rest[loc[1]:]
		}
	}
}
