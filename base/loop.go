package base

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// loop is the driver of a Feed's machine: the one goroutine that owns the
// election state. It takes the inputs (results of store calls, timers,
// notifications of the feed, requests, Stop), hands each to machine.step
// with the time it read after the input arrived, and executes the effects
// the machine returns, in order. It never calls the store itself: every
// store call (claim, renewal, vacancy, read, Subscribe) runs on a goroutine
// of its own and its result comes back as an input, so Resign, Proclaim,
// Stop and the getters are answered whatever the store does. Why there is
// never more than one leader is told next to the machine's claim logic
// (see claimDue in machine.go).
type loop struct {
	f       *Feed
	m       *machine
	ctx     context.Context // cancelled when the Feed stops for good
	exited  chan struct{}   // closed when run returns
	results chan callResult // results of store calls

	timers      map[timerID]*time.Timer // claim, renew, reopen, poll
	leaseTimer  *time.Timer             // cancels the leader context at the lease's end
	leaseCtx    *leaseContext           // the leader context leaseTimer cancels
	leaseLost   chan struct{}
	cancelledAt time.Time // when the last cancelLeader was executed

	// The changefeed.
	sub        <-chan backend.Notification
	subCancel  context.CancelFunc
	subResults chan subResult
	pending    subResult // the Subscribe result being stepped

	refusals refusals // see refused.go
}

type subResult struct {
	ch     <-chan backend.Notification
	cancel context.CancelFunc
	err    error
}

func newLoop(f *Feed, ctx context.Context) *loop {
	stopped := func() *time.Timer {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}
	return &loop{
		f:          f,
		m:          newMachine(f.id, f.b.Name(), f.timing, f.opts),
		ctx:        ctx,
		exited:     make(chan struct{}),
		results:    make(chan callResult, resultsBuffer),
		leaseLost:  make(chan struct{}, 1),
		timers:     map[timerID]*time.Timer{timerClaim: stopped(), timerRenew: stopped(), timerReopen: stopped(), timerPoll: stopped()},
		subResults: make(chan subResult, 1),
	}
}

func (l *loop) run() {
	defer l.exit()
	l.noteStart()
	l.step(startInput{})
	stopCh := l.f.stopCh
	for {
		if l.m.done() {
			return
		}
		select {
		case <-stopCh:
			stopCh = nil
			l.f.mu.Lock()
			ctx := l.f.stopCtx
			l.f.mu.Unlock()
			l.step(stopInput{ctx: ctx})
		case <-l.ctx.Done():
			return
		case n, ok := <-l.sub:
			l.noteNotification(n, ok)
			if ok && n.Type == backend.Failed {
				l.noteRefusal(refusedFeed, n.Err, false)
			}
			l.step(notificationInput{n: n, ok: ok})
		case r := <-l.subResults:
			l.noteSubscribed(r)
			l.noteRefusal(refusedFeed, r.err, r.err == nil)
			l.pending = r
			l.step(subscribedInput{err: r.err, ok: r.err == nil && r.ch != nil})
			l.pending = subResult{}
		case r := <-l.results:
			r.closed = l.ctx.Err() != nil
			if r.parent != nil {
				r.parentDone = r.parent.Err() != nil
			}
			l.noteRefusal(opOf(r.kind), r.err, r.answered())
			l.step(r)
			l.noteResult(r)
		case <-l.timers[timerClaim].C:
			l.step(timerInput{t: timerClaim})
		case <-l.timers[timerRenew].C:
			l.step(timerInput{t: timerRenew})
		case <-l.leaseLost:
			l.step(leaseLostInput{expired: l.leaseCtx != nil && l.leaseCtx.Err() != nil})
		case <-l.timers[timerReopen].C:
			l.step(timerInput{t: timerReopen})
		case <-l.timers[timerPoll].C:
			l.step(timerInput{t: timerPoll})
		case r := <-l.f.reqs:
			l.step(requestInput{r: r})
		}
	}
}

// exit ends the engine: the machine cancels the leader context (Stop's
// context ended before the clean path finished), answers a waiting Resign
// and stops the timers and the feed; then the store calls are cancelled,
// and the subscriptions end once their readers took what is queued.
func (l *loop) exit() {
	l.step(exitInput{})
	close(l.exited)
	l.f.cancel()
	l.f.events.finish()
}

// step hands one input to the machine, at the time read now (after the
// input arrived), and executes its effects in order.
func (l *loop) step(in input) {
	for _, e := range l.m.step(time.Now(), in) {
		l.exec(e)
	}
}

func (l *loop) exec(e effect) {
	switch e := e.(type) {
	case startCall:
		l.call(e)
	case emit:
		if e.ev.At.IsZero() && !e.notAfter.IsZero() {
			e.ev.At = l.cancelledAt
			if e.ev.At.After(e.notAfter) {
				e.ev.At = e.notAfter
			}
		}
		l.emit(e.ev)
	case setTimer:
		if e.t == timerLease {
			panic("leaderfeed: the lease timer is armed by armLease")
		}
		at := e.at
		if e.align {
			at = l.renewAt(at)
		}
		at = l.refusalDelay(e.t, at)
		l.timers[e.t].Reset(max(0, time.Until(at)))
	case stopTimer:
		if e.t == timerLease {
			if l.leaseTimer != nil {
				l.leaseTimer.Stop()
			}
			return
		}
		l.timers[e.t].Stop()
	case cancelLeader:
		e.ctx.cancel(e.cause)
		l.cancelledAt = time.Now()
	case armLease:
		l.armLease(e.ctx, e.end)
	case extendLease:
		l.step(leaseExtendedInput{r: e.r, ok: e.ctx.extend(e.end)})
	case publish:
		l.f.mu.Lock()
		l.f.snap = e.snap
		l.f.leaseEnd = e.leaseEnd
		if !e.recordAt.IsZero() {
			l.f.health.LastRecord = e.recordAt
		}
		l.f.mu.Unlock()
	case reply:
		e.to <- e.err
	case logDebug:
		l.f.log.Debug(e.msg, e.args...)
	case openFeed:
		l.openFeed()
	case useFeed:
		l.sub, l.subCancel = l.pending.ch, l.pending.cancel
	case discardFeed:
		l.pending.cancel()
	case closeFeed:
		if l.subCancel != nil {
			l.subCancel()
			l.subCancel = nil
		}
		l.sub = nil
	default:
		panic(fmt.Sprintf("leaderfeed: unknown effect %T", e))
	}
}

// emit queues an event for the subscriptions and logs it, with a fixed
// message per event type.
func (l *loop) emit(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	log := l.f.log
	switch e.Type {
	case EventElected:
		log.Info("leaderfeed: elected", "term", e.Term)
	case EventUnelected:
		log.Info("leaderfeed: unelected", "term", e.Term, "reason", e.Reason.String(), "err", e.Err)
	case EventNewLeader:
		log.Info("leaderfeed: new leader", "leader", e.Leader, "term", e.Term)
	case EventSubscribeStarted:
		log.Info("leaderfeed: changefeed started")
	case EventSubscribeError:
		log.Info("leaderfeed: changefeed failed", "err", e.Err)
	case EventIgnored:
		log.Info("leaderfeed: malformed record ignored", "err", e.Err)
	case EventError:
		log.Debug("leaderfeed: store call failed", "err", e.Err)
	case EventChange:
		log.Debug("leaderfeed: change", "table", e.Change.Table, "op", e.Change.Op.String())
	}
	if tr := l.f.opts.Trace; tr != nil && tr.Event != nil {
		tr.Event(EventInfo{Election: l.f.Election(), NodeID: l.f.id, Event: e})
	}
	l.f.events.push(e)
}

// renewAt returns when the renewal due at due is sent: then, or earlier
// (by less than a heartbeat interval) when the backend aligns the renewals
// of many elections so that they share batches (Elections). Renewing early
// is safe: the lease runs from the renewal's own send time.
func (l *loop) renewAt(due time.Time) time.Time {
	if a, ok := l.f.b.(backend.Aligner); ok {
		if at := a.AlignRenewal(due, l.f.timing.HeartbeatInterval); !at.After(due) && at.After(due.Add(-l.f.timing.HeartbeatInterval)) {
			return at
		}
	}
	return due
}

// armLease (re)starts the timer that cancels the leader context at the end
// of the lease and tells the loop.
func (l *loop) armLease(ctx *leaseContext, end time.Time) {
	if l.leaseTimer != nil && l.leaseCtx == ctx {
		// The same term's lease, extended: move its timer.
		l.leaseTimer.Reset(time.Until(end))
		return
	}
	if l.leaseTimer != nil {
		l.leaseTimer.Stop()
	}
	lost := l.leaseLost
	l.leaseCtx = ctx
	l.leaseTimer = time.AfterFunc(time.Until(end), func() {
		// Err cancels the context only if its end has passed: a renewal
		// may have extended the lease just before this timer fired, and
		// the loop then re-arms the timer for the new end (armLease).
		if ctx.Err() == nil {
			return
		}
		select {
		case lost <- struct{}{}:
		default:
		}
	})
}

// call runs one store call on a goroutine of its own; its result comes back
// on l.results (dropped if the loop has ended). A claim or renewal that the
// backend takes without blocking (writeSubmitter: a batching Elections)
// needs no goroutine. A vacancy whose context has ended is not sent: the
// machine is told at once.
func (l *loop) call(c startCall) {
	r := callResult{kind: c.kind, expected: c.expected, next: c.next, sentAt: c.sentAt, parent: c.parent}
	var ctx context.Context
	var cancel context.CancelFunc
	switch c.kind {
	case callVacancy:
		if err := c.parent.Err(); err != nil {
			l.step(vacancyAbortedInput{err: err})
			return
		}
		vctx, vcancel := context.WithCancel(c.parent)
		stop := context.AfterFunc(l.ctx, vcancel)
		ctx, cancel = vctx, func() { stop(); vcancel() }
	case callClaim, callRenew:
		if s, ok := l.f.b.(backend.Submitter); ok && s.SubmitHeartbeat(l.ctx, c.deadline, c.expected, c.next, func(res heartbeat.Record, err error) {
			r.res, r.err = res, err
			l.deliver(r)
		}) {
			return
		}
		ctx, cancel = context.WithDeadline(l.ctx, c.deadline)
	default:
		ctx, cancel = context.WithDeadline(l.ctx, c.deadline)
	}
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		defer cancel()
		if r.kind == callRead {
			r.res, r.err = l.f.b.Get(ctx)
		} else {
			r.res, r.err = l.f.b.Heartbeat(ctx, r.expected, r.next)
		}
		select {
		case l.results <- r:
		case <-l.exited:
		}
	}()
}

// resultsBuffer is the room of a loop's channel of results: a Feed has at
// most one write and one read in flight, so a result handed over without a
// goroutine (deliver) normally finds room.
const resultsBuffer = 4

// deliver hands the result of a submitted write to the loop without
// blocking the caller: into the channel's room, or, when it has none, from
// a goroutine that gives up when the loop has ended.
func (l *loop) deliver(r callResult) {
	select {
	case l.results <- r:
		return
	default:
	}
	go func() {
		select {
		case l.results <- r:
		case <-l.exited:
		}
	}()
}

// openFeed opens the changefeed in a goroutine of its own; the result comes
// back on l.subResults.
func (l *loop) openFeed() {
	ctx, cancel := context.WithCancel(l.ctx)
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		ch, err := l.f.b.Subscribe(ctx)
		if err != nil {
			cancel()
		}
		select {
		case l.subResults <- subResult{ch: ch, cancel: cancel, err: err}:
		case <-l.exited:
			cancel()
		}
	}()
}

func (r Reason) cause() error {
	switch r {
	case ReasonResigned:
		return ErrResigned
	case ReasonDeposed:
		return ErrDeposed
	case ReasonStopped:
		return ErrStopped
	case ReasonTransferred:
		return ErrTransferred
	}
	return ErrLeaseExpired
}

// leaseContext is the leader context of one term. The loop's lease timer
// (armLease) cancels it when the lease ends, but a timer can fire late:
// on a loaded machine by milliseconds, in a process that was paused
// (SIGSTOP, a VM freeze) by the whole pause. So Err also compares the clock
// with the lease's end and cancels the context itself once it has passed:
// a holder that checks Err never finds the context live after the lease
// ended. Done closes when the context is cancelled, by the timer or by Err;
// contexts derived from it follow Done. context.Cause says why it ended.
type leaseContext struct {
	context.Context
	cancel context.CancelCauseFunc

	mu  sync.Mutex
	end time.Time // the lease's end, on this process's monotonic clock
}

func newLeaseContext(end time.Time) *leaseContext {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &leaseContext{Context: ctx, cancel: cancel, end: end}
}

// Err returns the error of the underlying context, after cancelling it if
// the lease has ended.
func (c *leaseContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.end) {
		c.cancel(ErrLeaseExpired)
	}
	return c.Context.Err()
}

// extend moves the lease's end to end, unless the lease has ended (or the
// context was cancelled) already; it reports whether it did. Checking and
// moving under one lock means no Err call can cancel the context on the
// old end after the lease was extended.
func (c *leaseContext) extend(end time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Context.Err() != nil {
		return false
	}
	if !time.Now().Before(c.end) {
		c.cancel(ErrLeaseExpired)
		return false
	}
	c.end = end
	return true
}
