package integration

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kinds of log lines printed by the node program.
const (
	KindStart      = "start"       // the feed started
	KindElected    = "elected"     // Term: won; Mono: when leadership began
	KindUnelected  = "unelected"   // Term, Reason; Mono: when leadership ended
	KindNewLeader  = "new-leader"  // Leader ("" when vacant), Term
	KindSubStarted = "sub-started" // the changefeed (re)opened
	KindSubError   = "sub-error"   // the changefeed failed
	KindAct        = "act"         // Term, First, Last, Count: the leader's job
	KindFence      = "fence"       // Term, Count, Refused, Cancelled, Errors: the leader's fenced writes
	KindExit       = "exit"        // the process is about to exit
)

// linePrefix starts every line the checker reads.
const linePrefix = "LF"

// Line is one line of a node's log, printed by the node program as
//
//	LF <mono_ns> <node> <kind> [args...]
//
// where mono_ns is the Monotonic time of the transition (not of the
// printing). The arguments by kind:
//
//	elected <term>
//	unelected <term> <reason>
//	new-leader <leader|-> <term>
//	act <term> <first_ns> <last_ns> <count>
//	fence <term> <commits> <refused> <cancelled> <errors>
//
// An act line is printed when a term's job ends: from the goroutine that
// watched the term's leader context, the Monotonic times of the first and
// the last moment it found the context live (it reads the clock before it
// checks the context), and how many times it did.
type Line struct {
	Mono   int64
	Node   string
	Kind   string
	Term   uint64
	Reason string
	Leader string
	First  int64
	Last   int64
	Count  int64
	// Of a fence line.
	Refused, Cancelled, Errors int64
}

// String formats l as the node program prints it.
func (l Line) String() string {
	head := fmt.Sprintf("%s %d %s %s", linePrefix, l.Mono, l.Node, l.Kind)
	switch l.Kind {
	case KindElected:
		return fmt.Sprintf("%s %d", head, l.Term)
	case KindUnelected:
		return fmt.Sprintf("%s %d %s", head, l.Term, l.Reason)
	case KindNewLeader:
		leader := l.Leader
		if leader == "" {
			leader = "-"
		}
		return fmt.Sprintf("%s %s %d", head, leader, l.Term)
	case KindAct:
		return fmt.Sprintf("%s %d %d %d %d", head, l.Term, l.First, l.Last, l.Count)
	case KindFence:
		return fmt.Sprintf("%s %d %d %d %d %d", head, l.Term, l.Count, l.Refused, l.Cancelled, l.Errors)
	}
	return head
}

// ParseLine parses a line printed by the node program. ok is false for
// lines that are not log lines (anything not starting with "LF ").
func ParseLine(s string) (l Line, ok bool, err error) {
	f := strings.Fields(s)
	if len(f) == 0 || f[0] != linePrefix {
		return Line{}, false, nil
	}
	bad := func(why string) (Line, bool, error) {
		return Line{}, true, fmt.Errorf("integration: bad log line %q: %s", s, why)
	}
	if len(f) < 4 {
		return bad("too few fields")
	}
	mono, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return bad("time")
	}
	l = Line{Mono: mono, Node: f[2], Kind: f[3]}
	args := f[4:]
	want := map[string]int{KindElected: 1, KindUnelected: 2, KindNewLeader: 2, KindAct: 4, KindFence: 5}[l.Kind]
	if len(args) < want {
		return bad("too few arguments")
	}
	u := func(s string) uint64 {
		v, e := strconv.ParseUint(s, 10, 64)
		if e != nil {
			err = e
		}
		return v
	}
	i := func(s string) int64 {
		v, e := strconv.ParseInt(s, 10, 64)
		if e != nil {
			err = e
		}
		return v
	}
	switch l.Kind {
	case KindElected:
		l.Term = u(args[0])
	case KindUnelected:
		l.Term, l.Reason = u(args[0]), args[1]
	case KindNewLeader:
		l.Leader, l.Term = args[0], u(args[1])
		if l.Leader == "-" {
			l.Leader = ""
		}
	case KindAct:
		l.Term, l.First, l.Last, l.Count = u(args[0]), i(args[1]), i(args[2]), i(args[3])
	case KindFence:
		l.Term, l.Count, l.Refused, l.Cancelled, l.Errors = u(args[0]), i(args[1]), i(args[2]), i(args[3]), i(args[4])
	}
	if err != nil {
		return bad(err.Error())
	}
	return l, true, nil
}

// NodeLog is the log of one node process.
type NodeLog struct {
	// Proc names the process uniquely (a node id can be reused by the
	// process that replaces a killed one), e.g. "n3#2".
	Proc  string
	Lines []Line
	// End is a Monotonic time by which the process had certainly ended
	// (taken after waiting for it). A term still open at the end of the
	// log ends here: a dead process does not act.
	End int64
	// Killed, if not 0, is when the harness sent the process SIGKILL
	// (taken as the kill(2) call returned). A term still open at the end
	// of the log ends here rather than at End: once kill(2) has returned,
	// the process can no longer return to user space, while End is only
	// noticed after its output has been drained and it has been waited
	// for, which on a loaded machine can be hundreds of milliseconds later
	// and would show overlaps that never happened.
	Killed int64
}

// Fault is one injected fault, as the harness recorded it.
type Fault struct {
	Kind   string
	Seq    int    // 1, 2, ... in injection order
	Victim string // the process it was aimed at, if any
	// At is the Monotonic time when injection began.
	At int64
	// NewLeader says the fault removed the leader (kill, stop, cut, resign): a node
	// must be elected after At. Otherwise (the leader may survive the
	// fault) a leader must exist at Ref or be elected after it.
	NewLeader bool
	// Ref is when the fault was over (for a restart: when the server
	// accepted connections again); used when NewLeader is false.
	Ref int64
	// Since, if not 0 (with NewLeader false), is where the time to leader
	// is counted from instead of Ref, while the bound still counts from
	// Ref: for a database failover, the time to leader is from the kill of
	// the primary, and the bound starts when a primary took writes again.
	// A leader elected after Since that leads at Ref counts.
	Since int64
	// LeaseEndBy, if not 0, is a time by which the victim's lease had
	// certainly ended: for a stop, the moment every thread of the victim
	// was seen stopped plus LeaseDuration (no renewal can have been sent
	// later). The term the victim led at At must end by then.
	LeaseEndBy int64
	// Bound, if longer than the bound Check is given, is this fault's
	// liveness bound: the harness stretches it by the load the machine
	// was measured under during the fault (see loadSampler). Safety
	// rules take no bound and stay as strict.
	Bound time.Duration
}

// Interval is one term of one node: from the moment it won to the moment
// its leadership ended (or its process ended).
type Interval struct {
	Proc   string
	Term   uint64
	Start  int64
	End    int64
	Reason string // of the unelected line, or "killed" or "process-ended"
}

// String formats the interval with its times in seconds.
func (iv Interval) String() string {
	return fmt.Sprintf("%s term %d [%s, %s] (%v, ended: %s)", iv.Proc, iv.Term, secs(iv.Start), secs(iv.End),
		time.Duration(iv.End-iv.Start), iv.Reason)
}

func secs(ns int64) string { return strconv.FormatFloat(float64(ns)/1e9, 'f', 6, 64) }

// Report is what Check found.
type Report struct {
	// Intervals of every node, by start.
	Intervals []Interval
	// Overlaps, TermErrors, ActErrors, LogErrors and LivenessErrors
	// describe every violation found, one message each.
	Overlaps       []string
	TermErrors     []string
	ActErrors      []string
	LeaseErrors    []string
	LogErrors      []string
	LivenessErrors []string
	// Starved describes every fault whose leader came after the bound but
	// within the fault's own Bound, stretched by the load measured during
	// it: not a violation, shown in the log.
	Starved []string
	// TimeToLeader is, per fault (same index), how long after the fault
	// (At, Ref or Since: see Fault) a leader existed; -1 when none did.
	TimeToLeader []time.Duration
	// overlapKinds and actKinds count violations by the kind of the fault
	// last injected before them.
	overlapKinds map[string]int
	actKinds     map[string]int
}

// Err returns nil when no rule was broken, or an error listing every
// violation.
func (r *Report) Err() error {
	var all []string
	for _, g := range []struct {
		name string
		msgs []string
	}{
		{"overlapping leadership", r.Overlaps},
		{"terms not increasing", r.TermErrors},
		{"acted as leader outside its leadership", r.ActErrors},
		{"led past its lease", r.LeaseErrors},
		{"malformed log", r.LogErrors},
		{"no leader within the bound", r.LivenessErrors},
	} {
		for _, m := range g.msgs {
			all = append(all, g.name+": "+m)
		}
	}
	if len(all) == 0 {
		return nil
	}
	const maxShown = 40
	more := ""
	if len(all) > maxShown {
		more = fmt.Sprintf("\n... and %d more", len(all)-maxShown)
		all = all[:maxShown]
	}
	return errors.New("integration: " + strings.Join(all, "\n") + more)
}

// Check verifies the logs of every node process against the rules:
//
//   - no two leadership intervals overlap, whichever nodes they belong to
//     (all times are on the machine's one monotonic clock);
//   - terms strictly increase from each leader to the next;
//   - a node's job finds its leader context live only inside that term's
//     interval, which ends at the lease's end when the lease ran out: a
//     node stopped (SIGSTOP) past its lease must find the context
//     cancelled when it wakes;
//   - a leader stopped by a fault ends its term by the time its lease
//     must have ended (Fault.LeaseEndBy);
//   - after every fault a leader exists within bound (see Fault).
func Check(logs []NodeLog, faults []Fault, bound time.Duration) *Report {
	r := &Report{overlapKinds: map[string]int{}, actKinds: map[string]int{}}
	faultAt := func(t int64) string { // the kind of the last fault injected by t
		kind := "none"
		for _, f := range faults {
			if f.At <= t {
				kind = f.Kind
			}
		}
		return kind
	}
	type act struct {
		proc string
		l    Line
	}
	var acts []act
	for _, lg := range logs {
		var open *Interval
		for _, l := range lg.Lines {
			switch l.Kind {
			case KindElected:
				if open != nil {
					r.LogErrors = append(r.LogErrors, fmt.Sprintf("%s: elected for term %d while term %d is open", lg.Proc, l.Term, open.Term))
					open.End, open.Reason = l.Mono, "elected again"
					r.Intervals = append(r.Intervals, *open)
				}
				open = &Interval{Proc: lg.Proc, Term: l.Term, Start: l.Mono}
			case KindUnelected:
				if open == nil || open.Term != l.Term {
					r.LogErrors = append(r.LogErrors, fmt.Sprintf("%s: unelected from term %d it was not elected for", lg.Proc, l.Term))
					continue
				}
				open.End, open.Reason = l.Mono, l.Reason
				if open.End < open.Start {
					r.LogErrors = append(r.LogErrors, fmt.Sprintf("%s: term %d ends before it starts", lg.Proc, l.Term))
				}
				r.Intervals = append(r.Intervals, *open)
				open = nil
			case KindAct:
				if l.Count > 0 {
					acts = append(acts, act{lg.Proc, l})
				}
			}
		}
		if open != nil {
			switch {
			case lg.Killed != 0 && (lg.End == 0 || lg.Killed < lg.End):
				open.End, open.Reason = max(lg.Killed, open.Start), "killed"
			case lg.End != 0:
				open.End, open.Reason = max(lg.End, open.Start), "process-ended"
			default:
				r.LogErrors = append(r.LogErrors, fmt.Sprintf("%s: term %d open and no end of the process recorded", lg.Proc, open.Term))
				continue
			}
			r.Intervals = append(r.Intervals, *open)
		}
	}
	slices.SortFunc(r.Intervals, func(a, b Interval) int {
		if a.Start != b.Start {
			return compare(a.Start, b.Start)
		}
		return compare(a.End, b.End)
	})

	// Overlaps and terms.
	var latest *Interval // the interval seen so far that ends last
	for i := range r.Intervals {
		iv := &r.Intervals[i]
		if latest != nil && iv.Start <= latest.End {
			r.Overlaps = append(r.Overlaps, fmt.Sprintf("%v\n    overlaps %v\n    by %v", *latest, *iv, time.Duration(latest.End-iv.Start)))
			r.overlapKinds[faultAt(iv.Start)]++
		}
		if i > 0 && iv.Term <= r.Intervals[i-1].Term {
			r.TermErrors = append(r.TermErrors, fmt.Sprintf("%v\n    follows %v", *iv, r.Intervals[i-1]))
		}
		if latest == nil || iv.End > latest.End {
			latest = iv
		}
	}

	// Acts.
	for _, a := range acts {
		i := slices.IndexFunc(r.Intervals, func(iv Interval) bool { return iv.Proc == a.proc && iv.Term == a.l.Term })
		if i < 0 {
			r.ActErrors = append(r.ActErrors, fmt.Sprintf("%s acted for term %d, which it never won", a.proc, a.l.Term))
			r.actKinds[faultAt(a.l.First)]++
			continue
		}
		iv := r.Intervals[i]
		switch {
		case a.l.First < iv.Start:
			r.ActErrors = append(r.ActErrors, fmt.Sprintf("%s found its leader context live at %s, %v before its term began: %v",
				a.proc, secs(a.l.First), time.Duration(iv.Start-a.l.First), iv))
			r.actKinds[faultAt(a.l.First)]++
		case a.l.Last > iv.End:
			r.ActErrors = append(r.ActErrors, fmt.Sprintf("%s found its leader context live at %s, %v after its term ended: %v",
				a.proc, secs(a.l.Last), time.Duration(a.l.Last-iv.End), iv))
			r.actKinds[faultAt(a.l.Last)]++
		}
	}

	// Leases of stopped leaders.
	for _, f := range faults {
		if f.LeaseEndBy == 0 {
			continue
		}
		for _, iv := range r.Intervals {
			if iv.Proc == f.Victim && iv.Start <= f.At && f.At <= iv.End && iv.End > f.LeaseEndBy {
				r.LeaseErrors = append(r.LeaseErrors, fmt.Sprintf("fault %d (%s of %s at %s): its term ended %v after its lease must have (%s): %v",
					f.Seq, f.Kind, f.Victim, secs(f.At), time.Duration(iv.End-f.LeaseEndBy), secs(f.LeaseEndBy), iv))
				r.actKinds[f.Kind]++
			}
		}
	}

	// Liveness.
	r.TimeToLeader = make([]time.Duration, len(faults))
	for k, f := range faults {
		ttl := time.Duration(-1)
		if f.NewLeader {
			for _, iv := range r.Intervals {
				if iv.Start > f.At {
					ttl = time.Duration(iv.Start - f.At)
					break
				}
			}
		} else {
			for _, iv := range r.Intervals {
				// A leader at Ref, or one elected after the fault and
				// before Ref: the store took writes before the harness's
				// probe saw it (the term may end before Ref).
				if iv.Start <= f.Ref && (f.Ref <= iv.End || iv.Start > f.At) {
					ttl = 0
					if f.Since != 0 {
						r.TimeToLeader[k] = time.Duration(max(0, iv.Start-f.Since))
					}
					break
				}
				if iv.Start > f.Ref {
					ttl = time.Duration(iv.Start - f.Ref)
					if f.Since != 0 {
						r.TimeToLeader[k] = time.Duration(iv.Start - f.Since)
					}
					break
				}
			}
		}
		if f.Since == 0 || ttl < 0 {
			r.TimeToLeader[k] = ttl
		}
		fb := max(bound, f.Bound)
		switch {
		case ttl < 0:
			r.LivenessErrors = append(r.LivenessErrors, fmt.Sprintf("fault %d (%s of %s at %s): no leader afterwards", f.Seq, f.Kind, f.Victim, secs(f.At)))
		case ttl > fb && fb > bound:
			r.LivenessErrors = append(r.LivenessErrors, fmt.Sprintf("fault %d (%s of %s at %s): a leader only after %v (bound %v, %v for the load measured during the fault)", f.Seq, f.Kind, f.Victim, secs(f.At), ttl, bound, fb))
		case ttl > fb:
			r.LivenessErrors = append(r.LivenessErrors, fmt.Sprintf("fault %d (%s of %s at %s): a leader only after %v (bound %v)", f.Seq, f.Kind, f.Victim, secs(f.At), ttl, bound))
		case ttl > bound:
			r.Starved = append(r.Starved, fmt.Sprintf("fault %d (%s of %s at %s): a leader after %v, over the bound %v but within %v, the bound for the load measured during the fault", f.Seq, f.Kind, f.Victim, secs(f.At), ttl, bound, fb))
		}
	}
	return r
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Counts returns one line with the number of violations of each rule.
func (r *Report) Counts() string {
	return fmt.Sprintf("overlaps %d, terms not increasing %d, acted outside term %d, led past lease %d, malformed %d, no leader within the bound %d",
		len(r.Overlaps), len(r.TermErrors), len(r.ActErrors), len(r.LeaseErrors), len(r.LogErrors), len(r.LivenessErrors))
}

// Summary returns a Markdown table of the faults by kind (in the order of
// kinds): how many, the overlaps found after them, the times a leader acted
// outside its term or led past its lease, and the median, p99 and worst
// time to a leader.
func (r *Report) Summary(faults []Fault, kinds []string) string {
	var b strings.Builder
	b.WriteString("| fault | count | overlaps | acted outside term or lease | median time to leader | p99 | worst |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	row := func(name string, sel func(Fault) bool, overlaps, acts int) {
		var ds []time.Duration
		for i, f := range faults {
			if sel(f) && r.TimeToLeader[i] >= 0 {
				ds = append(ds, r.TimeToLeader[i])
			}
		}
		n := 0
		for _, f := range faults {
			if sel(f) {
				n++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s | %s |\n", name, n, overlaps, acts,
			pct(ds, 0.5), pct(ds, 0.99), pct(ds, 1))
	}
	for _, k := range kinds {
		row(k, func(f Fault) bool { return f.Kind == k }, r.overlapKinds[k], r.actKinds[k])
	}
	row("**all**", func(Fault) bool { return true }, len(r.Overlaps), len(r.ActErrors)+len(r.LeaseErrors))
	return b.String()
}

// pct returns the q-quantile of ds (nearest rank), rounded for a table.
func pct(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	i = min(max(i, 0), len(s)-1)
	return s[i].Round(time.Millisecond).String()
}
