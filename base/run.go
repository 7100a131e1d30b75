package base

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// Run is the blocking way to use a Feed: it runs fn, the work that only
// the leader may do, each time this node is elected, and campaigns again
// when leadership ends, until ctx ends. Most programs need nothing else:
//
//	err := feed.Run(ctx, func(ctx context.Context, term uint64) error {
//		return work(ctx, term) // until ctx is done; term is the fencing token
//	})
//
// Run starts the Feed unless it has been started already. Like Start, it
// waits for a store that cannot be reached yet (a server still starting,
// a refused connection), retrying within ctx and logging at Warn, so that
// a service started beside its database waits for it rather than fails;
// a refusal (ErrRefused) or an invalid configuration ends it at once. If
// Start fails, or ctx ends before the store is reached, Run returns that
// error and the Feed stays unstarted (Run may be called again). Otherwise
// Run stops the Feed before it returns, so that a node whose work has
// ended does not go on winning elections with nobody doing the work. Stop
// resigns first, so another node takes over at once; it is bounded by
// Timing.ElectionTimeoutMax, after which the others take over on their
// own.
//
// fn runs on a goroutine of its own, once per term this node wins, never
// two at once: a term won while the previous fn is still returning starts
// its fn when that one has returned (if the new term still lasts). fn's ctx
// is done when leadership of term ends, context.Cause telling why
// (ErrResigned, ErrDeposed, ErrLeaseExpired, ErrStopped, ErrTransferred),
// when Run's ctx ends (with its cause), or when the store refuses a call
// (the refusal, matching ErrRefused; see below). Like the leader context,
// its Err compares the clock with the lease, so work that must not
// outlive the lease checks ctx.Err() before each step, and passes term to
// what it writes. fn must return once ctx is done; Run waits for it.
//
// When Run's ctx ends, Run cancels fn's ctx and waits for fn to return
// while the node still holds the lease, and only then stops the Feed,
// which hands leadership over; it returns nil, or Stop's error.
//
// When fn returns:
//   - after its ctx is done because leadership ended (deposed, lease
//     expired, Resign called), Run campaigns again; what fn returned is
//     logged, not returned;
//   - while this node still leads, with an error or nil, the work is over:
//     Run stops the Feed (handing over at once) and returns what fn
//     returned. Run does not restart failing work, which would pass
//     leadership round the nodes at the speed of the store; the caller (or
//     the process supervisor) decides whether to retry, with a new Feed.
//   - by panicking: Run recovers the panic, stops the Feed (handing over at
//     once, where a crash would leave the others waiting an election
//     timeout) and returns a *PanicError carrying the value and the stack.
//
// When the store refuses a call (an error matching ErrRefused: a missing
// privilege, a missing table), Run cancels fn's ctx, waits for fn, stops
// the Feed (the log line of its end, "leaderfeed: unelected" with reason
// stopped, names the refusal) and returns the refusal, which names the
// cause and the fix:
// a Feed keeps retrying a refused call slowly (see refusalRetry), but Run
// is the one-call helper, and a process that cannot lead should say so
// and exit rather than run on silently. A refusal at Start is Start's
// error, as any other.
//
// Run returns ErrObserveOnly for an observe-only Feed, ErrClosed if the
// Feed was stopped (before Run, or by a Stop call while Run runs, after fn
// returned), and an error matching ErrAlreadyStarted if another Run is
// running on the Feed.
func (f *Feed) Run(ctx context.Context, fn func(ctx context.Context, term uint64) error) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: Run: fn is nil", ErrInvalidConfig)
	}
	if f.opts.ObserveOnly {
		return ErrObserveOnly
	}
	if !f.inRun.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run is running on this feed already", ErrAlreadyStarted)
	}
	defer f.inRun.Store(false)

	subCtx, endSub := context.WithCancel(context.Background())
	defer endSub()
	sub := f.Subscribe(subCtx) // before Start: no EventElected is missed
	if serr := f.Start(ctx); serr != nil && !errors.Is(serr, ErrAlreadyStarted) {
		return serr
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.opts.Timing.ElectionTimeoutMax)
		defer cancel()
		if serr := f.Stop(sctx); serr != nil && !errors.Is(err, ErrClosed) {
			err = errors.Join(err, fmt.Errorf("leaderfeed: Run: stop: %w", serr))
		}
	}()

	r := runner{f: f, ctx: ctx, fn: fn}
	// A feed started before Run may lead already.
	if lctx, term, ok := f.LeaderContext(); ok {
		r.elected(lctx, term)
	}
	events := sub.C
	for {
		r.startPending()
		select {
		case <-ctx.Done():
			return r.finish(context.Cause(ctx))
		case e, ok := <-events:
			if !ok {
				events = nil
				err := sub.Err()
				if err == nil {
					err = ErrClosed // Stop was called
				}
				if ferr := r.finish(err); ferr != nil {
					return ferr
				}
				return err
			}
			if e.Type == EventElected {
				r.elected(e.LeaderCtx, e.Term)
			}
			if (e.Type == EventError || e.Type == EventSubscribeError) && errors.Is(e.Err, ErrRefused) {
				// Retrying cannot fix it: stop (fn first) and say why, also
				// in the log line of the stop's EventUnelected, which
				// would otherwise say only that Stop was called.
				f.noteStopCause(e.Err)
				if ferr := r.finish(e.Err); ferr != nil {
					return errors.Join(e.Err, ferr)
				}
				return e.Err
			}
		case res := <-r.done():
			r.job = nil
			switch {
			case res.err != nil && res.fatal:
				return res.err
			case ctx.Err() != nil:
				// Run's ctx ended too: the next turn returns.
				f.log.Info("leaderfeed: run: work ended", "term", res.term, "err", res.err)
			case res.leader.Err() == nil:
				// fn gave up while leading: the work is over.
				f.log.Info("leaderfeed: run: work returned while leading", "term", res.term)
				return res.err
			default:
				f.log.Info("leaderfeed: run: work ended", "term", res.term, "err", res.err)
			}
		}
	}
}

// noteStopCause records why Run is about to stop the Feed, for the log.
func (f *Feed) noteStopCause(err error) {
	f.mu.Lock()
	l := f.loop
	f.mu.Unlock()
	if l != nil {
		l.stopCause.Store(&err)
	}
}

// PanicError is the error Run returns when its function panicked. Its
// message has the value and the stack.
type PanicError struct {
	// Value is what fn panicked with.
	Value any
	// Term is the term fn ran for.
	Term uint64
	// Stack is the stack of fn's goroutine at the panic (debug.Stack).
	Stack []byte
}

// Error returns the panic's value and stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("leaderfeed: Run: fn panicked in term %d: %v\n\n%s", e.Term, e.Value, e.Stack)
}

// Unwrap returns the panic's value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// runner is Run's state: the fn running, if any, and the term waiting for
// it to return.
type runner struct {
	f   *Feed
	ctx context.Context
	fn  func(ctx context.Context, term uint64) error

	job      *runJob
	next     context.Context // leader context of a term won, not started yet
	nextTerm uint64
	lastTerm uint64 // the newest term started or pending
}

type runJob struct {
	cancel context.CancelCauseFunc
	leader context.Context
	result chan runResult
}

type runResult struct {
	term   uint64
	leader context.Context
	err    error
	fatal  bool // panicked or called runtime.Goexit: Run returns err
}

// elected notes a term won; duplicates (a feed started before Run) are
// ignored.
func (r *runner) elected(leader context.Context, term uint64) {
	if term <= r.lastTerm {
		return
	}
	r.next, r.nextTerm, r.lastTerm = leader, term, term
}

// startPending starts fn for the term won, once the previous fn returned,
// if that term still lasts and Run's ctx has not ended.
func (r *runner) startPending() {
	if r.job != nil || r.next == nil {
		return
	}
	leader, term := r.next, r.nextTerm
	r.next = nil
	if leader.Err() != nil || r.ctx.Err() != nil {
		return
	}
	jctx, cancel := context.WithCancelCause(r.ctx)
	stop := context.AfterFunc(leader, func() { cancel(context.Cause(leader)) })
	j := &runJob{cancel: cancel, leader: leader, result: make(chan runResult, 1)}
	r.job = j
	r.f.log.Info("leaderfeed: run: work started", "term", term)
	go func() {
		res := runResult{term: term, leader: leader, fatal: true}
		defer func() {
			stop()
			cancel(context.Canceled)
			if v := recover(); v != nil {
				res.err = &PanicError{Value: v, Term: term, Stack: debug.Stack()}
			} else if res.fatal {
				res.err = fmt.Errorf("leaderfeed: Run: fn called runtime.Goexit in term %d", term)
			}
			j.result <- res
		}()
		err := r.fn(&runContext{Context: jctx, leader: leader, cancel: cancel}, term)
		res.err, res.fatal = err, false
	}()
}

func (r *runner) done() <-chan runResult {
	if r.job == nil {
		return nil
	}
	return r.job.result
}

// finish cancels fn's ctx with cause, waits for fn, and returns its error
// if it panicked.
func (r *runner) finish(cause error) error {
	if r.job == nil {
		return nil
	}
	// The leader context's own cause wins when it has ended: it reaches
	// fn's ctx through an AfterFunc goroutine, which may not have run yet
	// when Stop's closing of the events brings Run here.
	if r.job.leader.Err() != nil {
		cause = context.Cause(r.job.leader)
	}
	r.job.cancel(cause)
	res := <-r.job.result
	r.job = nil
	if res.fatal {
		return res.err
	}
	r.f.log.Info("leaderfeed: run: work ended", "term", res.term, "err", res.err)
	return nil
}

// runContext is fn's ctx: done when the leader context or Run's ctx is,
// and, like the leader context, its Err checks the lease on the clock.
type runContext struct {
	context.Context
	leader context.Context
	cancel context.CancelCauseFunc
}

func (c *runContext) Err() error {
	if c.leader.Err() != nil {
		c.cancel(context.Cause(c.leader))
	}
	return c.Context.Err()
}
