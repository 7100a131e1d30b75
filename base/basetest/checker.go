package basetest

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
)

// Interval is one node's term of leadership, on this process's monotonic
// clock. End is zero while the term lasts.
type Interval struct {
	// Node names the Feed that led, as Checker.Observe was given it.
	Node string
	// Term is the fencing token of its term.
	Term uint64
	// Start and End bound the term (End is zero while it lasts).
	Start, End time.Time
}

// String formats the interval with microsecond times, for failure messages.
func (iv Interval) String() string {
	end := "now"
	if !iv.End.IsZero() {
		end = iv.End.Format("15:04:05.000000")
	}
	return fmt.Sprintf("%s term %d [%s, %s]", iv.Node, iv.Term, iv.Start.Format("15:04:05.000000"), end)
}

// Checker records every node's leadership intervals from its Elected and
// Unelected events and checks the safety rules: no two intervals overlap,
// and terms increase strictly from one interval to the next. It is safe for
// concurrent use.
//
// A node, to the Checker, is one Feed: the name Observe is given. Two
// Feeds that use one node id (two processes, or a restart while the
// earlier Feed still runs) are two nodes, and must be given two names,
// such as the node id and the process.
type Checker struct {
	mu        sync.Mutex
	intervals []Interval
	open      map[string]int // node -> index of its open interval
	problems  []string
}

// NewChecker returns an empty Checker.
func NewChecker() *Checker { return &Checker{open: make(map[string]int)} }

// Observe takes in one event of node, the name of one Feed. Events other
// than EventElected and EventUnelected are ignored; an EventElected must
// carry its claim's record.
func (c *Checker) Observe(node string, e base.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch e.Type {
	case base.EventElected:
		if r := e.Record; r.Vacant() || r.Term != e.Term || r.Revision == 0 {
			c.problems = append(c.problems, fmt.Sprintf("%s elected for term %d carries a record of %q term %d revision %d, not its claim's", node, e.Term, r.Leader, r.Term, r.Revision))
		}
		if i, ok := c.open[node]; ok {
			c.problems = append(c.problems, fmt.Sprintf("%s elected for term %d while its term %d was still open", node, e.Term, c.intervals[i].Term))
		}
		c.open[node] = len(c.intervals)
		c.intervals = append(c.intervals, Interval{Node: node, Term: e.Term, Start: e.At})
	case base.EventUnelected:
		i, ok := c.open[node]
		if !ok {
			c.problems = append(c.problems, fmt.Sprintf("%s unelected from term %d without being elected", node, e.Term))
			return
		}
		if c.intervals[i].Term != e.Term {
			c.problems = append(c.problems, fmt.Sprintf("%s unelected from term %d but was elected for term %d", node, e.Term, c.intervals[i].Term))
		}
		if e.At.Before(c.intervals[i].Start) {
			c.problems = append(c.problems, fmt.Sprintf("%s term %d ended before it began", node, e.Term))
		}
		c.intervals[i].End = e.At
		delete(c.open, node)
	}
}

// Intervals returns the intervals recorded so far, ordered by start, and
// those that start at one instant (a fake clock's) by term: the store's
// order of the writes that began them.
func (c *Checker) Intervals() []Interval {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]Interval(nil), c.intervals...)
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.Before(out[j].Start)
		}
		return out[i].Term < out[j].Term
	})
	return out
}

// Leaders returns the nodes whose interval is open now.
func (c *Checker) Leaders() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.open {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Check returns an error describing every violation: two intervals that
// overlap (both printed), terms that do not increase strictly, and events
// out of order. Open intervals count as lasting until now.
func (c *Checker) Check() error {
	ivs := c.Intervals()
	c.mu.Lock()
	problems := append([]string(nil), c.problems...)
	c.mu.Unlock()
	now := time.Now()
	end := func(iv Interval) time.Time {
		if iv.End.IsZero() {
			return now
		}
		return iv.End
	}
	for i := 1; i < len(ivs); i++ {
		prev, cur := ivs[i-1], ivs[i]
		if cur.Term <= prev.Term {
			problems = append(problems, fmt.Sprintf("term did not increase: %v then %v", prev, cur))
		}
		// Intervals are sorted by start, so checking each against all
		// earlier ones that end after its start finds every overlap.
		for j := i - 1; j >= 0; j-- {
			if end(ivs[j]).After(cur.Start) {
				problems = append(problems, fmt.Sprintf("two leaders at once for %v: %v overlaps %v", end(ivs[j]).Sub(cur.Start), ivs[j], cur))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("basetest: safety violated:\n  %s", strings.Join(problems, "\n  "))
}
