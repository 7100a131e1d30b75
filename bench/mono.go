package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// monotonic returns the system's CLOCK_MONOTONIC in nanoseconds: one clock
// for every process on the machine, so that the node processes' reports
// can be compared with each other and with the parent's (the integration
// module's Monotonic, which this module does not import: its go.mod would
// pull testcontainers' requirements into this one's).
func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("bench: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// monoClock converts time.Time values taken in this process (base.Event.At)
// to monotonic nanoseconds; Go's monotonic readings are CLOCK_MONOTONIC.
type monoClock struct {
	now0  time.Time
	mono0 int64
}

func newMonoClock() monoClock {
	var best monoClock
	bestGap := int64(-1)
	for range 32 {
		a := monotonic()
		now := time.Now()
		b := monotonic()
		if gap := b - a; bestGap < 0 || gap < bestGap {
			best, bestGap = monoClock{now0: now, mono0: a + gap/2}, gap
		}
	}
	return best
}

func (c monoClock) mono(t time.Time) int64 { return c.mono0 + int64(t.Sub(c.now0)) }
