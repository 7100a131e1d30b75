//go:build linux

package integration

import (
	"time"

	"golang.org/x/sys/unix"
)

// Monotonic returns the system's CLOCK_MONOTONIC in nanoseconds. Unlike the
// monotonic reading in a time.Time, which only means something inside the
// process that took it, this clock is one for every process on the machine,
// so the logs of separate node processes can be compared with it.
func Monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("integration: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// Clock converts times taken in this process (time.Time values that carry a
// monotonic reading, such as base.Event.At) into Monotonic nanoseconds. Go
// reads the same CLOCK_MONOTONIC for its monotonic readings, so the
// conversion is exact up to the offset measured by NewClock (well under a
// microsecond).
type Clock struct {
	now0  time.Time
	mono0 int64
}

// NewClock measures the offset between time.Now and Monotonic: it keeps the
// tightest of several bracketed samples.
func NewClock() *Clock {
	var best *Clock
	var bestGap int64
	for range 32 {
		a := Monotonic()
		now := time.Now()
		b := Monotonic()
		if gap := b - a; best == nil || gap < bestGap {
			best, bestGap = &Clock{now0: now, mono0: a + gap/2}, gap
		}
	}
	return best
}

// Mono returns t on the Monotonic clock. t must carry a monotonic reading
// of this process (time.Now and values derived from it with Add do).
func (c *Clock) Mono(t time.Time) int64 { return c.mono0 + int64(t.Sub(c.now0)) }
