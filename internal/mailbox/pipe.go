package mailbox

import (
	"context"
	"sync"
	"time"
)

// Pipe is a Box whose taker hands the values to a reader's channel: it
// never blocks the sender, delivers in order, and holds a goroutine only
// while values wait for a reader that lags. A value goes straight into the
// channel when a receiver or room is there and nothing waits before it.
//
// The pipe ends in one of three ways, and then closes the channel and
// calls onEnd once: End delivers what waits and a last value; Finish
// delivers what waits, each value waiting a bounded time for the reader if
// asked; the reader's context ending (or Abort) drops what waits.
type Pipe[T any] struct {
	out      chan T
	ctx      context.Context
	onEnd    func()
	sent     func(T) // see OnSent
	box      *Box[piped[T]]
	stop     func() bool   // stops the AfterFunc of ctx
	finished chan struct{} // closed by Finish

	mu       sync.Mutex
	taking   int  // goroutines of box (begin and end)
	ending   bool // End or Finish was called: nothing more is put
	gone     bool // nothing more is sent: the channel closes once no goroutine sends
	closed   bool // out is closed
	took     bool // the reader took a value
	patience time.Duration
	dropped  func(n int)
}

// piped is a value in the box; last: the pipe ends after it; none: it
// carries no value, only the end (Finish).
type piped[T any] struct {
	v          T
	last, none bool
}

// NewPipe returns a pipe to a channel of size buffered values for a
// reader whose context is ctx. onEnd, if not nil, runs once when the
// channel has been closed.
func NewPipe[T any](ctx context.Context, size int, onEnd func()) *Pipe[T] {
	p := &Pipe[T]{out: make(chan T, size), ctx: ctx, onEnd: onEnd, finished: make(chan struct{})}
	p.box = New(p.take, p.begin, p.end)
	p.box.keep = maxKeptPipe
	p.mu.Lock() // Abort may run at once, on another goroutine
	p.stop = context.AfterFunc(ctx, p.Abort)
	p.mu.Unlock()
	return p
}

// OnSent sets a function called with each value once it reached the
// channel (on the sender's goroutine or the pipe's, never two at once).
// Call it before the first Put.
func (p *Pipe[T]) OnSent(f func(T)) { p.sent = f }

// C returns the reader's channel.
func (p *Pipe[T]) C() <-chan T { return p.out }

// Put hands v to the reader; false: the pipe has ended (v is dropped).
func (p *Pipe[T]) Put(v T) bool { return p.Replace(v, nil) }

// Replace is Put that first drops the values waiting for which stale
// reports true (a newer value supersedes them).
func (p *Pipe[T]) Replace(v T, stale func(T) bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ending || p.gone {
		return false
	}
	if p.taking == 0 && p.box.Len() == 0 {
		select {
		case p.out <- v:
			p.took = true
			if p.sent != nil {
				p.sent(v)
			}
			return true
		default:
		}
	}
	var drop func(q, v piped[T]) bool
	if stale != nil {
		drop = func(q, _ piped[T]) bool { return stale(q.v) }
	}
	_, ok := p.box.Replace(piped[T]{v: v}, drop)
	return ok
}

// PutAll hands vs to the reader in order, like Put of each; false: the
// pipe has ended. A burst of more than one goes to the pipe's goroutine
// at once, which hands the first to a reader that waits: the caller does
// not wake the reader only to start a goroutine behind it for the rest.
func (p *Pipe[T]) PutAll(vs []T) bool {
	if len(vs) == 1 {
		return p.Put(vs[0])
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ending || p.gone {
		return false
	}
	for _, v := range vs {
		if _, ok := p.box.Replace(piped[T]{v: v}, nil); !ok {
			return false
		}
	}
	return true
}

// Closed reports whether the channel has been closed (onEnd runs after).
func (p *Pipe[T]) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Len returns how many values wait (not counting the channel's).
func (p *Pipe[T]) Len() int { return p.box.Len() }

// End ends the pipe after the reader took what waits and last; if drop,
// what waits is dropped and last comes next. Later ends do nothing.
func (p *Pipe[T]) End(last T, drop bool) {
	var stale func(q, v piped[T]) bool
	if drop {
		stale = func(_, _ piped[T]) bool { return true }
	}
	p.end1(piped[T]{v: last, last: true}, stale, 0, nil)
}

// Finish ends the pipe after the reader took what waits. With patience
// above zero, each value waits at most patience for the reader from now
// on, and none waits for a reader that never took one: what is left then
// is dropped, and dropped (if not nil) is told how many. Later ends do
// nothing.
func (p *Pipe[T]) Finish(patience time.Duration, dropped func(n int)) {
	p.end1(piped[T]{last: true, none: true}, nil, patience, dropped)
}

func (p *Pipe[T]) end1(last piped[T], stale func(q, v piped[T]) bool, patience time.Duration, dropped func(int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ending || p.gone {
		return
	}
	p.ending, p.patience, p.dropped = true, patience, dropped
	close(p.finished)
	p.box.Replace(last, stale)
}

// Abort ends the pipe at once, dropping what waits, as the reader's
// context ending does.
func (p *Pipe[T]) Abort() {
	p.mu.Lock()
	p.gone = true
	p.box.Close()
	p.closeIfDone()
}

// begin runs when the box starts a goroutine: only in Replace, PutAll or
// end1, which hold p.mu.
func (p *Pipe[T]) begin() { p.taking++ }

func (p *Pipe[T]) end() {
	p.mu.Lock()
	p.taking--
	p.closeIfDone()
}

// take sends one value, unless the reader is gone or out of patience.
func (p *Pipe[T]) take(q piped[T]) {
	if !q.none && !p.send(q.v) {
		return
	}
	p.mu.Lock()
	if !q.none {
		p.took = true
	}
	if q.last {
		p.gone = true // what the reader was owed is delivered
	}
	p.mu.Unlock()
	if !q.none && p.sent != nil {
		p.sent(q.v)
	}
}

func (p *Pipe[T]) send(v T) bool {
	finished := p.finished
	var expire *time.Timer
	defer func() {
		if expire != nil {
			expire.Stop()
		}
	}()
	for {
		var expired <-chan time.Time
		if finished == nil {
			p.mu.Lock()
			patience, took := p.patience, p.took
			p.mu.Unlock()
			if patience > 0 && !took {
				select {
				case p.out <- v:
					return true
				default:
					p.dropRest()
					return false
				}
			}
			if patience > 0 {
				expire = time.NewTimer(patience)
				expired = expire.C
			}
		}
		select {
		case p.out <- v:
			return true
		case <-finished:
			finished = nil
			continue
		case <-expired:
			p.dropRest()
			return false
		case <-p.ctx.Done():
			return false
		}
	}
}

// dropRest drops the value being sent and those waiting, and ends the
// pipe.
func (p *Pipe[T]) dropRest() {
	p.mu.Lock()
	p.gone = true
	n := 1
	for _, q := range p.box.Close() {
		if !q.none {
			n++
		}
	}
	dropped := p.dropped
	p.mu.Unlock()
	if dropped != nil {
		dropped(n)
	}
}

// closeIfDone closes the channel once the pipe is gone and no goroutine
// sends on it. Called with p.mu held; it releases it.
func (p *Pipe[T]) closeIfDone() {
	if !p.gone || p.taking > 0 || p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.box.Close()
	close(p.out)
	stop := p.stop
	p.mu.Unlock()
	stop()
	if p.onEnd != nil {
		p.onEnd()
	}
}
