package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{
		"canary leads, term 1 (at once)",
		"us-1 leads, term 2 (after the hysteresis)",
		"eu-1 leads, term 3 (after the hysteresis)",
		"participant eu-1 priority 10 value eu-1.internal:8080",
		"participant canary priority -10",
		"eu-1's leader context ended: leaderfeed: leadership ended: transferred",
		"us-1 leads, term 4 (at once)",
		"eu-1 leads, term 5 (after the hysteresis)",
		"us-1 leads, term 6 (at once)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
