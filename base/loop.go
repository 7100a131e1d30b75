package base

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/mailbox"
)

// loop is the driver of a Feed's machine: it owns the election state. Its
// inputs (results of store calls, timers, notifications of the feed,
// requests, Stop) arrive in one mailbox, in the order they came; its
// goroutine runs only while the mailbox holds inputs, and hands each to
// machine.step with the time it read after taking the input, then executes
// the effects the machine returns, in order. So an idle election holds no
// goroutine, and one goroutine at most ever steps the machine. The loops of
// an Elections' elections share its Runner: a few goroutines serve them
// all (see mailbox.Runner). The loop never calls the store itself: every
// store call (claim, renewal, vacancy, read, Subscribe) runs on a
// goroutine of its own, or is handed to a batching Elections without one,
// and its result comes back as an input, so Resign, Proclaim, Stop and
// the getters are answered whatever the store does. Why there is never
// more than one leader is told next to the machine's claim logic (see
// claimDue in machine.go).
type loop struct {
	f   *Feed
	m   *machine
	ctx context.Context // cancelled when the Feed stops for good
	// presCtx bounds the presence writes (Feed.presCancel): a write in
	// flight when the Feed stops runs to its end before the delete. Nil
	// when pres is: the Feed does not participate.
	presCtx context.Context
	box     *mailbox.Box[input]
	// The flags exited, noLogger and dueNow are side by side, in one
	// word: the loop, with the allocator's 8-byte header, then fits the
	// 576-byte size class (not 640).
	exited   bool // exit ran: later inputs are dropped (taker only)
	noLogger bool // Options.Logger is nil: nothing is logged

	// One timer serves claim, renew, reopen and poll: it is armed at the
	// earliest of due and puts a tick in the mailbox; the tick steps each
	// timer whose due time has passed. A tick of a timer since moved or
	// stopped finds nothing due, so no firing is ever stale.
	dueNow      bool                  // timerAt has passed: take steps it before it returns (timer stopped)
	due         [timerLease]time.Time // by timerID; zero: stopped
	timer       *time.Timer
	timerAt     time.Time     // what timer is armed for; zero: stopped
	clock       renewalTicker // ticks aligned renewals instead of timer; nil: none
	hub         silenceHub    // the other elections of the process; nil: none
	unwatch     func()        // ends hub's silentWatch
	clockTick   func()        // puts a clockMsg
	clocked     time.Time     // the renewal instant clock ticks at (due[timerRenew], unless moved since)
	leaseTimer  *time.Timer   // cancels the leader context at the lease's end
	leaseCtx    *leaseContext // the leader context leaseTimer cancels
	cancelledAt time.Time     // when the last cancelLeader was executed
	held        []Event       // the events emitted by the take running (flushEvents)

	// The changefeed. Each open has a generation; notifications of any
	// other than the one in use are dropped (those of the one opening wait
	// in early until it is used).
	subCancel context.CancelFunc
	gen       uint64 // of the last open
	used      uint64 // of the feed in use; 0: none
	early     []notifyMsg
	pending   subResult    // the Subscribe result being stepped
	notes     atomic.Int64 // notifications in the mailbox
	overflow  atomic.Uint64

	pres *presence // the presence calls; nil: not participating
	// presDone is closed when the last presence call started has ended:
	// Stop deletes the presence record only after it (leavePresence).
	presDone chan struct{}
	// stopCause is why the Feed is being stopped, when the one who stops
	// it knows more than that Stop was called (Run: the store's
	// refusal); the log line of the stop's EventUnelected names it.
	stopCause atomic.Pointer[error]

	// For note, see ownNote: what the taker last told of the machine, and
	// the notification it holds back.
	ownMu  sync.Mutex
	own    ownState
	parked *notifyMsg
}

// ownState is what note needs to know of the machine (see ownNote): the
// record it holds when that is its own write of the term it leads (zero
// otherwise), and whether a renewal of that term is in flight.
type ownState struct {
	rev, term uint64
	renewing  bool
}

type subResult struct {
	ch     <-chan backend.Notification
	direct bool // notifications come through note, not ch
	gen    uint64
	ctx    context.Context // the subscription's
	cancel context.CancelFunc
	err    error
}

// Inputs of the loop that it takes in before the machine sees them.
type (
	// tickMsg: the timer fired.
	tickMsg struct{}
	// clockMsg: the renewal clock ticked.
	clockMsg struct{}
	// leaseMsg: the lease timer cancelled a leader context.
	leaseMsg struct{}
	// stopMsg: Stop was called.
	stopMsg struct{}
	// cancelledMsg: the loop's context ended (Stop's context ended).
	cancelledMsg struct{}
	// notifyMsg is a notification of the feed of generation gen; ok false:
	// that feed's channel was closed.
	notifyMsg struct {
		gen uint64
		n   backend.Notification
		ok  bool
	}
)

func (tickMsg) isInput()      {}
func (clockMsg) isInput()     {}
func (leaseMsg) isInput()     {}
func (stopMsg) isInput()      {}
func (cancelledMsg) isInput() {}
func (notifyMsg) isInput()    {}
func (subResult) isInput()    {}

func newLoop(f *Feed, ctx context.Context) *loop {
	l := &loop{
		f:        f,
		m:        newMachine(f.id, f.b.Name(), f.opts.Timing, f.opts),
		ctx:      ctx,
		noLogger: f.opts.Logger == nil,
	}
	var r *mailbox.Runner
	if s, ok := f.b.(sharedTakers); ok {
		r = s.takers()
	}
	l.box = mailbox.NewOn(r, l.take, f.goroutineStarts, f.goroutineEnds)
	if c, ok := f.b.(renewalTicker); ok {
		l.clock = c
		l.clockTick = func() { l.box.Put(clockMsg{}) }
	}
	if h, ok := f.b.(silenceHub); ok {
		l.hub, l.m.together = h, true
	}
	return l
}

// silenceHub is the backend of an Elections' election: its elections
// judge a silent leader together (machine.onSilent). silent tells them,
// each within spread; silentWatch hears what the others tell until stop.
type silenceHub interface {
	silent(leader string, spread time.Duration)
	silentWatch(heard func(leader string)) (stop func())
}

// renewalTicker is the backend of an Elections' election: when it aligns
// renewals (AlignRenewal), tickAt calls tick at an aligned instant, on one
// timer for every election renewing then; it reports false when it does
// not (no batching, or closed), and the loop's own timer serves.
type renewalTicker interface {
	tickAt(at time.Time, tick func()) bool
}

// sharedTakers is the backend of an Elections' election: the loops of its
// elections take their inputs on its Runner's few goroutines, instead of a
// goroutine per run each.
type sharedTakers interface {
	takers() *mailbox.Runner
}

// put hands an input to the loop; false: the loop has ended.
func (l *loop) put(in input) bool { return l.box.Put(in) }

// start starts the engine. The Feed counts the engine as one of its
// goroutines from start to the end of exit, so that done waits for it.
func (l *loop) start() {
	l.f.goroutineStarts()
	if l.hub != nil {
		l.unwatch = l.hub.silentWatch(func(leader string) { l.box.Put(silentInput{leader: leader}) })
	}
	l.put(startInput{})
}

// take steps the machine on one input; it runs on the mailbox's goroutine.
func (l *loop) take(in input) {
	if l.exited {
		return
	}
	if l.ctx.Err() != nil {
		// Stop's context ended (cancelledMsg is on its way): the engine
		// ends before it takes anything else, as it did when it selected
		// on the context.
		l.exit()
		return
	}
	// The cases hand the input on as an interface, so that this frame,
	// which every step stands on, holds no copy of a large input.
	switch in.(type) {
	case startInput:
		l.step(in)
	case stopMsg:
		l.f.mu.Lock()
		ctx := l.f.stopCtx
		l.f.mu.Unlock()
		l.step(stopInput{ctx: ctx})
	case cancelledMsg:
		l.exit()
		return
	case notifyMsg:
		l.notes.Add(-1)
		l.notification(in)
	case subResult:
		l.subscribed(in)
	case *callResult:
		l.result(in)
	case tickMsg:
		l.tick()
	case clockMsg:
		l.stepDue()
	case leaseMsg:
		l.step(leaseLostInput{expired: l.leaseCtx != nil && l.leaseCtx.Err() != nil})
	case requestInput, presenceResult, handoverViewResult, silentInput, leftInput:
		l.step(in)
	default:
		panic(fmt.Sprintf("leaderfeed: unknown input %T", in))
	}
	for l.dueNow && !l.exited && !l.m.done() {
		l.tick()
	}
	l.flushEvents()
	if !l.exited && l.m.done() {
		l.exit()
	}
}

// subscribed steps the result of opening the feed (a subResult), then the
// notifications of that feed that came before it.
func (l *loop) subscribed(msg input) {
	in := msg.(subResult)
	l.pending = in
	l.step(subscribedInput{err: in.err, ok: in.err == nil && (in.ch != nil || in.direct)})
	l.pending = subResult{}
	early := l.early
	l.early = nil
	if l.used != in.gen || in.gen == 0 {
		return
	}
	for _, n := range early {
		if l.used != n.gen || l.exited || l.m.done() {
			break
		}
		l.notification(n)
	}
}

// result steps the result of a store call (a *callResult, which the
// machine takes as it is: no copy to box).
func (l *loop) result(msg input) {
	in := msg.(*callResult)
	in.closed = l.ctx.Err() != nil
	if in.parent != nil {
		in.parentDone = in.parent.Err() != nil
	}
	l.step(msg)
}

// notification steps a notification of the feed (a notifyMsg), if it is
// of the feed in use; one of the feed being opened waits until it is used.
func (l *loop) notification(msg input) {
	in := msg.(notifyMsg)
	if in.gen != l.used {
		if in.gen == l.gen && l.used == 0 && l.subCancel == nil {
			l.early = append(l.early, in)
		}
		return
	}
	l.step(notificationInput{n: in.n, ok: in.ok})
}

// exit ends the engine: the machine cancels the leader context (Stop's
// context ended before the clean path finished), answers a waiting Resign
// and stops the timers and the feed; then the store calls are cancelled,
// and the subscriptions end once their readers took what is queued.
func (l *loop) exit() {
	l.step(exitInput{})
	l.exited = true
	if l.unwatch != nil {
		l.unwatch()
	}
	for _, in := range l.box.Close() {
		if r, ok := in.(subResult); ok {
			r.cancel() // a feed opened for the engine that never took it
		}
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.early = nil
	l.f.cancel()
	l.flushEvents()
	l.f.events.finish()
	close(l.f.loopDone)
	l.f.goroutineEnds()
}

// step hands one input to the machine, at the time read now (after the
// input arrived), and executes its effects in order. An effect that asks a
// question (extendLease, a vacancy whose context ended) is the last of its
// step, and its answer is the next input, before any other.
func (l *loop) step(in input) {
	l.m.quiet = l.noLogger || !l.f.log.Enabled(context.Background(), slog.LevelDebug)
	for in != nil {
		effects := l.m.step(time.Now(), in)
		in = nil
		for _, e := range effects {
			if answer := l.exec(e); answer != nil {
				in = answer
			}
		}
		l.m.recycle(effects)
	}
	l.publishOwn()
}

// publishOwn tells note what it needs of the machine now (see ownNote),
// and hands the loop the notification note held back, once the renewal
// it waited for is over, unless that renewal's reply brought its record.
func (l *loop) publishOwn() {
	m := l.m
	var s ownState
	if m.role == roleLeader {
		s.renewing = m.writing
		if m.seen && !m.missing && m.own(m.rec) {
			s.rev, s.term = m.rec.Revision, m.term
		}
	}
	l.ownMu.Lock()
	defer l.ownMu.Unlock()
	l.own = s
	if p := l.parked; p != nil && !s.renewing {
		l.parked = nil
		if p.n.Record.Revision != s.rev || p.n.Record.Term != s.term {
			l.queueNote(*p, nil)
		}
	}
}

// ownNote takes a notification of the record off note's hands when it is
// the leader's own write of the term it leads, and reports whether it did:
//
//   - one that repeats the record the machine holds (its renewal's reply
//     came first) is dropped: stepping it would change nothing but
//     Health.LastContact, which the reply set just before (observe ignores
//     the same write again);
//   - one newer than that, while a renewal is in flight (it came before
//     the reply), is held back until the renewal is over (publishOwn):
//     dropped if the reply brought the same write, else handed to the
//     loop. A later notification of the record drops it, as the mailbox
//     drops one that waits (note); any other is queued after it, so the
//     loop takes them in the feed's order.
//
// So a renewal wakes the loop for its reply only. Dropping or delaying a
// notification is safe, even if the machine moved on before it would
// have stepped it: no part of the safety argument (see claimDue) rests on
// a notification arriving, or arriving soon, as a feed may fail or lag
// and lose any of them; a node that observes less claims later, or on an
// older revision, whose compare-and-set fails. Nor is liveness lost: the
// record is taken in (from the reply, or from the notification after
// it), and every later write comes with a notification of its own.
func (l *loop) ownNote(gen uint64, n backend.Notification, ok bool) bool {
	r := &n.Record
	l.ownMu.Lock()
	defer l.ownMu.Unlock()
	if !ok || !isRecordNote(n.Type) {
		if p := l.parked; p != nil {
			l.parked = nil
			l.queueNote(*p, nil)
		}
		return false
	}
	own := l.own
	if n.Type == backend.RecordChanged && r.Leader == l.f.id && own.term != 0 && r.Term == own.term {
		switch {
		case r.Revision == own.rev:
			return true
		case own.renewing && r.Revision > own.rev:
			l.parked = &notifyMsg{gen: gen, n: n, ok: true}
			return true
		}
	}
	l.parked = nil // a later record supersedes it
	return false
}

// exec executes one effect; it returns the answer of one that asks the
// machine a question.
func (l *loop) exec(e effect) input {
	// Large effects are handed on as the interface, so that this frame,
	// which every step stands on, holds no copy of them.
	//lint:ignore S1034 binding e would copy every effect type into this frame
	switch e.(type) {
	case *startCall:
		return l.call(e)
	case *emit:
		l.emitEffect(e)
	case *setTimer:
		t := e.(*setTimer)
		if t.t == timerLease {
			panic("leaderfeed: the lease timer is armed by armLease")
		}
		at := t.at
		if t.align {
			at = l.renewAt(at)
		}
		l.due[t.t] = at
		if t.t == timerRenew {
			l.clocked = time.Time{}
			if t.align && l.clock != nil && l.clock.tickAt(at, l.clockTick) {
				l.clocked = at
			}
		}
		l.armTimer()
	case stopTimer:
		if t := e.(stopTimer).t; t != timerLease {
			l.due[t] = time.Time{}
			l.armTimer()
		} else if l.leaseTimer != nil {
			l.leaseTimer.Stop()
		}
	case cancelLeader:
		c := e.(cancelLeader)
		c.ctx.cancel(c.cause)
		l.cancelledAt = time.Now()
	case *armLease:
		a := e.(*armLease)
		l.armLease(a.ctx, a.end)
	case *extendLease:
		return l.extendLease(e)
	case *publish:
		l.publish(e)
	case reply:
		r := e.(reply)
		r.to <- r.err
	case logDebug:
		d := e.(logDebug)
		l.f.log.Debug(d.msg, d.args...)
	case logLine:
		d := e.(logLine)
		l.f.log.Log(context.Background(), d.level, d.msg, d.args...)
	case publishHealth:
		l.publishHealth()
	case *traceCall:
		if l.ctx.Err() == nil {
			l.traceCall(e)
		}
	case presenceCall:
		l.presenceCall(e)
	case leavePresence:
		l.leavePresence(e)
	case handoverView:
		l.handoverView(e)
	case leaderSilent:
		if l.hub != nil {
			e := e.(leaderSilent)
			l.hub.silent(e.leader, e.spread)
		}
	case openFeed:
		l.openFeed()
	case useFeed:
		l.used, l.subCancel = l.pending.gen, l.pending.cancel
		if !l.pending.direct {
			l.readFeed(l.pending.ctx, l.pending.gen, l.pending.ch)
		}
	case discardFeed:
		l.pending.cancel()
	case closeFeed:
		if l.subCancel != nil {
			l.subCancel()
			l.subCancel = nil
		}
		l.used = 0
	default:
		panic(fmt.Sprintf("leaderfeed: unknown effect %T", e))
	}
	return nil
}

// flushEvents logs and traces the events the take's steps emitted (held),
// then hands them to the subscriptions, after every other effect of the
// take: a reader learns of a step once all of it is done (the getters
// agree with the event it reads), and a burst reaches each reader through
// its subscription's goroutine, which hands it the first event at once.
// Pushed one by one, the first would wake the reader only for the
// goroutine started for the rest, and the store calls the take started,
// to run before it.
func (l *loop) flushEvents() {
	if len(l.held) == 0 {
		return
	}
	for _, e := range l.held {
		l.emit(e)
	}
	l.f.events.push(l.held)
	l.held = nil // an idle engine keeps no room: events are rare, engines many
}

// emitEffect executes an emit: a zero At is stamped with the instant of
// the last cancelLeader, never later than notAfter (see emit), or else
// now; the event waits in held for the end of the take.
//
//go:noinline // keeps exec's frame small
func (l *loop) emitEffect(eff effect) {
	e := eff.(*emit)
	if e.ev.At.IsZero() && !e.notAfter.IsZero() {
		e.ev.At = l.cancelledAt
		if e.ev.At.After(e.notAfter) {
			e.ev.At = e.notAfter
		}
	}
	if e.ev.At.IsZero() {
		e.ev.At = time.Now()
	}
	l.held = append(l.held, e.ev)
}

// extendLease executes an extendLease and returns its answer.
//
//go:noinline // keeps exec's frame small
func (l *loop) extendLease(eff effect) input {
	e := eff.(*extendLease)
	return leaseExtendedInput{ok: e.ctx.extend(e.end)}
}

// publish hands the getters the machine's snapshot.
//
//go:noinline // keeps exec's frame small
func (l *loop) publish(eff effect) {
	e := eff.(*publish)
	l.f.mu.Lock()
	l.f.snap = e.snap
	l.f.leaseEnd = e.leaseEnd
	l.f.mu.Unlock()
}

// publishHealth hands the getters the machine's Health.
//
//go:noinline // keeps exec's frame small
func (l *loop) publishHealth() {
	l.f.mu.Lock()
	l.f.health = l.m.health
	l.f.mu.Unlock()
}

// armTimer arms the timer for the earliest due time, or stops it. A
// renewal the clock ticks for needs no timer. (A clock tick of a renewal
// since moved or stopped finds nothing due, as a stale timer's would.)
func (l *loop) armTimer() {
	var at time.Time
	for t, d := range l.due {
		if t == int(timerRenew) && d.Equal(l.clocked) {
			continue
		}
		if !d.IsZero() && (at.IsZero() || d.Before(at)) {
			at = d
		}
	}
	if at.Equal(l.timerAt) {
		// Armed for at already; or nothing is due and the timer is
		// stopped, or fired, or fires for nothing (a stale tick).
		return
	}
	l.timerAt = at
	// A time due already (a claim at once, on a vacancy) is stepped by the
	// take that armed it, before it returns: through the timer it would
	// cost a handover a goroutine's wake-up and a turn in the mailbox.
	l.dueNow = !at.IsZero() && !time.Now().Before(at)
	if at.IsZero() || l.dueNow {
		// The stopped timer is dropped, not kept for the next arming: a
		// leader whose renewals the clock ticks arms none for as long as
		// it leads, and 10,000 of them would keep 10,000 timers.
		if l.timer != nil {
			l.timer.Stop()
			l.timer = nil
		}
		return
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(max(0, time.Until(at)), func() { l.box.PutHere(tickMsg{}) })
		return
	}
	l.timer.Reset(max(0, time.Until(at)))
}

// tick steps the timers whose due time has passed, as the timer fired.
func (l *loop) tick() {
	l.timerAt, l.dueNow = time.Time{}, false
	l.stepDue()
}

// stepDue steps the timers whose due time has passed, earliest first, and
// re-arms the timer for the rest.
func (l *loop) stepDue() {
	for !l.exited {
		now := time.Now()
		var next timerID
		for t, d := range l.due {
			if !d.IsZero() && !now.Before(d) && (next == 0 || d.Before(l.due[next])) {
				next = timerID(t)
			}
		}
		if next == 0 {
			break
		}
		l.due[next] = time.Time{}
		l.step(timerInput{t: next})
		if l.m.done() {
			return
		}
	}
	if !l.exited {
		l.armTimer()
	}
}

// emit logs an event, with a fixed message per event type, and traces it.
func (l *loop) emit(e Event) {
	log := l.f.log
	switch e.Type {
	case EventElected:
		log.Info("leaderfeed: elected", "term", e.Term)
	case EventUnelected:
		err := e.Err
		if c := l.stopCause.Load(); err == nil && e.Reason == ReasonStopped && c != nil {
			err = *c
		}
		log.Info("leaderfeed: unelected", "term", e.Term, "reason", e.Reason.String(), "err", err)
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
}

// renewAt returns when the renewal due at due is sent: then, or earlier
// (by less than a heartbeat interval) when the backend aligns the renewals
// of many elections so that they share batches (Elections). Renewing early
// is safe: the lease runs from the renewal's own send time.
func (l *loop) renewAt(due time.Time) time.Time {
	if a, ok := l.f.b.(backend.Aligner); ok {
		if at := a.AlignRenewal(due, l.f.opts.Timing.HeartbeatInterval); !at.After(due) && at.After(due.Add(-l.f.opts.Timing.HeartbeatInterval)) {
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
	l.leaseCtx = ctx
	l.leaseTimer = time.AfterFunc(time.Until(end), func() {
		// Err cancels the context only if its end has passed: a renewal
		// may have extended the lease just before this timer fired, and
		// the loop then re-arms the timer for the new end (armLease).
		if ctx.Err() == nil {
			return
		}
		l.box.PutHere(leaseMsg{})
	})
}

// call runs one store call on a goroutine of its own; its result comes back
// in the mailbox (dropped if the loop has ended). A claim or renewal that
// the backend takes without blocking (backend.Submitter: a batching
// Elections) needs no goroutine. A vacancy whose context has ended is not
// sent: the answer tells the machine at once.
func (l *loop) call(eff effect) input {
	c := eff.(*startCall)
	r := &callResult{kind: c.kind, expected: c.expected, next: c.next, sentAt: c.sentAt, sentStep: c.sentStep, parent: c.parent}
	var ctx context.Context
	var cancel context.CancelFunc
	switch c.kind {
	case callVacancy:
		parent := c.parent
		if parent == nil {
			parent = l.ctx
		}
		if err := parent.Err(); err != nil {
			return vacancyAbortedInput{err: err}
		}
		var vctx context.Context
		var vcancel context.CancelFunc
		if c.deadline.IsZero() {
			vctx, vcancel = context.WithCancel(parent)
		} else {
			vctx, vcancel = context.WithDeadline(parent, c.deadline)
		}
		stop := context.AfterFunc(l.ctx, vcancel)
		ctx, cancel = vctx, func() { stop(); vcancel() }
	case callClaim, callRenew:
		if s, ok := l.f.b.(backend.Submitter); ok && s.SubmitHeartbeat(l.ctx, c.deadline, c.expected, c.next, func(res heartbeat.Record, err error) {
			r.res, r.err = res, err
			l.box.PutUrgent(r)
		}) {
			return nil
		}
		ctx, cancel = context.WithDeadline(l.ctx, c.deadline)
	default:
		ctx, cancel = context.WithDeadline(l.ctx, c.deadline)
	}
	guard := c.guard // c is the step's, reused after it
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		defer cancel()
		switch {
		case r.kind == callRead:
			r.res, r.err = l.f.b.Get(ctx)
		case guard.Node == "":
			r.res, r.err = l.f.b.Heartbeat(ctx, r.expected, r.next)
		default:
			r.res, r.err = l.guarded(ctx, r.expected, r.next, guard)
		}
		cancel()
		l.box.PutHere(r)
	}()
	// The call is what the step waits for: let it go out now, before the
	// rest of the take (the step's events wake their readers, who would run
	// first), rather than once the take ends or another thread wakes to
	// steal it. The effects before it (a leader context cancelled before a
	// handover) are done.
	runtime.Gosched()
	return nil
}

// guarded is the guarded write of a handover (backend.GuardElection), or
// an error matching ErrUnsupported, without I/O, from a backend without
// it (a wrapper that does not forward it).
func (l *loop) guarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	g, ok := l.f.b.(backend.GuardElection)
	if !ok {
		return heartbeat.Record{}, fmt.Errorf("leaderfeed: the backend (%T) has no guarded write: %w", l.f.b, backend.ErrUnsupported)
	}
	return g.HeartbeatGuarded(ctx, expected, next, guard)
}

// openFeed opens the changefeed in a goroutine of its own; the result comes
// back in the mailbox.
func (l *loop) openFeed() {
	l.gen++
	gen := l.gen
	l.early = nil
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		r := subResult{gen: gen}
		if d, ok := l.f.b.(backend.FuncSubscriber); ok {
			// No context of its own: the loop ends it (closeFeed,
			// discardFeed, or exit when the result was not taken).
			r.direct = true
			r.cancel, r.err = d.SubscribeFunc(l.ctx, func(n backend.Notification) { l.note(gen, n, true) })
		} else {
			ctx, cancel := context.WithCancel(l.ctx)
			r.ctx, r.cancel = ctx, cancel
			r.ch, r.err = l.f.b.Subscribe(ctx)
		}
		if r.err != nil && r.cancel != nil {
			r.cancel()
		}
		if r.err != nil {
			r.cancel = func() {}
		}
		if !l.box.PutHere(r) {
			r.cancel()
		}
	}()
}

// readFeed hands the notifications of a channel feed to the loop, on a
// goroutine of its own, until the channel closes or the feed is closed.
func (l *loop) readFeed(ctx context.Context, gen uint64, ch <-chan backend.Notification) {
	l.f.goroutineStarts()
	go func() {
		defer l.f.goroutineEnds()
		for {
			select {
			case n, ok := <-ch:
				if !l.note(gen, n, ok) || !ok {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
}

// note hands a notification of the feed of generation gen to the loop
// without blocking; ok false: the feed's channel closed. It reports false
// when the feed must not send more: maxFeedQueue notifications wait in the
// mailbox, so the feed failed (the machine reopens it and reads the
// record). Notifications of the record are coalesced (the newest replaces
// those waiting), so only changes of other records can pile up.
func (l *loop) note(gen uint64, n backend.Notification, ok bool) bool {
	if l.overflow.Load() == gen {
		return false
	}
	if l.ownNote(gen, n, ok) {
		return true
	}
	in := notifyMsg{gen: gen, n: n, ok: ok}
	var stale func(q, v input) bool
	switch {
	case l.notes.Load() >= maxFeedQueue:
		// Drop what this feed queued: Failed is what the machine sees.
		l.overflow.Store(gen)
		in.n = backend.Notification{Type: backend.Failed, Err: fmt.Errorf("leaderfeed: changefeed of election %q fell %d notifications behind", l.f.b.Name(), maxFeedQueue)}
		in.ok = true
		stale = ofSameFeed
	case ok && isRecordNote(n.Type):
		stale = olderRecordNote
	}
	l.queueNote(in, stale)
	return in.n.Type != backend.Failed || n.Type == backend.Failed
}

// queueNote puts a notification in the mailbox, dropping those waiting
// for which stale reports true, and counts it. Called by note, or with
// ownMu held (ownNote, publishOwn), so that a notification held back is
// queued before any that came after it.
func (l *loop) queueNote(in notifyMsg, stale func(q, v input) bool) {
	dropped, put := l.box.Replace(in, stale)
	if put {
		l.notes.Add(int64(1 - dropped))
	}
}

// ofSameFeed reports whether q is a notification of the feed of v, a
// notifyMsg.
func ofSameFeed(q, v input) bool {
	m, is := q.(notifyMsg)
	return is && m.gen == v.(notifyMsg).gen
}

// olderRecordNote reports whether q is a notification of the record that
// v, a later one of the same feed, supersedes.
func olderRecordNote(q, v input) bool {
	m, is := q.(notifyMsg)
	return is && m.gen == v.(notifyMsg).gen && m.ok && isRecordNote(m.n.Type)
}

// isRecordNote reports whether a notification of type t reports the state
// of the election record: the newest of them supersedes the others.
func isRecordNote(t backend.NotificationType) bool {
	return t == backend.RecordChanged || t == backend.RecordDeleted || t == backend.Ignored
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
