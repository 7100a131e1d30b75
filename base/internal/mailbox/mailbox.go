// Package mailbox is the one queue type of leaderfeed's engine: a FIFO of
// values handed to one taker function, on a goroutine that runs only while
// the box holds something.
package mailbox

import "sync"

// Box queues values for take, in the order they were put. Put never blocks:
// a box that holds values has one goroutine (started by start, on demand)
// that hands them to take one at a time, in order, and ends once the box is
// empty, so an idle box holds no goroutine. A Box is bounded by its
// senders: each kind of value either comes from a source that has at most
// a few in flight, or is coalesced (Replace), or its sender checks Len
// before putting. Close drops what is queued; later puts are refused.
type Box[T any] struct {
	take  func(T)
	start func(run func())

	mu      sync.Mutex
	queue   []T
	head    int // queue[head:] waits
	running bool
	closed  bool
}

// New returns an empty Box handing its values to take. start starts run on
// a goroutine of its own (nil: a plain go statement); it is called with the
// Box's lock held, so it must not call the Box.
func New[T any](take func(T), start func(run func())) *Box[T] {
	if start == nil {
		start = func(run func()) { go run() }
	}
	return &Box[T]{take: take, start: start}
}

// Put queues v. It reports false, and drops v, if the Box is closed.
func (b *Box[T]) Put(v T) bool {
	_, ok := b.Replace(v, nil)
	return ok
}

// Replace drops the queued values for which stale reports true, then queues
// v: the coalescing put of a queue that keeps only the latest of a kind. It
// returns how many it dropped, and false if the Box is closed (v is dropped
// too). stale is called with the Box's lock held.
func (b *Box[T]) Replace(v T, stale func(T) bool) (dropped int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, false
	}
	if stale != nil {
		kept := b.queue[:b.head]
		for _, q := range b.queue[b.head:] {
			if stale(q) {
				dropped++
			} else {
				kept = append(kept, q)
			}
		}
		clear(b.queue[len(kept):])
		b.queue = kept
	}
	b.queue = append(b.queue, v)
	if !b.running {
		b.running = true
		b.start(b.run)
	}
	return dropped, true
}

// Len returns how many values wait.
func (b *Box[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) - b.head
}

// Close drops the queued values and refuses later puts. It may be called
// by take (the goroutine then ends after take returns). It is idempotent.
func (b *Box[T]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	clear(b.queue)
	b.queue, b.head = nil, 0
}

// run hands the queue to take until it is empty.
func (b *Box[T]) run() {
	var zero T
	for {
		b.mu.Lock()
		if b.head == len(b.queue) {
			b.running = false
			if cap(b.queue) > maxKept {
				b.queue = nil
			} else {
				b.queue = b.queue[:0]
			}
			b.head = 0
			b.mu.Unlock()
			return
		}
		v := b.queue[b.head]
		b.queue[b.head] = zero
		b.head++
		b.mu.Unlock()
		b.take(v)
	}
}

// maxKept is the room an idle Box keeps for the next values; a larger
// queue is freed once it is empty.
const maxKept = 8
