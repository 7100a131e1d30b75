package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo must show an election, a failover after the crash, a handover
// after the resignation, and a clean stop, in that order.
func TestQuickstart(t *testing.T) {
	// Under synctest: the demo's timings are exact on a loaded machine.
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		if err := run(&out); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		// The events of the nodes are printed by their own goroutines and the
		// demo's steps by the main one, so each stream is checked on its own.
		// Term numbers are not fixed: on a loaded machine a claim whose reply
		// outlived its lease is claimed again at once, which uses a term up, so
		// the terms are checked to increase instead.
		events := []string{
			`node-\d +elected, term \d+ `,
			`unelected from term \d+: lease-expired`,
			`elected, term \d+ `,
			`unelected from term \d+: resigned`,
			`elected, term \d+ `,
			`unelected from term \d+: stopped`,
		}
		steps := []string{
			`\*\*\* crashes`,
			`\*\*\* took over \S+ after the crash`,
			`\*\*\* resigns`,
			`\*\*\* took over \S+ after the resignation`,
			`\*\*\* stop`,
		}
		var last uint64
		for _, m := range regexp.MustCompile(`elected, term (\d+) `).FindAllStringSubmatch(out.String(), -1) {
			term, _ := strconv.ParseUint(m[1], 10, 64)
			if term <= last {
				t.Fatalf("term %d elected after term %d: terms must increase\n%s", term, last, out.String())
			}
			last = term
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
	})
}
