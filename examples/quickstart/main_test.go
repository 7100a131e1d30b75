package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// line is one line of the demo's output: who printed it and what.
type line struct{ who, text string }

var lineRE = regexp.MustCompile(`^ *\d+\.\d+s  (\S+) +(.*)$`)

// The demo must show an election, a failover after the crash, a handover
// after the resignation, and a clean stop.
//
// Each node's events are printed by a goroutine of its own and the demo's
// steps (the lines with ***) by the main one. The order of two goroutines'
// prints is not the order of what happened: at a handover the new leader's
// "elected" comes at the same instant as the old one's "unelected", and may
// be printed first. So the steps are checked in their order, and each
// node's events in its own stream: the node that crashed lost its lease,
// the one that took over resigned, and the one that took over from it
// stopped, each in a term above the one before. Term numbers are not fixed
// (a claim whose reply outlived its lease is claimed again at once, which
// uses a term up), only rising.
func TestQuickstart(t *testing.T) {
	// Under synctest: the demo's timings are exact on a loaded machine.
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		if err := run(&out); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		var steps []line
		streams := map[string][]string{}
		for l := range strings.Lines(out.String()) {
			m := lineRE.FindStringSubmatch(strings.TrimSuffix(l, "\n"))
			if m == nil {
				t.Fatalf("line %q is not TIME WHO TEXT\n%s", l, out.String())
			}
			if strings.HasPrefix(m[2], "*** ") {
				steps = append(steps, line{m[1], m[2]})
			} else {
				streams[m[1]] = append(streams[m[1]], m[2])
			}
		}
		wantSteps := []string{`^\*\*\* crashes`, `^\*\*\* took over \S+ after the crash`, `^\*\*\* is back`,
			`^\*\*\* resigns`, `^\*\*\* took over \S+ after the resignation`, `^\*\*\* stop`}
		if len(steps) != len(wantSteps) {
			t.Fatalf("steps %q, want %d\n%s", steps, len(wantSteps), out.String())
		}
		for i, w := range wantSteps {
			if !regexp.MustCompile(w).MatchString(steps[i].text) {
				t.Fatalf("step %d is %q, want %q\n%s", i+1, steps[i].text, w, out.String())
			}
		}
		crashed, first, resigned, second := steps[0].who, steps[1].who, steps[3].who, steps[4].who
		if first == crashed || resigned != first || second == resigned {
			t.Fatalf("crashed %s, took over %s, resigned %s, took over %s: want a new leader each time\n%s",
				crashed, first, resigned, second, out.String())
		}
		// Each node's terms rise in its own stream, and the terms that end
		// as the story says rise from one node to the next.
		var last uint64
		for _, leg := range []struct{ who, end string }{{crashed, "lease-expired"}, {first, "resigned"}, {second, "stopped"}} {
			term := termEnded(t, streams[leg.who], leg.end)
			if term == 0 {
				t.Fatalf("%s's events lack an election to a term that ended %s:\n%s", leg.who, leg.end, strings.Join(streams[leg.who], "\n"))
			}
			if term <= last {
				t.Fatalf("%s's term %d that ended %s is not above the term %d before it\n%s", leg.who, term, leg.end, last, out.String())
			}
			last = term
		}
	})
}

var electedRE = regexp.MustCompile(`^elected, term (\d+) `)

// termEnded returns the term of the first election in stream whose
// "unelected from term N: end" follows it, checking that the node's terms
// rise; 0 if there is none.
func termEnded(t *testing.T, stream []string, end string) uint64 {
	t.Helper()
	var elected uint64
	for _, s := range stream {
		if m := electedRE.FindStringSubmatch(s); m != nil {
			term, _ := strconv.ParseUint(m[1], 10, 64)
			if term <= elected {
				t.Fatalf("elected to term %d after term %d: terms must rise", term, elected)
			}
			elected = term
		}
		if elected != 0 && s == "unelected from term "+strconv.FormatUint(elected, 10)+": "+end {
			return elected
		}
	}
	return 0
}
