package heartbeat

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Default timings, as in the original JavaScript leaderfeed.
const (
	DefaultHeartbeatInterval  = 1 * time.Second
	DefaultElectionTimeoutMin = 2 * time.Second
	DefaultElectionTimeoutMax = 4 * time.Second
)

// ErrInvalidTiming is matched (with errors.Is) by every error of
// Timing.Validate.
var ErrInvalidTiming = errors.New("heartbeat: invalid timing")

// Timing is the timing configuration of an election. Nodes of one election
// may use different Timings (a rolling change of configuration): every
// record carries its writer's LeaseDuration, and a follower never claims a
// record before FollowerWait of that lease has passed, whatever its own
// ElectionTimeoutMin.
//
// The zero value of each field means its default (see WithDefaults). The
// rules that Validate enforces are what makes "at most one leader" hold:
//
//	0 < HeartbeatInterval < LeaseDuration < ElectionTimeoutMin <= ElectionTimeoutMax
//
// A leader counts itself leader only until the moment it sent its last
// successful renewal plus LeaseDuration; a follower claims only after it has
// seen no new revision for at least ElectionTimeoutMin. The difference
// ElectionTimeoutMin-LeaseDuration is the margin for clocks that run at
// slightly different rates and for scheduling delays; Validate requires it
// to be at least a tenth of ElectionTimeoutMin, and every duration to be at
// least MinDuration (1 ms). TimingFor derives a Timing from the longest
// acceptable failover.
type Timing struct {
	// HeartbeatInterval is how often the leader renews the record.
	// Default 1 s.
	HeartbeatInterval time.Duration
	// ElectionTimeoutMin and ElectionTimeoutMax bound the randomized time a
	// follower waits without seeing a new revision before it claims
	// leadership. Defaults 2 s and 4 s.
	ElectionTimeoutMin time.Duration
	ElectionTimeoutMax time.Duration
	// LeaseDuration is how long after sending a successful renewal the
	// leader still counts itself leader. Default: halfway between
	// HeartbeatInterval and ElectionTimeoutMin (1.5 s with the defaults).
	LeaseDuration time.Duration
	// VacancyJitter is the largest random delay before a follower claims an
	// election it has seen made vacant (after a resign). Default 0: every
	// follower claims at once, and the compare-and-set lets exactly one
	// win. A jitter only spares the store the refused claims of the
	// others, and costs every handover about a millisecond at least (Go's
	// timers wake at millisecond granularity): set a few milliseconds when
	// an election has dozens of campaigners.
	VacancyJitter time.Duration
}

// DefaultTiming returns the default timings: heartbeat 1 s, election timeout
// in [2 s, 4 s], lease 1.5 s, no vacancy jitter.
func DefaultTiming() Timing { return Timing{}.WithDefaults() }

// WithDefaults returns t with every zero field replaced by its default.
// The derived default of LeaseDuration is computed from the other fields
// after those have their defaults. VacancyJitter's default is 0.
func (t Timing) WithDefaults() Timing {
	if t.HeartbeatInterval == 0 {
		t.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if t.ElectionTimeoutMin == 0 {
		t.ElectionTimeoutMin = DefaultElectionTimeoutMin
	}
	if t.ElectionTimeoutMax == 0 {
		t.ElectionTimeoutMax = max(DefaultElectionTimeoutMax, t.ElectionTimeoutMin)
	}
	if t.LeaseDuration == 0 && t.HeartbeatInterval > 0 && t.ElectionTimeoutMin > t.HeartbeatInterval {
		t.LeaseDuration = t.HeartbeatInterval + (t.ElectionTimeoutMin-t.HeartbeatInterval)/2
	}
	return t
}

// Validate reports every impossible combination of fields in one error
// that names them. It does not apply defaults: call WithDefaults first if
// zero fields should mean their defaults.
func (t Timing) Validate() error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	positive := func(name string, d time.Duration) bool {
		if d <= 0 {
			add("%s must be positive, got %v", name, d)
			return false
		}
		return true
	}
	hb := positive("HeartbeatInterval", t.HeartbeatInterval)
	emin := positive("ElectionTimeoutMin", t.ElectionTimeoutMin)
	emax := positive("ElectionTimeoutMax", t.ElectionTimeoutMax)
	lease := positive("LeaseDuration", t.LeaseDuration)
	if t.VacancyJitter < 0 {
		add("VacancyJitter must not be negative, got %v", t.VacancyJitter)
	}
	if hb && emin && t.ElectionTimeoutMin <= t.HeartbeatInterval {
		add("ElectionTimeoutMin (%v) must be greater than HeartbeatInterval (%v)", t.ElectionTimeoutMin, t.HeartbeatInterval)
	}
	if emin && emax && t.ElectionTimeoutMax < t.ElectionTimeoutMin {
		add("ElectionTimeoutMax (%v) must not be less than ElectionTimeoutMin (%v)", t.ElectionTimeoutMax, t.ElectionTimeoutMin)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"HeartbeatInterval", t.HeartbeatInterval}, {"ElectionTimeoutMin", t.ElectionTimeoutMin}, {"ElectionTimeoutMax", t.ElectionTimeoutMax}, {"LeaseDuration", t.LeaseDuration}} {
		if f.d > 0 && f.d < MinDuration {
			add("%s (%v) must be at least %v: timers are not more precise than that", f.name, f.d, MinDuration)
		}
	}
	if lease && emin && t.LeaseDuration < t.ElectionTimeoutMin && t.ElectionTimeoutMin-t.LeaseDuration < t.ElectionTimeoutMin/MarginDivisor {
		add("ElectionTimeoutMin - LeaseDuration (%v) must be at least a tenth of ElectionTimeoutMin (%v): the margin covers clock rates and scheduling delays", t.ElectionTimeoutMin-t.LeaseDuration, t.ElectionTimeoutMin/MarginDivisor)
	}
	if lease && t.LeaseDuration > MaxLease {
		add("LeaseDuration (%v) must be at most MaxLease (%v)", t.LeaseDuration, MaxLease)
	}
	if lease && emin && t.LeaseDuration >= t.ElectionTimeoutMin {
		add("LeaseDuration (%v) must be less than ElectionTimeoutMin (%v), or two nodes could both count themselves leader", t.LeaseDuration, t.ElectionTimeoutMin)
	}
	if lease && hb && t.LeaseDuration <= t.HeartbeatInterval {
		add("LeaseDuration (%v) must be greater than HeartbeatInterval (%v), or the leader would lose its lease between renewals", t.LeaseDuration, t.HeartbeatInterval)
	}
	if hb && t.VacancyJitter >= t.HeartbeatInterval {
		add("VacancyJitter (%v) must be less than HeartbeatInterval (%v)", t.VacancyJitter, t.HeartbeatInterval)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidTiming, strings.Join(problems, "; "))
}

// MinDuration is the shortest HeartbeatInterval, ElectionTimeoutMin,
// ElectionTimeoutMax and LeaseDuration that Validate accepts.
const MinDuration = time.Millisecond

// MarginDivisor: Validate requires ElectionTimeoutMin - LeaseDuration >=
// ElectionTimeoutMin / MarginDivisor, a margin of at least 10 % of the
// shortest election timeout. It is what covers clocks that run at
// different rates and a process descheduled between a reply and its check;
// below about a fifth of a millisecond no leader was stable.
const MarginDivisor = 10

// TimingFor derives a Timing from the longest acceptable failover after a
// leader crashes, maxFailover (at least 10 ms), for an election whose nodes
// all use it.
//
// After a crash a follower claims ElectionTimeoutMax at most after the last
// heartbeat it saw. TimingFor sets ElectionTimeoutMax to half of
// maxFailover: the other half is for the claim's round trip and for claims
// that fail (a follower whose claim fails retries a HeartbeatInterval
// later, and four retries fit), so a slow or briefly failing store still
// fails over within maxFailover. The range is narrow, [45 %, 50 %]: the
// compare-and-set already gives exactly one winner, so a wide range would
// only delay failover. LeaseDuration is 36 % (a margin of 20 % of
// ElectionTimeoutMin) and HeartbeatInterval a third of the lease (12 %), so
// two renewals can fail before the lease runs out.
//
// A crash comes at a random point between two heartbeats, so the typical
// failover is about ElectionTimeoutMin/2 + ElectionTimeoutMax/2 -
// HeartbeatInterval/2, 41.5 % of maxFailover, and the longest in a healthy
// store 50 %. TimingFor(time.Second) is heartbeat 120 ms, lease 360 ms,
// election timeout 450–500 ms; a clean Resign hands over in milliseconds
// whatever the timing.
func TimingFor(maxFailover time.Duration) (Timing, error) {
	if maxFailover < 10*MinDuration {
		return Timing{}, fmt.Errorf("%w: longest failover %v is shorter than %v", ErrInvalidTiming, maxFailover, 10*MinDuration)
	}
	t := Timing{
		ElectionTimeoutMin: maxFailover * 45 / 100,
		ElectionTimeoutMax: maxFailover / 2,
		LeaseDuration:      maxFailover * 36 / 100,
	}
	t.HeartbeatInterval = t.LeaseDuration / 3
	return t, t.Validate()
}

// Rand is the source of randomness for election timeouts and jitter.
// *rand.Rand from math/rand/v2 implements it; tests inject a seeded one.
type Rand interface {
	Int64N(n int64) int64
}

// ElectionTimeout returns a duration drawn uniformly from
// [ElectionTimeoutMin, ElectionTimeoutMax] using r, or the package-level
// source of math/rand/v2 when r is nil.
func (t Timing) ElectionTimeout(r Rand) time.Duration {
	return t.ElectionTimeoutMin + randDuration(r, t.ElectionTimeoutMax-t.ElectionTimeoutMin)
}

// Jitter returns a duration drawn uniformly from [0, VacancyJitter].
func (t Timing) Jitter(r Rand) time.Duration { return randDuration(r, t.VacancyJitter) }

func randDuration(r Rand, span time.Duration) time.Duration {
	if span <= 0 {
		return 0
	}
	if r == nil {
		return time.Duration(rand.Int64N(int64(span) + 1))
	}
	return time.Duration(r.Int64N(int64(span) + 1))
}
