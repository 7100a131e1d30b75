package mailbox

import (
	"context"
	"sync"
)

// Pipe is a Box whose taker hands the values to a reader's channel: it
// never blocks the sender, delivers in order, and holds a goroutine only
// while values wait for a reader that lags. A value goes straight into the
// channel when it has room and nothing waits before it.
//
// The pipe ends in one of two ways, and then closes the channel and calls
// onEnd once: End delivers what waits and a last value first; the reader's
// context ending drops what waits.
type Pipe[T any] struct {
	out   chan T
	ctx   context.Context
	onEnd func()
	box   *Box[piped[T]]
	stop  func() bool // stops the AfterFunc of ctx

	mu     sync.Mutex
	taking int  // goroutines of box (begin and end)
	ending bool // End was called: nothing more is put
	gone   bool // ctx ended
	closed bool // out is closed
}

type piped[T any] struct {
	v    T
	last bool
}

// NewPipe returns a pipe to a channel of size buffered values (size >= 1)
// for a reader whose context is ctx. onEnd, if not nil, runs once when the
// channel has been closed.
func NewPipe[T any](ctx context.Context, size int, onEnd func()) *Pipe[T] {
	p := &Pipe[T]{out: make(chan T, max(1, size)), ctx: ctx, onEnd: onEnd}
	p.box = New(p.take, p.begin, p.end)
	p.stop = context.AfterFunc(ctx, p.readerGone)
	return p
}

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
			return true
		default:
		}
	}
	var drop func(piped[T]) bool
	if stale != nil {
		drop = func(q piped[T]) bool { return stale(q.v) }
	}
	_, ok := p.box.Replace(piped[T]{v: v}, drop)
	return ok
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
// what waits is dropped and last comes next. Later calls do nothing.
func (p *Pipe[T]) End(last T, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ending || p.gone {
		return
	}
	p.ending = true
	var stale func(piped[T]) bool
	if drop {
		stale = func(piped[T]) bool { return true }
	}
	p.box.Replace(piped[T]{v: last, last: true}, stale)
}

// Abort ends the pipe at once, dropping what waits, as if the reader's
// context had ended.
func (p *Pipe[T]) Abort() { p.readerGone() }

// begin runs when the box starts a goroutine: only in Replace or End,
// which hold p.mu.
func (p *Pipe[T]) begin() { p.taking++ }

func (p *Pipe[T]) end() {
	p.mu.Lock()
	p.taking--
	p.closeIfDone()
}

// take sends one value; once the reader is gone it drops the rest.
func (p *Pipe[T]) take(q piped[T]) {
	select {
	case p.out <- q.v:
	case <-p.ctx.Done():
		return
	}
	if q.last {
		p.mu.Lock()
		p.gone = true // what the reader was owed is delivered
		p.mu.Unlock()
	}
}

func (p *Pipe[T]) readerGone() {
	p.mu.Lock()
	p.gone = true
	p.box.Close()
	p.closeIfDone()
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
	p.mu.Unlock()
	p.stop()
	if p.onEnd != nil {
		p.onEnd()
	}
}
