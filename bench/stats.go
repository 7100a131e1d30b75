package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// series is the latency samples of one system in one scenario.
type series struct {
	scenario string // key of the scenario, e.g. "handover"
	system   string // e.g. "leaderfeed/postgres", "etcd"
	samples  []time.Duration
	resign   []time.Duration // handover: how long Resign itself took
	failed   int             // rounds that gave no sample (timed out)
	note     string
}

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
