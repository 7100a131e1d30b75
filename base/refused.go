package base

import (
	"errors"
	"log/slog"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Refusals. A store call that fails with an error matching ErrRefused (a
// missing privilege, a missing or foreign table) cannot succeed by being
// retried at the pace of a transient fault: it would only fill the
// server's log. So the machine keeps an account of the kinds of call the
// store refuses (writes, reads, the changefeed) and:
//
//   - logs the first refusal at Error, then at most one summary a minute
//     while refusals go on, and one line at Info when the store takes
//     every refused kind of call again;
//   - reports the refusal in Health (Healthy fails at once);
//   - retries a refused kind of call no sooner than refusalRetry after its
//     last refusal, by moving the timer that starts it (claims, polls,
//     reopens of the changefeed) later. Renewals keep their pace: a
//     leader whose renewals are refused steps down at the end of its
//     lease like any leader whose renewals fail. Sending a call later
//     than the machine asked is always safe (see claimDue in machine.go).
//
// The Feed never stops by itself: once an administrator grants what was
// missing, the next retry succeeds and it goes on. Run, the one-call
// helper, returns the refusal instead (see Run).

// refusedOp is a kind of store call, for the account of refusals.
type refusedOp uint8

const (
	refusedWrites refusedOp = 1 << iota // claims, renewals, vacancies
	refusedReads
	refusedFeed
)

func (o refusedOp) String() string {
	switch o {
	case refusedWrites:
		return "write"
	case refusedReads:
		return "read"
	case refusedFeed:
		return "changefeed"
	}
	return "none"
}

func (o refusedOp) index() int {
	switch o {
	case refusedReads:
		return 1
	case refusedFeed:
		return 2
	}
	return 0
}

// refusals is the machine's account of the store's refusals.
type refusals struct {
	ops      refusedOp    // the kinds of call the store refuses now
	last     [3]time.Time // per kind (index), its last refusal
	n        int          // refusals since the last log line
	total    int          // refusals since the store took every call
	loggedAt time.Time
}

// refusalLogEvery bounds the summaries of refusals that go on.
const refusalLogEvery = time.Minute

// refusalRetry returns how long a Feed with timing t waits, after the
// store refused a kind of call, before it sends one again: five times
// ElectionTimeoutMax (20s with the default timing). A privilege granted
// meanwhile is in use by then.
func refusalRetry(t heartbeat.Timing) time.Duration {
	return 5 * t.WithDefaults().ElectionTimeoutMax
}

// opOf returns the kind of a store call.
func opOf(k callKind) refusedOp {
	if k == callRead {
		return refusedReads
	}
	return refusedWrites
}

// noteRefusal takes in the outcome of a call of kind op, before the
// machine handles it (so that the timers it sets see the refusal): err,
// and whether the store took the call (took).
func (m *machine) noteRefusal(op refusedOp, err error, took bool) {
	r := m.refusals
	h := &m.health
	switch {
	case err != nil && errors.Is(err, ErrRefused):
		if r == nil {
			// Made on the first refusal and kept: most machines never
			// see one, and 120 bytes each would take the machine a size
			// class up.
			r = new(refusals)
			m.refusals = r
		}
		first := r.ops == 0
		r.ops |= op
		r.last[op.index()] = m.now
		r.n++
		r.total++
		if first {
			h.RefusedSince = m.now
		}
		h.Refused = err
		m.healthChanged = true
		switch {
		case first:
			m.do(logLine{level: slog.LevelError, msg: "leaderfeed: store refuses", args: []any{"call", op.String(), "err", err}})
		case m.now.Sub(r.loggedAt) >= refusalLogEvery:
			m.do(logLine{level: slog.LevelError, msg: "leaderfeed: store still refuses", args: []any{"call", op.String(), "refusals", r.n,
				"since", h.RefusedSince, "err", err}})
		default:
			return
		}
		r.loggedAt, r.n = m.now, 0
	case took && r != nil && r.ops&op != 0:
		r.ops &^= op
		if r.ops != 0 {
			return
		}
		m.do(logLine{level: slog.LevelInfo, msg: "leaderfeed: store takes the calls it refused", args: []any{"refusals", r.total, "for", m.now.Sub(h.RefusedSince)}})
		h.Refused, h.RefusedSince = nil, time.Time{}
		m.healthChanged = true
		r.total, r.n = 0, 0
	}
}

// expireRefusals forgets the refusal of a kind of call that the node has
// had no reason to send since: none is in flight and none was refused for
// refusalRetry plus ElectionTimeoutMax, so a retry the refusal delayed
// (refusalDelay) is over too. A follower's only writes are claims, which it
// never sends while another node renews: without this, its Health would
// say the store refuses long after the privilege came back. A refusal that
// still holds is seen again, and reported again, at the next call.
func (m *machine) expireRefusals() {
	r := m.refusals
	for _, op := range [...]refusedOp{refusedWrites, refusedReads, refusedFeed} {
		busy := (op == refusedWrites && m.writing) || (op == refusedReads && m.reading) || (op == refusedFeed && m.opening)
		if r.ops&op == 0 || busy || m.now.Before(r.last[op.index()].Add(refusalRetry(m.t)+m.t.ElectionTimeoutMax)) {
			continue
		}
		r.ops &^= op
		if r.ops != 0 {
			continue
		}
		m.do(logLine{level: slog.LevelInfo, msg: "leaderfeed: no call refused lately", args: []any{"refusals", r.total, "for", m.now.Sub(m.health.RefusedSince)}})
		m.health.Refused, m.health.RefusedSince = nil, time.Time{}
		m.healthChanged = true
		r.total, r.n = 0, 0
	}
}

// refusalDelay returns when the timer t, asked for at, fires: no sooner
// than refusalRetry after the last refusal of the kind of call it starts.
func (m *machine) refusalDelay(t timerID, at time.Time) time.Time {
	var op refusedOp
	switch t {
	case timerClaim:
		op = refusedWrites
	case timerPoll:
		op = refusedReads
	case timerReopen:
		op = refusedFeed
	default:
		return at
	}
	if m.refusals == nil || m.refusals.ops&op == 0 {
		return at
	}
	if retry := m.refusals.last[op.index()].Add(refusalRetry(m.t)); retry.After(at) {
		return retry
	}
	return at
}
