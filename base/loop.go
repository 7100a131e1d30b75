package base

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// loop is the one goroutine that owns a Feed's election state.
//
// The safety argument, in the terms of package doc: a claim compare-and-sets
// revision R only after this node has seen no newer revision for at least
// ElectionTimeoutMin since it first observed R, unless R is a vacancy. The
// leader's lease ends LeaseDuration after it sent its last renewal that
// succeeded, and LeaseDuration < ElectionTimeoutMin. R was committed after
// its writer sent it and observed after it was committed, so any claim on R
// is sent after the lease that R granted has ended; a claim on an older
// revision fails the compare-and-set. A vacancy is written only after the
// leader has cancelled its leader context.
type loop struct {
	f   *Feed
	ctx context.Context // cancelled when Stop's context ends
	t   heartbeat.Timing

	// What this node knows of the record.
	rec        heartbeat.Record // newest record observed; Revision 0: none
	seen       bool             // rec was read or notified at least once
	missing    bool             // the store has no record (never had, or deleted)
	deleted    bool             // ... because it was deleted after we saw it
	observedAt time.Time        // when rec.Revision was first observed
	maxTerm    uint64           // the highest term ever observed
	announced  struct {
		leader string
		term   uint64
		value  []byte
		ok     bool
	}
	ownVacancy uint64 // revision of the vacancy this node wrote on Resign
	value      []byte

	// Leadership: set while leading.
	leading      bool
	term         uint64
	myRev        uint64
	leaseEnd     time.Time
	leaderCtx    *leaseContext
	leaderCancel context.CancelFunc
	leaseTimer   *time.Timer // AfterFunc: cancels leaderCtx at leaseEnd
	leaseLost    chan struct{}
	lastErr      error

	claimTimer  *time.Timer
	renewTimer  *time.Timer
	reopenTimer *time.Timer
	pollTimer   *time.Timer

	// The changefeed.
	sub        <-chan Notification
	subCancel  context.CancelFunc
	subOpened  time.Time
	opening    bool
	openCancel context.CancelFunc
	subResults chan subResult
	backoff    time.Duration
}

type subResult struct {
	ch     <-chan Notification
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
		f:           f,
		ctx:         ctx,
		t:           f.timing,
		value:       f.opts.Value,
		leaseLost:   make(chan struct{}, 1),
		claimTimer:  stopped(),
		renewTimer:  stopped(),
		reopenTimer: stopped(),
		pollTimer:   stopped(),
		subResults:  make(chan subResult, 1),
	}
}

func (l *loop) run() {
	l.openFeed()
	l.read()
	for {
		select {
		case <-l.f.stopCh:
			l.shutdown()
			return
		case <-l.ctx.Done():
			l.shutdown()
			return
		case n, ok := <-l.sub:
			l.onNotification(n, ok)
		case r := <-l.subResults:
			l.onSubscribed(r)
		case <-l.claimTimer.C:
			l.claim()
		case <-l.renewTimer.C:
			l.renew(l.ctx)
		case <-l.leaseLost:
			l.onLeaseLost()
		case <-l.reopenTimer.C:
			l.openFeed()
		case <-l.pollTimer.C:
			l.read()
			if l.sub == nil {
				l.pollTimer.Reset(l.t.HeartbeatInterval)
			}
		case r := <-l.f.reqs:
			r.reply <- l.onRequest(r)
		}
	}
}

// emit queues an event for the reader of Events and logs it.
func (l *loop) emit(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	switch e.Type {
	case EventElected, EventUnelected, EventNewLeader, EventSubscribeError, EventSubscribeStarted, EventIgnored:
		l.f.log.Info("leaderfeed: " + e.String())
	default:
		l.f.log.Debug("leaderfeed: " + e.String())
	}
	l.f.events.push(e)
}

// ---- the changefeed ----

// openFeed opens the changefeed in a goroutine of its own, so that a slow
// Subscribe never holds up renewals. While it is down the record is polled.
func (l *loop) openFeed() {
	if l.opening || l.sub != nil {
		return
	}
	l.opening = true
	ctx, cancel := context.WithCancel(l.ctx)
	l.openCancel = cancel
	l.f.wg.Add(1)
	go func() {
		defer l.f.wg.Done()
		ch, err := l.f.b.Subscribe(ctx)
		if err != nil {
			cancel()
		}
		l.subResults <- subResult{ch: ch, cancel: cancel, err: err} // buffered: one open at a time
	}()
}

func (l *loop) onSubscribed(r subResult) {
	l.opening = false
	if r.err != nil {
		l.feedDown(fmt.Errorf("leaderfeed: subscribe: %w", r.err))
		return
	}
	l.sub, l.subCancel, l.subOpened = r.ch, r.cancel, time.Now()
	l.pollTimer.Stop()
	l.emit(Event{Type: EventSubscribeStarted})
	// Changes committed while the feed was down are not in it: read.
	l.read()
}

// feedDown records a failure of the feed, schedules its reopening with
// backoff and starts polling.
func (l *loop) feedDown(err error) {
	if l.subCancel != nil {
		l.subCancel()
		l.subCancel = nil
	}
	l.sub = nil
	base := max(time.Millisecond, l.t.HeartbeatInterval/20)
	if l.backoff == 0 || (!l.subOpened.IsZero() && time.Since(l.subOpened) > l.t.ElectionTimeoutMin) {
		l.backoff = base
	} else {
		l.backoff = min(2*l.backoff, l.t.ElectionTimeoutMax)
	}
	l.subOpened = time.Time{}
	l.emit(Event{Type: EventSubscribeError, Err: err})
	l.reopenTimer.Reset(l.backoff + l.jitter(l.backoff/2))
	l.pollTimer.Reset(l.t.HeartbeatInterval)
}

func (l *loop) onNotification(n Notification, ok bool) {
	if !ok {
		l.feedDown(errors.New("leaderfeed: changefeed closed without an error"))
		return
	}
	switch n.Type {
	case RecordChanged:
		l.observe(n.Record, false)
	case RecordDeleted:
		l.observeMissing(false)
	case OtherChanged:
		l.emit(Event{Type: EventChange, Change: n.Change})
	case Ignored:
		l.emit(Event{Type: EventIgnored, Err: n.Err})
	case Failed:
		err := n.Err
		if err == nil {
			err = errors.New("leaderfeed: changefeed failed")
		}
		l.feedDown(err)
	default:
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: backend sent a notification of unknown type %v", n.Type)})
	}
}

// ---- observing the record ----

// read gets the record from the store. Leaders skip it: their renewals
// find out everything a read would.
func (l *loop) read() {
	if l.leading {
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.t.ElectionTimeoutMin)
	r, err := l.f.b.Get(ctx)
	cancel()
	switch {
	case err == nil:
		l.observe(r, true)
	case errors.Is(err, ErrNotFound):
		l.observeMissing(true)
	case errors.Is(err, ErrMalformedRecord):
		l.emit(Event{Type: EventIgnored, Err: err})
		l.armClaim(false)
	case l.ctx.Err() != nil:
	default:
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: read record: %w", err)})
		l.armClaim(false)
	}
}

// observe takes in a record. Records from the feed older than or equal to
// the one known are stale and ignored; authoritative ones (a read, a write's
// result, a conflict's current record) are taken whenever their revision
// differs, which also covers a record that was deleted and created anew.
func (l *loop) observe(r heartbeat.Record, authoritative bool) {
	if r.Revision == 0 {
		l.observeMissing(authoritative)
		return
	}
	if l.seen && !l.missing {
		if r.Revision == l.rec.Revision || (!authoritative && r.Revision < l.rec.Revision) {
			return
		}
	}
	now := time.Now()
	l.rec, l.seen, l.missing, l.deleted, l.observedAt = r.Clone(), true, false, false, now
	l.maxTerm = max(l.maxTerm, r.Term)
	l.f.mu.Lock()
	l.f.snap.record, l.f.snap.seen = l.rec.Clone(), true
	l.f.mu.Unlock()
	l.f.log.Debug("leaderfeed: record", "leader", r.Leader, "term", r.Term, "revision", r.Revision)
	l.announce(r.Leader, r.Term, r.Value, now)

	if l.leading {
		if r.Leader == l.f.id && r.Term == l.term {
			// Our own write (possibly one whose reply we lost): only this
			// node writes its id with this term.
			l.myRev = max(l.myRev, r.Revision)
			return
		}
		l.stepDown(ReasonDeposed, fmt.Errorf("leaderfeed: record names %q with term %d", r.Leader, r.Term))
	}
	l.armClaim(true)
}

// observeMissing takes in that the store has no record.
func (l *loop) observeMissing(authoritative bool) {
	if l.missing && l.seen {
		return
	}
	wasSeen := l.seen && !l.missing
	now := time.Now()
	l.rec = heartbeat.Record{Election: l.f.b.Election()}
	l.seen, l.missing, l.deleted, l.observedAt = true, true, wasSeen, now
	l.f.mu.Lock()
	l.f.snap.record, l.f.snap.seen = l.rec.Clone(), true
	l.f.mu.Unlock()
	l.announce("", l.maxTerm, nil, now)
	if l.leading {
		l.stepDown(ReasonDeposed, errors.New("leaderfeed: election record was deleted"))
	}
	l.armClaim(true)
}

func (l *loop) announce(leader string, term uint64, value []byte, at time.Time) {
	if l.announced.ok && l.announced.leader == leader && l.announced.term == term && bytes.Equal(l.announced.value, value) {
		return
	}
	l.announced.leader, l.announced.term, l.announced.value, l.announced.ok = leader, term, bytes.Clone(value), true
	l.emit(Event{Type: EventNewLeader, At: at, Leader: leader, Term: term, Value: bytes.Clone(value)})
}

// armClaim (re)arms the election timer of a follower. fresh says the known
// revision just changed, so a new random timeout is drawn; otherwise (after
// a failed attempt) it retries after a heartbeat interval, never earlier than
// the timeout allows.
func (l *loop) armClaim(fresh bool) {
	if l.leading || l.f.opts.ObserveOnly {
		l.claimTimer.Stop()
		return
	}
	var d time.Duration
	switch {
	case l.claimableAtOnce():
		d = l.t.Jitter(l.f.opts.Rand)
		if !fresh {
			d += l.t.HeartbeatInterval
		}
	case fresh:
		d = time.Until(l.observedAt.Add(l.t.ElectionTimeout(l.f.opts.Rand)))
	default:
		d = max(l.t.HeartbeatInterval, time.Until(l.observedAt.Add(l.t.ElectionTimeoutMin)))
	}
	l.claimTimer.Reset(max(d, 0))
}

// claimableAtOnce: a vacancy a leader made by resigning (not our own), or an
// election whose record never existed.
func (l *loop) claimableAtOnce() bool {
	if l.missing {
		return !l.deleted
	}
	return l.rec.Vacant() && l.rec.Revision != l.ownVacancy
}

func (l *loop) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if l.f.opts.Rand != nil {
		return time.Duration(l.f.opts.Rand.Int64N(int64(d) + 1))
	}
	return heartbeat.Timing{VacancyJitter: d}.Jitter(nil)
}

// ---- campaigning and leading ----

func (l *loop) claim() {
	if l.leading || l.f.opts.ObserveOnly {
		return
	}
	expected := l.rec.Revision
	next := heartbeat.Record{
		Election: l.f.b.Election(),
		Leader:   l.f.id,
		Term:     max(l.maxTerm, l.rec.Term) + 1,
		Value:    l.value,
	}
	sentAt := time.Now()
	ctx, cancel := context.WithTimeout(l.ctx, l.t.LeaseDuration)
	res, err := l.f.b.Heartbeat(ctx, expected, next)
	cancel()
	now := time.Now()
	var conflict *ConflictError
	switch {
	case err == nil:
		if res.Revision != expected+1 || res.Leader != next.Leader || res.Term != next.Term {
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: backend returned %v for a claim of term %d on revision %d", res, next.Term, expected)})
			l.observe(res, true)
			l.armClaim(false)
			return
		}
		if !now.Before(sentAt.Add(l.t.LeaseDuration)) {
			// Won, but the lease that the claim granted is already over. Act
			// as a follower; the record will time out like any other.
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim of term %d took %v, longer than the lease: %w", next.Term, now.Sub(sentAt), errLeaseOver)})
			l.observe(res, true)
			return
		}
		l.becomeLeader(res, sentAt, now)
	case errors.As(err, &conflict):
		l.f.log.Debug("leaderfeed: claim lost", "term", next.Term, "current_revision", conflict.Current.Revision)
		l.observe(conflict.Current, true)
		l.armClaim(false)
	case l.ctx.Err() != nil:
	default:
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim term %d: %w", next.Term, err)})
		l.armClaim(false)
	}
}

func (l *loop) becomeLeader(res heartbeat.Record, sentAt, now time.Time) {
	l.claimTimer.Stop()
	l.leading, l.term, l.myRev, l.lastErr = true, res.Term, res.Revision, nil
	l.leaseEnd = sentAt.Add(l.t.LeaseDuration)
	l.leaderCtx = newLeaseContext(l.ctx, l.leaseEnd)
	l.leaderCancel = l.leaderCtx.cancel
	cancel, lost := l.leaderCancel, l.leaseLost
	l.leaseTimer = time.AfterFunc(l.leaseEnd.Sub(now), func() {
		cancel()
		select {
		case lost <- struct{}{}:
		default:
		}
	})
	l.f.mu.Lock()
	l.f.snap.leader, l.f.snap.term, l.f.snap.leaderCtx = true, l.term, l.leaderCtx
	l.f.leaseEnd = l.leaseEnd
	l.f.mu.Unlock()
	l.emit(Event{Type: EventElected, At: now, Term: l.term, LeaderCtx: l.leaderCtx})
	l.observe(res, true)
	l.renewTimer.Reset(max(0, time.Until(sentAt.Add(l.t.HeartbeatInterval))))
}

// renew writes the heartbeat of the leader: a compare-and-set on its own
// last revision. parent bounds it besides the lease.
func (l *loop) renew(parent context.Context) error {
	if !l.leading {
		return ErrNotLeader
	}
	next := heartbeat.Record{Election: l.f.b.Election(), Leader: l.f.id, Term: l.term, Value: l.value}
	sentAt := time.Now()
	ctx, cancel := context.WithDeadline(parent, l.leaseEnd)
	stop := context.AfterFunc(l.ctx, cancel)
	res, err := l.f.b.Heartbeat(ctx, l.myRev, next)
	stop()
	cancel()
	now := time.Now()
	var conflict *ConflictError
	switch {
	case err == nil:
		newEnd := sentAt.Add(l.t.LeaseDuration)
		if !l.leaseTimer.Stop() || !now.Before(newEnd) || !l.leaderCtx.extend(newEnd) {
			// The lease ran out before the reply: leadership is over. Its
			// timer may have fired without its signal being handled yet,
			// or not have fired at all (Stop just stopped it late), so
			// step down here rather than through onLeaseLost, which
			// would take an uncancelled leader context for a signal of an
			// earlier term and leave this node leading with no lease and
			// no renewals.
			l.lastErr = errLeaseOver
			l.stepDown(ReasonLeaseExpired, errLeaseOver)
			l.observe(res, true)
			return errLeaseOver
		}
		l.leaseEnd = newEnd
		l.leaseTimer.Reset(newEnd.Sub(now))
		l.f.mu.Lock()
		l.f.leaseEnd = newEnd
		l.f.mu.Unlock()
		l.myRev, l.lastErr = res.Revision, nil
		l.f.log.Debug("leaderfeed: renewed", "term", l.term, "revision", res.Revision)
		l.observe(res, true)
		l.renewTimer.Reset(max(0, time.Until(sentAt.Add(l.t.HeartbeatInterval))))
		return nil
	case errors.As(err, &conflict) && conflict.Current.Leader == l.f.id && conflict.Current.Term == l.term:
		// The store holds our own later write: an earlier renewal committed
		// but its reply was lost. Only this node writes its id with this
		// term, so take the revision and renew on it at once; the lease
		// still runs from the last renewal whose reply came back.
		l.myRev = conflict.Current.Revision
		l.renewTimer.Reset(0)
		return fmt.Errorf("leaderfeed: renew: reply of an earlier renewal was lost: %w", err)
	case errors.As(err, &conflict):
		l.stepDown(ReasonDeposed, err)
		l.observe(conflict.Current, true)
		l.armClaim(false)
		return fmt.Errorf("leaderfeed: renew: %w", err)
	default:
		l.lastErr = err
		if l.ctx.Err() == nil {
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: renew term %d: %w", l.term, err)})
		}
		// Retry soon; the lease timer steps down if no retry gets through.
		l.renewTimer.Reset(max(time.Millisecond, l.t.HeartbeatInterval/5))
		return fmt.Errorf("leaderfeed: renew: %w", err)
	}
}

func (l *loop) onLeaseLost() {
	if !l.leading || l.leaderCtx.Err() == nil {
		return // a signal of an earlier term
	}
	l.stepDown(ReasonLeaseExpired, l.lastErr)
	l.armClaim(false)
}

// stepDown ends this node's leadership: the leader context is cancelled
// before anything else. The event's At is the end of the lease when it ran
// out, else the moment after the cancellation (never after the lease's
// end): no holder of the leader context finds it live after At.
func (l *loop) stepDown(reason Reason, err error) {
	if !l.leading {
		return
	}
	l.leaderCancel()
	at := time.Now()
	l.leaseTimer.Stop()
	l.renewTimer.Stop()
	if reason == ReasonLeaseExpired || at.After(l.leaseEnd) {
		at = l.leaseEnd
	}
	l.leading = false
	l.f.mu.Lock()
	l.f.snap.leader = false
	l.f.mu.Unlock()
	l.emit(Event{Type: EventUnelected, At: at, Term: l.term, Reason: reason, Err: err})
}

// writeVacancy writes the vacant record after stepping down, bounded by
// ctx and the loop's context.
func (l *loop) writeVacancy(ctx context.Context) (heartbeat.Record, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.ctx, cancel)
	defer stop()
	return l.f.b.Heartbeat(ctx, l.myRev, heartbeat.Record{Election: l.f.b.Election(), Term: l.term})
}

func (l *loop) onRequest(r request) error {
	switch r.kind {
	case reqResign:
		if !l.leading {
			return ErrNotLeader
		}
		l.stepDown(ReasonResigned, nil)
		res, err := l.writeVacancy(r.ctx)
		var conflict *ConflictError
		switch {
		case err == nil:
			l.ownVacancy = res.Revision
			l.observe(res, true)
			return nil
		case errors.As(err, &conflict):
			l.observe(conflict.Current, true) // someone took over already
			l.armClaim(false)
			return nil
		default:
			l.armClaim(false)
			return fmt.Errorf("leaderfeed: resign: vacant record not written (the others take over after their election timeout): %w", err)
		}
	case reqProclaim:
		if !l.leading {
			return ErrNotLeader
		}
		l.value = r.value
		return l.renew(r.ctx)
	}
	return fmt.Errorf("leaderfeed: unknown request %d", r.kind)
}

// shutdown runs when Stop is called: step down, write the vacancy, stop the
// feed and wait for it to close.
func (l *loop) shutdown() {
	if l.leading {
		l.stepDown(ReasonStopped, nil)
		l.f.mu.Lock()
		ctx := l.f.stopCtx
		l.f.mu.Unlock()
		if ctx == nil {
			ctx = context.Background()
		}
		if _, err := l.writeVacancy(ctx); err != nil && !errors.Is(err, ErrConflict) {
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: stop: vacant record not written: %w", err)})
		}
	}
	for _, t := range []*time.Timer{l.claimTimer, l.renewTimer, l.reopenTimer, l.pollTimer} {
		t.Stop()
	}
	if l.subCancel != nil {
		l.subCancel()
	}
	if l.opening { // cancel the open, wait for it, close what it opened
		l.openCancel()
		r := <-l.subResults
		if r.err == nil {
			r.cancel()
			l.sub = r.ch
		}
	}
	// The backend closes the channel promptly once its context is done.
	if l.sub != nil {
		for range l.sub {
		}
	}
}

// leaseContext is the leader context of one term. Its timer (see
// becomeLeader) cancels it when the lease ends, but a timer can fire late:
// on a loaded machine by milliseconds, in a process that was paused
// (SIGSTOP, a VM freeze) by the whole pause. So Err also compares the clock
// with the lease's end and cancels the context itself once it has passed:
// a holder that checks Err never finds the context live after the lease
// ended. Done closes when the context is cancelled, by the timer or by Err;
// contexts derived from it follow Done.
type leaseContext struct {
	context.Context
	cancel context.CancelFunc

	mu  sync.Mutex
	end time.Time // the lease's end, on this process's monotonic clock
}

func newLeaseContext(parent context.Context, end time.Time) *leaseContext {
	ctx, cancel := context.WithCancel(parent)
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
		c.cancel()
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
		c.cancel()
		return false
	}
	c.end = end
	return true
}
