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

// role is what a node does in the election now.
type role int

const (
	roleObserver  role = iota + 1 // ObserveOnly: follows, never claims
	roleFollower                  // waits for the election timeout
	roleCandidate                 // a claim is in flight
	roleLeader                    // holds a lease
	roleStopping                  // Stop was called: finishing the last write
)

func (r role) String() string {
	return [...]string{"?", "observer", "follower", "candidate", "leader", "stopping"}[r]
}

// loop is the one goroutine that owns a Feed's election state. It never
// calls the store: every store call (claim, renewal, vacancy, read,
// Subscribe) runs on a goroutine of its own and its result comes back as an
// input, so Resign, Proclaim, Stop and the getters are answered whatever
// the store does. At most one write (claim, renewal or vacancy) is in
// flight at a time, and at most one read.
//
// # Why there is never more than one leader
//
// A node leads on revision R from the SEND time s of the compare-and-set
// (claim or renewal) that wrote R until s+LeaseDuration, on its own
// monotonic clock, and only if the reply came back before that (the lease
// context's Err checks the clock; every transition to leading checks it).
// Any other node's successful compare-and-set must be on R or a later
// revision, so it happens after R was committed, hence after s. A node
// sends a claim on revision R only in these cases (claimDue):
//
//  1. It first observed R at least W ago, and has seen no newer revision
//     since, where W is the larger of its own ElectionTimeoutMin and
//     heartbeat.FollowerWait(R.Lease). R.Lease is the writer's own
//     LeaseDuration, written into R by the same compare-and-set. The node
//     observed R after R was committed, so after s; the claim is sent
//     after s+W > s+R.Lease: the lease R granted has ended, whatever the
//     writer's Timing. (W exceeds R.Lease by at least a tenth of W, the
//     margin for clock rates and scheduling. For a record without a lease,
//     written before records carried one, W is ElectionTimeoutMin and the
//     Timing rule LeaseDuration < ElectionTimeoutMin is what holds, as long
//     as all nodes share a Timing.) A deleted record counts with the lease
//     of the last record seen before it.
//  2. R is vacant. Vacancies are written only by the holder of R-1's term
//     after it stepped down (stepDown cancels the leader context before the
//     vacancy is sent), so R grants nobody a lease.
//  3. R was written by this node itself (a record naming it with the term
//     it last claimed), and it does not lead on R: a claim or renewal whose
//     reply came after its lease, or was lost, or a lease that ran out
//     while a renewal was in flight. The only lease R can have granted is
//     this node's own, which it does not hold; it claims with a new term.
//  4. The store never had a record (Revision 0): nobody ever led.
//
// A claim on an older revision than the store's fails the compare-and-set.
// So when a claim succeeds, every earlier lease has ended: never two
// leaders. Terms strictly increase because a claim writes a term above
// every term the node has seen, and the compare-and-set orders the writes.
type loop struct {
	f       *Feed
	ctx     context.Context // cancelled when the Feed stops for good
	t       heartbeat.Timing
	exited  chan struct{}   // closed when run returns
	results chan callResult // results of store calls
	role    role

	// What this node knows of the record.
	rec        heartbeat.Record // newest record observed; Revision 0: none
	seen       bool             // rec was read or notified at least once
	missing    bool             // the store has no record (never had, or deleted)
	deleted    bool             // ... because it was deleted after we saw it
	observedAt time.Time        // when rec.Revision was first observed
	recLease   time.Duration    // the Lease of rec, kept when the record is deleted
	maxTerm    uint64           // the highest term ever observed
	announced  struct {
		leader string
		term   uint64
		value  []byte
		ok     bool
	}
	claimTerm   uint64    // the term of this node's last claim; a record naming it with it is its own
	vacancyTerm uint64    // a vacant record with this term was written by this node (0: none)
	handedOver  bool      // Resign or Stop gave up the last term: its record is not claimed at once
	claimSoon   bool      // claim the own record at once (a late claim)
	claimSentAt time.Time // when this node's last claim was sent
	value       []byte

	// Leadership: set while leading.
	term      uint64
	myRev     uint64 // newest revision this node wrote in its term
	leaseEnd  time.Time
	leaderCtx *leaseContext
	leaseLost chan struct{}
	lastErr   error

	writing    bool           // a claim, renewal or vacancy is in flight
	reading    bool           // a read is in flight
	readAgain  bool           // a read was asked for while one was in flight
	readFailed bool           // the last read failed: poll until one succeeds
	vacancy    *vacancyWrite  // the vacancy to write (pending or in flight)
	proclaims  []chan<- error // Proclaim calls waiting for a renewal
	renewNow   bool           // renew as soon as the write in flight returns

	claimTimer  *time.Timer
	renewTimer  *time.Timer
	reopenTimer *time.Timer
	pollTimer   *time.Timer

	// The changefeed.
	sub        <-chan Notification
	subCancel  context.CancelFunc
	subOpened  time.Time
	opening    bool
	subResults chan subResult
	backoff    time.Duration
}

// vacancyWrite is a vacancy to write after stepping down, for Resign (reply
// set) or Stop.
type vacancyWrite struct {
	ctx      context.Context
	reply    chan<- error
	term     uint64
	attempts int
	inFlight bool
}

type callKind int

const (
	callRead callKind = iota + 1
	callClaim
	callRenew
	callVacancy
)

// callResult is the outcome of one store call, an input of the loop.
type callResult struct {
	kind     callKind
	expected heartbeat.Record
	next     heartbeat.Record
	sentAt   time.Time
	res      heartbeat.Record
	err      error
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
	r := roleFollower
	if f.opts.ObserveOnly {
		r = roleObserver
	}
	return &loop{
		f:           f,
		ctx:         ctx,
		t:           f.timing,
		role:        r,
		exited:      make(chan struct{}),
		results:     make(chan callResult),
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
	defer l.exit()
	l.noteStart()
	l.openFeed()
	l.startRead()
	l.pollTimer.Reset(l.t.HeartbeatInterval) // until the feed is up
	stopCh := l.f.stopCh
	for {
		if l.role == roleStopping && !l.writing && l.vacancy == nil {
			return
		}
		select {
		case <-stopCh:
			stopCh = nil
			l.onStop()
		case <-l.ctx.Done():
			return
		case n, ok := <-l.sub:
			l.noteNotification(n, ok)
			l.onNotification(n, ok)
		case r := <-l.subResults:
			l.noteSubscribed(r)
			l.onSubscribed(r)
		case r := <-l.results:
			l.onResult(r)
			l.noteResult(r)
		case <-l.claimTimer.C:
			l.onClaimTimer()
		case <-l.renewTimer.C:
			l.startRenew()
		case <-l.leaseLost:
			l.onLeaseLost()
		case <-l.reopenTimer.C:
			l.openFeed()
		case <-l.pollTimer.C:
			if l.sub == nil || (l.readFailed && (l.role == roleFollower || l.role == roleObserver)) {
				l.startRead()
				l.pollTimer.Reset(l.t.HeartbeatInterval)
			}
		case r := <-l.f.reqs:
			l.onRequest(r)
		}
	}
}

// exit ends the engine: the leader context is cancelled (Stop's context
// ended before the clean path finished), the store calls are cancelled,
// and the subscriptions end once their readers took what is queued.
func (l *loop) exit() {
	if l.role == roleLeader {
		l.stepDown(ReasonStopped, nil)
	}
	if l.vacancy != nil && l.vacancy.reply != nil {
		l.vacancy.reply <- ErrClosed
	}
	for _, t := range []*time.Timer{l.claimTimer, l.renewTimer, l.reopenTimer, l.pollTimer} {
		t.Stop()
	}
	if l.subCancel != nil {
		l.subCancel()
	}
	close(l.exited)
	l.f.cancel()
	l.f.events.finish()
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
	l.f.events.push(e)
}

// ---- store calls, off the loop's goroutine ----

// call runs one store call on a goroutine of its own; its result comes back
// on l.results (dropped if the loop has ended).
func (l *loop) call(kind callKind, ctx context.Context, cancel context.CancelFunc, expected, next heartbeat.Record) {
	r := callResult{kind: kind, expected: expected, next: next, sentAt: time.Now()}
	l.f.wg.Add(1)
	go func() {
		defer l.f.wg.Done()
		defer cancel()
		if kind == callRead {
			r.res, r.err = l.f.b.Get(ctx)
		} else {
			r.res, r.err = l.f.b.Heartbeat(ctx, expected, next)
		}
		select {
		case l.results <- r:
		case <-l.exited:
		}
	}()
}

func (l *loop) onResult(r callResult) {
	switch r.kind {
	case callRead:
		l.reading = false
		l.onRead(r)
		if l.readAgain {
			l.readAgain = false
			l.startRead()
		}
		return
	case callClaim:
		l.writing = false
		l.onClaim(r)
	case callRenew:
		l.writing = false
		l.onRenew(r)
	case callVacancy:
		l.writing = false
		l.onVacancy(r)
	}
	l.afterWrite()
}

// afterWrite starts what waited for the write that just returned.
func (l *loop) afterWrite() {
	if l.writing {
		return
	}
	switch {
	case l.vacancy != nil:
		l.startVacancy()
	case l.role == roleLeader && l.renewNow:
		// A renewal asked for while the write was in flight (Proclaim,
		// or a renewal whose reply was lost). Proclaims waiting after a
		// failed renewal wait for its retry (renewTimer): renewing again
		// at once would spin as fast as the store fails.
		l.renewNow = false
		l.startRenew()
	case l.role == roleFollower:
		l.armClaim(false)
	}
}

// ---- the changefeed ----

// openFeed opens the changefeed in a goroutine of its own. While it is
// down (also before it first opens) the record is polled.
func (l *loop) openFeed() {
	if l.opening || l.sub != nil {
		return
	}
	l.opening = true
	ctx, cancel := context.WithCancel(l.ctx)
	l.f.wg.Add(1)
	go func() {
		defer l.f.wg.Done()
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

func (l *loop) onSubscribed(r subResult) {
	l.opening = false
	if r.err != nil {
		l.feedDown(fmt.Errorf("leaderfeed: subscribe: %w", r.err))
		return
	}
	if l.role == roleStopping {
		r.cancel()
		return
	}
	l.sub, l.subCancel, l.subOpened = r.ch, r.cancel, time.Now()
	l.pollTimer.Stop()
	l.emit(Event{Type: EventSubscribeStarted})
	// Changes committed while the feed was down are not in it: read.
	l.startRead()
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

// startRead reads the record. Leaders skip it: their renewals find out
// everything a read would.
func (l *loop) startRead() {
	if l.role == roleLeader || l.role == roleStopping {
		return
	}
	if l.reading {
		// The read in flight may have been answered before what this
		// read is for (a feed just opened): read once more after it.
		l.readAgain = true
		return
	}
	l.reading = true
	ctx, cancel := context.WithTimeout(l.ctx, l.t.ElectionTimeoutMin)
	l.call(callRead, ctx, cancel, heartbeat.Record{}, heartbeat.Record{})
}

func (l *loop) onRead(r callResult) {
	// A failed read is retried every heartbeat interval, also while the
	// feed is up: the feed reports changes, not the record as it is, so a
	// node whose read failed would otherwise wait for the next change,
	// forever in an election nobody writes (vacant, or its leader gone).
	l.readFailed = r.err != nil && !errors.Is(r.err, ErrNotFound) && !errors.Is(r.err, ErrMalformedRecord) && l.ctx.Err() == nil
	if l.role != roleFollower && l.role != roleObserver {
		return // a leader's or candidate's writes know better
	}
	if l.readFailed {
		l.pollTimer.Reset(l.t.HeartbeatInterval)
	}
	// A read sent before the last observation may be older than it: it is
	// then taken only if its revision is newer.
	fresh := !l.seen || !r.sentAt.Before(l.observedAt)
	switch err := r.err; {
	case err == nil:
		l.observe(r.res, fresh)
	case errors.Is(err, ErrNotFound):
		if fresh {
			l.observeMissing(true)
		}
	case errors.Is(err, ErrMalformedRecord):
		l.emit(Event{Type: EventIgnored, Err: err})
		l.armClaim(false)
	case l.ctx.Err() != nil:
	default:
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: read record: %w", err)})
		l.armClaim(false)
	}
}

// own reports whether r is a record this node wrote in this process: it
// names this node with the term of its last claim.
func (l *loop) own(r heartbeat.Record) bool {
	return r.Revision != 0 && l.claimTerm != 0 && r.Leader == l.f.id && r.Term == l.claimTerm
}

// observe takes in a record. The known write again and records from the
// feed older than the one known are ignored; authoritative ones (a read, a
// write's result, a conflict's current record) are taken whenever they are
// another write, which also covers a record that was deleted and created
// anew.
func (l *loop) observe(r heartbeat.Record, authoritative bool) {
	if r.Revision == 0 {
		l.observeMissing(authoritative)
		return
	}
	if l.seen && !l.missing {
		// The same write again, or an older one from the feed. A record of
		// the known revision but another leader or term is another write: a
		// store that lost an acknowledged write hands a revision out twice.
		if r.SameWrite(l.rec) || (!authoritative && r.Revision < l.rec.Revision) {
			return
		}
	}
	now := time.Now()
	l.rec, l.seen, l.missing, l.deleted, l.observedAt = r.Clone(), true, false, false, now
	l.recLease = r.Lease
	l.maxTerm = max(l.maxTerm, r.Term)
	l.f.mu.Lock()
	l.f.snap.record, l.f.snap.seen = l.rec.Clone(), true
	l.f.health.LastRecord = now
	l.f.mu.Unlock()
	l.f.log.Debug("leaderfeed: record", "leader", r.Leader, "term", r.Term, "revision", r.Revision)
	if l.role == roleLeader {
		if r.Leader == l.f.id && r.Term == l.term {
			// Our own write (possibly one whose reply we lost): only this
			// node writes its id with this term.
			l.myRev = max(l.myRev, r.Revision)
			l.announce(r.Leader, r.Term, r.Value, now)
			return
		}
		// Leadership ends before anything else is reported.
		l.stepDown(ReasonDeposed, fmt.Errorf("leaderfeed: record names %q with term %d", r.Leader, r.Term))
	}
	if l.vacancy != nil && l.own(r) {
		l.myRev = max(l.myRev, r.Revision)
	}
	if l.role == roleCandidate && r.Leader == l.f.id && r.Term == l.claimTerm {
		// The feed brought this node's claim before the claim's reply:
		// announce it when the reply is in (onClaim), after EventElected
		// if it won, so that no reader sees this node as the new leader
		// before its own elected event.
		l.armClaim(true)
		return
	}
	l.announce(r.Leader, r.Term, r.Value, now)
	l.armClaim(true)
}

// observeMissing takes in that the store has no record.
func (l *loop) observeMissing(authoritative bool) {
	if l.missing && l.seen {
		return
	}
	_ = authoritative
	wasSeen := l.seen && !l.missing
	now := time.Now()
	l.rec = heartbeat.Record{Election: l.f.b.Election()}
	l.seen, l.missing, l.deleted, l.observedAt = true, true, wasSeen, now
	l.f.mu.Lock()
	l.f.snap.record, l.f.snap.seen = l.rec.Clone(), true
	l.f.mu.Unlock()
	if l.role == roleLeader {
		l.stepDown(ReasonDeposed, errors.New("leaderfeed: election record was deleted"))
	}
	l.announce("", l.maxTerm, nil, now)
	l.armClaim(true)
}

func (l *loop) announce(leader string, term uint64, value []byte, at time.Time) {
	if l.announced.ok && l.announced.leader == leader && l.announced.term == term && bytes.Equal(l.announced.value, value) {
		return
	}
	l.announced.leader, l.announced.term, l.announced.value, l.announced.ok = leader, term, bytes.Clone(value), true
	l.emit(Event{Type: EventNewLeader, At: at, Leader: leader, Term: term, Value: bytes.Clone(value)})
}

// ---- campaigning ----

// claimableAtOnce: cases 2 to 4 of the safety argument (see loop): a
// vacancy made by another node, a record this node wrote and does not
// lead on, or an election whose record never existed.
func (l *loop) claimableAtOnce() bool {
	if l.missing {
		return !l.deleted
	}
	if l.rec.Vacant() {
		return l.vacancyTerm == 0 || l.rec.Term != l.vacancyTerm
	}
	return l.own(l.rec) && !l.handedOver
}

// claimDue reports whether a claim on the known revision may be sent now:
// case 1 of the safety argument, or one of the others.
func (l *loop) claimDue(now time.Time) bool {
	return l.claimableAtOnce() || !now.Before(l.observedAt.Add(l.claimWait()))
}

// claimWait is W of case 1: how long after observing the known revision a
// claim on it may be sent. The record's lease, written by its writer, wins
// over this node's own timing when it is longer: nodes of different
// Timings then never lead at once.
func (l *loop) claimWait() time.Duration {
	return max(l.t.ElectionTimeoutMin, heartbeat.FollowerWait(l.recLease))
}

// armClaim (re)arms the election timer of a follower. fresh says the known
// revision just changed, so a new random timeout is drawn; otherwise (after
// a failed attempt) it retries after a heartbeat interval, never earlier than
// the timeout allows.
func (l *loop) armClaim(fresh bool) {
	if l.role != roleFollower {
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
		if l.own(l.rec) {
			d = l.t.HeartbeatInterval // after a failed attempt
			if fresh || l.claimSoon {
				// At once, but not sooner than a heartbeat after the
				// last claim: a store that loses every reply must not
				// get a storm of claims.
				d = time.Until(l.claimSentAt.Add(l.t.HeartbeatInterval))
			}
		}
	case fresh:
		// The random timeout, moved later as a whole when the record's
		// lease asks for a longer wait than this node's own timing.
		d = time.Until(l.observedAt.Add(l.t.ElectionTimeout(l.f.opts.Rand) + l.claimWait() - l.t.ElectionTimeoutMin))
	default:
		d = max(l.t.HeartbeatInterval, time.Until(l.observedAt.Add(l.claimWait())))
	}
	l.claimTimer.Reset(max(d, 0))
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

func (l *loop) onClaimTimer() {
	if l.role != roleFollower || l.writing || !l.seen {
		return
	}
	if !l.claimDue(time.Now()) {
		l.armClaim(false)
		return
	}
	l.claimSoon, l.handedOver = false, false
	next := heartbeat.Record{
		Election: l.f.b.Election(),
		Leader:   l.f.id,
		Term:     max(l.maxTerm, l.rec.Term) + 1,
		Value:    l.value,
		Lease:    l.t.LeaseDuration,
	}
	l.claimTerm = next.Term
	l.claimSentAt = time.Now()
	l.maxTerm = next.Term
	l.role, l.writing = roleCandidate, true
	ctx, cancel := context.WithTimeout(l.ctx, l.t.LeaseDuration)
	l.call(callClaim, ctx, cancel, l.rec, next)
}

func (l *loop) onClaim(r callResult) {
	l.handleClaim(r)
	// A record that observe held back while the claim was in flight (its
	// own claim, seen on the feed first) is announced now; announce skips
	// what was announced already.
	if l.seen && !l.missing && l.role != roleCandidate {
		l.announce(l.rec.Leader, l.rec.Term, l.rec.Value, time.Now())
	}
}

func (l *loop) handleClaim(r callResult) {
	now := time.Now()
	stopping := l.role == roleStopping
	if !stopping {
		l.role = roleFollower
	}
	var conflict *ConflictError
	switch {
	case r.err == nil:
		if r.res.Revision != r.expected.Revision+1 || r.res.Leader != r.next.Leader || r.res.Term != r.next.Term {
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: backend returned %v for a claim of term %d on revision %d", r.res, r.next.Term, r.expected.Revision)})
			l.observe(r.res, true)
			return
		}
		if stopping {
			// Won while stopping: hand over at once.
			l.term, l.myRev = r.res.Term, r.res.Revision
			l.vacancy = &vacancyWrite{ctx: l.stopCtx(), term: r.res.Term}
			l.vacancyTerm = r.res.Term
			l.observe(r.res, true)
			return
		}
		if !now.Before(r.sentAt.Add(l.t.LeaseDuration)) {
			// Won, but the lease the claim granted is over: the record is
			// ours and nobody leads on it, so claim it again at once
			// (case 3) rather than leave everyone waiting for a timeout.
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim of term %d took %v, longer than the lease: %w", r.next.Term, now.Sub(r.sentAt), errLeaseOver)})
			l.claimSoon = true
			l.observe(r.res, true)
			return
		}
		l.becomeLeader(r.res, r.sentAt, now)
	case errors.As(r.err, &conflict):
		l.f.log.Debug("leaderfeed: claim lost", "term", r.next.Term, "current_revision", conflict.Current.Revision)
		l.observe(conflict.Current, true)
	case l.ctx.Err() != nil:
	default:
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: claim term %d: %w", r.next.Term, r.err)})
	}
}

// ---- leading ----

// becomeLeader starts a term won by a claim sent at sentAt whose reply was
// checked against the lease at now. EventElected is stamped now, the instant
// the lease was known to run: a later clock reading could fall after the
// lease's end, and the lease-expired EventUnelected (stamped at that end)
// would then precede the term's start.
func (l *loop) becomeLeader(res heartbeat.Record, sentAt, now time.Time) {
	l.role = roleLeader
	l.term, l.myRev, l.lastErr = res.Term, res.Revision, nil
	l.leaseEnd = sentAt.Add(l.t.LeaseDuration)
	l.leaderCtx = newLeaseContext(l.leaseEnd)
	l.claimTimer.Stop()
	l.armLease()
	l.f.mu.Lock()
	l.f.snap.leader, l.f.snap.term, l.f.snap.leaderCtx = true, l.term, l.leaderCtx
	l.f.leaseEnd = l.leaseEnd
	l.f.mu.Unlock()
	l.emit(Event{Type: EventElected, At: now, Term: l.term, LeaderCtx: l.leaderCtx})
	l.observe(res, true)
	l.renewTimer.Reset(max(0, time.Until(l.renewAt(sentAt.Add(l.t.HeartbeatInterval)))))
}

// renewAt returns when the renewal due at due is sent: then, or a little
// earlier when the backend aligns the renewals of many elections so that
// they share batches (Elections). Renewing early is safe: the lease runs
// from the renewal's own send time.
func (l *loop) renewAt(due time.Time) time.Time {
	if a, ok := l.f.b.(interface {
		AlignRenewal(due time.Time, interval time.Duration) time.Time
	}); ok {
		if at := a.AlignRenewal(due, l.t.HeartbeatInterval); !at.After(due) && !at.Before(due.Add(-l.t.HeartbeatInterval/2)) {
			return at
		}
	}
	return due
}

// armLease (re)starts the timer that cancels the leader context at the end
// of the lease and tells the loop.
func (l *loop) armLease() {
	ctx, lost := l.leaderCtx, l.leaseLost
	d := time.Until(l.leaseEnd)
	if ctx.timer != nil {
		ctx.timer.Stop()
	}
	ctx.timer = time.AfterFunc(d, func() {
		ctx.cancel(ErrLeaseExpired)
		select {
		case lost <- struct{}{}:
		default:
		}
	})
}

// startRenew sends the leader's heartbeat: a compare-and-set on its own
// last revision, bounded by the lease.
func (l *loop) startRenew() {
	if l.role != roleLeader {
		return
	}
	if l.writing {
		l.renewNow = true
		return
	}
	l.writing = true
	next := heartbeat.Record{Election: l.f.b.Election(), Leader: l.f.id, Term: l.term, Value: l.value, Lease: l.t.LeaseDuration}
	ctx, cancel := context.WithDeadline(l.ctx, l.leaseEnd)
	l.call(callRenew, ctx, cancel, heartbeat.Record{Revision: l.myRev, Leader: l.f.id, Term: l.term}, next)
}

func (l *loop) onRenew(r callResult) {
	now := time.Now()
	leading := l.role == roleLeader && l.term == r.next.Term
	var conflict *ConflictError
	switch {
	case r.err == nil:
		l.myRev = max(l.myRev, r.res.Revision)
		if !leading {
			l.observe(r.res, true)
			return
		}
		newEnd := r.sentAt.Add(l.t.LeaseDuration)
		if !now.Before(newEnd) || !l.leaderCtx.extend(newEnd) {
			// The lease ran out before the reply: leadership is over (the
			// record is ours: case 3 lets this node claim it again).
			l.lastErr = errLeaseOver
			l.stepDown(ReasonLeaseExpired, errLeaseOver)
			l.observe(r.res, true)
			return
		}
		l.leaseEnd, l.lastErr = newEnd, nil
		l.armLease()
		l.f.mu.Lock()
		l.f.leaseEnd = newEnd
		l.f.mu.Unlock()
		l.f.log.Debug("leaderfeed: renewed", "term", l.term, "revision", r.res.Revision)
		l.replyProclaims(nil)
		l.observe(r.res, true)
		l.renewTimer.Reset(max(0, time.Until(l.renewAt(r.sentAt.Add(l.t.HeartbeatInterval)))))
	case errors.As(r.err, &conflict) && l.own(conflict.Current):
		// The store holds our own later write: an earlier renewal committed
		// but its reply was lost. Take the revision and renew on it at
		// once; the lease still runs from the last reply that came back.
		l.myRev = max(l.myRev, conflict.Current.Revision)
		if leading {
			l.renewNow = true
		} else {
			l.observe(conflict.Current, true)
		}
	case errors.As(r.err, &conflict):
		if leading {
			l.stepDown(ReasonDeposed, r.err)
		}
		l.observe(conflict.Current, true)
	default:
		if !leading {
			return
		}
		l.lastErr = r.err
		if l.ctx.Err() == nil {
			l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: renew term %d: %w", l.term, r.err)})
		}
		// Retry soon; the lease timer steps down if no retry gets through.
		l.renewTimer.Reset(max(time.Millisecond, l.t.HeartbeatInterval/5))
	}
}

func (l *loop) replyProclaims(err error) {
	for _, c := range l.proclaims {
		c <- err
	}
	l.proclaims = nil
}

func (l *loop) onLeaseLost() {
	if l.role != roleLeader || l.leaderCtx.Err() == nil {
		return // a signal of an earlier term, or of a lease since extended
	}
	l.stepDown(ReasonLeaseExpired, l.lastErr)
	l.afterWrite()
}

// stepDown ends this node's leadership: the leader context is cancelled
// (with the reason's cause) before anything else. The event's At is the end
// of the lease when it ran out, else the moment after the cancellation
// (never after the lease's end): no holder of the leader context finds it
// live after At.
func (l *loop) stepDown(reason Reason, err error) {
	if l.role != roleLeader {
		return
	}
	l.leaderCtx.cancel(reason.cause())
	at := time.Now()
	if l.leaderCtx.timer != nil {
		l.leaderCtx.timer.Stop()
	}
	l.renewTimer.Stop()
	l.renewNow = false
	if reason == ReasonLeaseExpired || at.After(l.leaseEnd) {
		at = l.leaseEnd
	}
	l.role = roleFollower
	l.f.mu.Lock()
	l.f.snap.leader = false
	l.f.mu.Unlock()
	l.replyProclaims(ErrNotLeader)
	l.emit(Event{Type: EventUnelected, At: at, Term: l.term, Reason: reason, Err: err})
}

// ---- handing over ----

func (l *loop) stopCtx() context.Context {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	if l.f.stopCtx == nil {
		return context.Background()
	}
	return l.f.stopCtx
}

// startVacancy writes the vacant record on the newest revision this node
// wrote, once no other write is in flight.
func (l *loop) startVacancy() {
	v := l.vacancy
	if v == nil || l.writing {
		return
	}
	if err := v.ctx.Err(); err != nil {
		l.endVacancy(fmt.Errorf("leaderfeed: vacant record not written: %w", err))
		return
	}
	l.writing, v.inFlight = true, true
	v.attempts++
	ctx, cancel := context.WithCancel(v.ctx)
	stop := context.AfterFunc(l.ctx, cancel)
	l.call(callVacancy, ctx, func() { stop(); cancel() }, heartbeat.Record{Revision: l.myRev, Leader: l.f.id, Term: v.term}, heartbeat.Record{Election: l.f.b.Election(), Term: v.term})
}

func (l *loop) endVacancy(err error) {
	v := l.vacancy
	l.vacancy = nil
	if v.reply != nil {
		v.reply <- err
	} else if err != nil {
		l.emit(Event{Type: EventError, Err: fmt.Errorf("leaderfeed: stop: %w", err)})
	}
	l.armClaim(false)
}

func (l *loop) onVacancy(r callResult) {
	v := l.vacancy
	v.inFlight = false
	var conflict *ConflictError
	switch {
	case r.err == nil:
		l.observe(r.res, true)
		l.endVacancy(nil)
	case errors.As(r.err, &conflict) && l.own(conflict.Current):
		// A renewal of ours committed with its reply lost: write the
		// vacancy on it (startVacancy runs again in afterWrite).
		l.myRev = conflict.Current.Revision
		if v.attempts >= 5 {
			l.endVacancy(fmt.Errorf("leaderfeed: vacant record not written: %w", r.err))
		}
	case errors.As(r.err, &conflict):
		// Either our own vacancy committed and its reply was lost, or
		// another node took over already: either way the election is
		// handed over.
		l.observe(conflict.Current, true)
		l.endVacancy(nil)
	default:
		// The vacancy may have committed: write it again while the
		// caller's context allows; a committed one comes back as a
		// conflict carrying it.
		if v.ctx.Err() != nil || l.ctx.Err() != nil || v.attempts >= 5 {
			l.endVacancy(fmt.Errorf("leaderfeed: vacant record not written (the others take over after their election timeout): %w", r.err))
		}
	}
}

func (l *loop) onRequest(r request) {
	switch r.kind {
	case reqResign:
		if l.role != roleLeader {
			r.reply <- ErrNotLeader
			return
		}
		l.stepDown(ReasonResigned, nil)
		l.handedOver = true
		l.vacancy = &vacancyWrite{ctx: r.ctx, reply: r.reply, term: l.term}
		l.vacancyTerm = l.term
		l.startVacancy()
	case reqProclaim:
		if l.role != roleLeader {
			r.reply <- ErrNotLeader
			return
		}
		l.value = r.value
		l.proclaims = append(l.proclaims, r.reply)
		l.startRenew()
	case reqStatus:
		r.reply <- nil
	default:
		r.reply <- fmt.Errorf("leaderfeed: unknown request %d", r.kind)
	}
}

// onStop: step down (EventUnelected first), then write the vacancy; the
// loop ends when no write is in flight.
func (l *loop) onStop() {
	wasLeader := l.role == roleLeader
	l.stepDown(ReasonStopped, nil)
	l.role = roleStopping
	l.claimTimer.Stop()
	l.pollTimer.Stop()
	l.reopenTimer.Stop()
	if wasLeader {
		l.handedOver = true
		l.vacancy = &vacancyWrite{ctx: l.stopCtx(), term: l.term}
		l.vacancyTerm = l.term
		l.startVacancy()
	}
}

// Causes of the end of a leader context, given by context.Cause on the
// leader context of a term (Event.LeaderCtx, Feed.LeaderContext, Run).
var (
	// ErrResigned: Resign was called.
	ErrResigned = errors.New("leaderfeed: leadership ended: resigned")
	// ErrDeposed: another node took over, or the record was deleted.
	ErrDeposed = errors.New("leaderfeed: leadership ended: deposed")
	// ErrLeaseExpired: no renewal got through before the lease ran out.
	ErrLeaseExpired = errors.New("leaderfeed: leadership ended: lease expired")
	// ErrStopped: Stop was called.
	ErrStopped = errors.New("leaderfeed: leadership ended: stopped")
)

func (r Reason) cause() error {
	switch r {
	case ReasonResigned:
		return ErrResigned
	case ReasonDeposed:
		return ErrDeposed
	case ReasonStopped:
		return ErrStopped
	}
	return ErrLeaseExpired
}

// leaseContext is the leader context of one term. Its timer (see
// becomeLeader) cancels it when the lease ends, but a timer can fire late:
// on a loaded machine by milliseconds, in a process that was paused
// (SIGSTOP, a VM freeze) by the whole pause. So Err also compares the clock
// with the lease's end and cancels the context itself once it has passed:
// a holder that checks Err never finds the context live after the lease
// ended. Done closes when the context is cancelled, by the timer or by Err;
// contexts derived from it follow Done. context.Cause says why it ended.
type leaseContext struct {
	context.Context
	cancel context.CancelCauseFunc

	timer *time.Timer // owned by the loop: cancels at the end of the lease

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
