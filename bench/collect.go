package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// collector gathers, for one round at a time, the moment each observer
// first saw a leader that the round's match accepts. Observers of both
// systems report to it the same way.
type collector struct {
	mu    sync.Mutex
	obs   []*observer
	round int
	match func(leader string) bool
	want  int
	times []time.Time
	done  chan struct{}
}

// observer is one follower's handle on a collector.
type observer struct {
	c      *collector
	round  int    // last round this observer was counted in
	last   string // last leader it saw
	lastAt time.Time
}

func newCollector() *collector { return &collector{} }

func (c *collector) add() *observer {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := &observer{c: c}
	c.obs = append(c.obs, o)
	return o
}

// arm starts a round: the next want observers that see a leader accepted
// by match are timed. The returned channel is closed when all have.
func (c *collector) arm(want int, match func(leader string) bool) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.round++
	c.match, c.want, c.times = match, want, make([]time.Time, 0, want)
	c.done = make(chan struct{})
	return c.done
}

// collect ends the round and returns the times seen.
func (c *collector) collect() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.match = nil
	return c.times
}

// saw reports that the observer learned, at at, that leader leads.
func (o *observer) saw(leader string, at time.Time) {
	c := o.c
	c.mu.Lock()
	defer c.mu.Unlock()
	o.last, o.lastAt = leader, at
	c.count(o, leader, at)
}

func (c *collector) count(o *observer, leader string, at time.Time) {
	if c.match == nil || o.round == c.round || !c.match(leader) {
		return
	}
	o.round = c.round
	c.times = append(c.times, at)
	if len(c.times) == c.want {
		close(c.done)
	}
}

// waitAll arms a round for leader and waits until want observers have
// seen it: the followers are in step before the first measured round.
func (c *collector) waitAll(ctx context.Context, want int, leader string, d time.Duration) error {
	done := c.arm(want, func(l string) bool { return l == leader })
	defer c.collect()
	c.mu.Lock()
	for _, o := range c.obs { // those that saw it before the round began
		if o.last == leader {
			c.count(o, o.last, o.lastAt)
		}
	}
	c.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		c.mu.Lock()
		n := len(c.times)
		c.mu.Unlock()
		return fmt.Errorf("only %d of %d observers saw leader %s within %v", n, want, leader, d)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitDone waits for a round's channel, at most d.
func waitDone(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}
