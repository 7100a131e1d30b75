package main

import (
	"strings"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs the demo under synctest: it runs in memory, so on the fake
// clock its terms are exact however loaded the machine is.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out strings.Builder
		if err := run(&out); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + out.String())
		for _, want := range []string{
			"node-a: elected, term 1",
			"node-b: elected, term 2",
			"node-a: write refused: ledger: stale fencing token: term 1, the ledger is at term 2",
			"node-a: job of term 1 stopped",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})
}
