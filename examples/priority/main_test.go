package main

import (
	"regexp"
	"strings"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun checks the story in order, under synctest: the demo runs in
// memory, so on the fake clock its timings are exact however loaded the
// machine is ("at once" and "after the hysteresis" included).
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		if err := run(&out); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + out.String())
		rest := out.String()
		for _, want := range []string{
			`canary leads, term \d+ \(at once\)`,
			`us-1 leads, term \d+ \(after the hysteresis\)`,
			`eu-1 leads, term \d+ \(after the hysteresis\)`,
			`participant eu-1 priority 10 value eu-1\.internal:8080`,
			`participant canary priority -10`,
			`eu-1's leader context ended: leaderfeed: leadership ended: transferred`,
			`us-1 leads, term \d+ \(at once\)`,
			`eu-1 leads, term \d+ \(after the hysteresis\)`,
			`us-1 leads, term \d+ \(at once\)`,
		} {
			loc := regexp.MustCompile(want).FindStringIndex(rest)
			if loc == nil {
				t.Fatalf("output lacks %q after the lines matched before it", want)
			}
			rest = rest[loc[1]:]
		}
	})
}
