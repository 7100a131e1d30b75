package base

import (
	"errors"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Refusals. A store call that fails with an error matching ErrRefused (a
// missing privilege, a missing or foreign table) cannot succeed by being
// retried at the pace of a transient fault: it would only fill the
// server's log. So the loop keeps an account of the kinds of call the
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

// refusals is the loop's account of the store's refusals.
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
// machine does (so that the timers it sets see the refusal): err, and
// whether the store took the call (took).
func (l *loop) noteRefusal(op refusedOp, err error, took bool) {
	r := &l.refusals
	now := time.Now()
	switch {
	case err != nil && errors.Is(err, ErrRefused) && l.ctx.Err() == nil:
		first := r.ops == 0
		r.ops |= op
		r.last[op.index()] = now
		r.n++
		r.total++
		l.f.mu.Lock()
		if first {
			l.f.health.RefusedSince = now
		}
		l.f.health.Refused = err
		since := l.f.health.RefusedSince
		l.f.mu.Unlock()
		switch {
		case first:
			l.f.log.Error("leaderfeed: store refuses", "call", op.String(), "err", err)
		case now.Sub(r.loggedAt) >= refusalLogEvery:
			l.f.log.Error("leaderfeed: store still refuses", "call", op.String(), "refusals", r.n,
				"since", since, "err", err)
		default:
			return
		}
		r.loggedAt, r.n = now, 0
	case took && r.ops&op != 0:
		r.ops &^= op
		if r.ops != 0 {
			return
		}
		l.f.mu.Lock()
		since := l.f.health.RefusedSince
		l.f.health.Refused, l.f.health.RefusedSince = nil, time.Time{}
		l.f.mu.Unlock()
		l.f.log.Info("leaderfeed: store takes the calls it refused", "refusals", r.total, "for", now.Sub(since))
		r.total, r.n = 0, 0
	}
}

// refusalDelay returns when the timer t, asked for at, fires: no sooner
// than refusalRetry after the last refusal of the kind of call it starts.
func (l *loop) refusalDelay(t timerID, at time.Time) time.Time {
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
	if l.refusals.ops&op == 0 {
		return at
	}
	if retry := l.refusals.last[op.index()].Add(refusalRetry(l.f.timing)); retry.After(at) {
		return retry
	}
	return at
}
