package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// series is the latency samples of one system in one scenario.
type series struct {
	scenario string // key of the scenario, e.g. "handover"
	system   string // e.g. "leaderfeed/postgres", "etcd"
	samples  []time.Duration
	resign   []time.Duration // handover: how long Resign itself took
	failed   int             // rounds or deliveries that gave no sample (timed out)
	lost     losses          // rounds that gave no sample and were retried
	note     string
}

// losses counts the rounds of a scenario that gave no sample and were
// retried, by cause: something the guarantee allows happened under load
// (a lease that ran out before the resign, a leader that changed by
// itself, an etcd session that expired), or a wait derived from the timing
// (config.within) ran out. The scenario retries the round, so it still
// produces its figures, and the report gives the count beside them.
type losses map[string]int

func (l *losses) add(cause string) {
	if *l == nil {
		*l = losses{}
	}
	(*l)[cause]++
}

func (l losses) total() int {
	n := 0
	for _, v := range l {
		n += v
	}
	return n
}

// String lists the causes, most frequent first.
func (l losses) String() string {
	causes := slices.SortedFunc(maps.Keys(l), func(a, b string) int {
		if l[a] != l[b] {
			return l[b] - l[a]
		}
		return strings.Compare(a, b)
	})
	out := make([]string, len(causes))
	for i, c := range causes {
		out[i] = fmt.Sprintf("%d %s", l[c], c)
	}
	return strings.Join(out, "; ")
}

// lose counts a lost round of what (scenario and system) and logs it.
func (l *losses) lose(what, cause string) {
	l.add(cause)
	logf("  %s: lost a round: %s", what, cause)
}

// tooMany ends a scenario whose rounds keep getting lost, so that a fault
// shows as a failure rather than as a run that never ends: more lost
// rounds than rounds wanted (and at least 10).
func (l losses) tooMany(want int) error {
	if n := l.total(); n > max(want, 10) {
		return fmt.Errorf("gave up after %d lost rounds (%s)", n, l)
	}
	return nil
}

func (s *series) lose(cause string) { s.lost.lose(s.scenario+" "+s.system, cause) }

func (s *series) tooManyLost(want int) error { return s.lost.tooMany(want) }

// summary holds the order statistics of a series.
type summary struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return summary{n: len(s), p50: quantile(s, 0.50), p99: quantile(s, 0.99), max: s[len(s)-1]}
}

// quantile returns the nearest-rank q-quantile of sorted s.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// ms formats d in milliseconds with a precision that suits its size.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// ratio formats a/b, or "–" when b is zero.
func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}
