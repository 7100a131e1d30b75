package base_test

// Randomized schedules of faults against the engine on the memory backend,
// under testing/synctest (a fake clock: exact timings, no real sleeps).
//
// Each schedule is one seed: 3 to 5 nodes on one memory DB (in a third
// of the schedules each incarnation on a batching base.Elections of its
// own: writes through the batcher, reads through the batched reader,
// renewals on its grid; in two thirds of those, every incarnation also
// runs one or two side elections of much slower or faster timings on that
// Elections, behind a faulty.Store injecting batch-level faults: whole
// batches failed or their replies lost, one election's write failed or
// its reply lost inside a batch, batches and writes held back past their
// deadlines, late replies), each behind a chaos wrapper (below) that
// injects the faults a real store and network produce: partitions (calls failing at once or hanging), lost replies of
// committed writes, delayed requests and replies, writes that commit after
// the caller gave up, hung calls, stale reads, failed reads and
// subscriptions, lagging, duplicated and broken changefeeds. Users resign,
// transfer leadership (to any node: live, stopped, or the leader itself),
// proclaim, stop and restart nodes (a new Feed with the same id), and roll
// them out (a rolling restart: each node in turn stopped cleanly, started
// again, running before the next). Every node participates (presence records), with one priority. Then every
// fault heals and the nodes that are stopped may restart.
//
// Two kinds of worlds, each a quarter of the schedules (streams of their
// own, so that the other schedules replay as before):
//   - worlds of ties, where several steps read one clock reading on
//     purpose: the chaos wrapper's delays are none at all, or end on a
//     grid of 1 ms or 10 ms (so the replies, notifications and late
//     commits of every node land on the same instants); the engine's
//     random durations (Options.Rand: timeouts, jitter, backoff) are whole
//     milliseconds, so its timers fire on those instants too; and the
//     driver's steps (user calls, checks) land on whole milliseconds;
//   - worlds with a shared node id: two (in a third of them three)
//     schedNodes use one node id, each with faults and incarnations of
//     its own, all running from the start. Their Feeds must act as two or
//     three nodes. Elsewhere a node id is used again only by a restart,
//     after the earlier Feed stopped.
//
// The judges, checked about every millisecond of the fake clock and at the
// end (an incarnation is one Feed, named by its schedNode and number: two
// Feeds with one node id are two incarnations to every judge):
//   - at no instant are two leader contexts live (Err() == nil), whether
//     taken from EventElected or from LeaderContext, over every incarnation;
//   - a live leader context is covered by the engine's own lease rule, judged
//     from outside: a write of that term whose reply the node got, sent less
//     than LeaseDuration ago (and answered before its lease ended);
//   - the leadership intervals of the events (basetest.Checker, keyed by
//     incarnation) never overlap and their terms strictly increase; the
//     store's terms never decrease from one revision to the next;
//   - the view: no incarnation's view of the record goes back to an older
//     one, judged in order over its EventNewLeader and EventElected
//     records and Leader() at every step (after every event so far was
//     read): never a lower revision, nor of one revision a lower term.
//     The memory store never loses an acknowledged write, nor does the
//     chaos wrapper; the only older records it hands a node are its stale
//     reads (one of the last three records), which the engine takes when
//     the read was asked after its last observation (it cannot tell them
//     from a store that lost writes). So the view may go back only to a
//     record no older than one a stale read returned to that incarnation
//     in the last staleWindow (the engine takes a reply in the instant it
//     comes), and only forward from there;
//   - shared node ids: an incarnation reports an EventError matching
//     base.ErrDuplicateID at most once, and Health.DuplicateSeen is set
//     exactly when it did; a twin of the leader (an incarnation with its
//     node id) that runs through the stable window below has reported,
//     and Healthy fails with ErrDuplicateID; no incarnation reports unless
//     a twin that ran while it ran sent a claim or renewal (in worlds with
//     unique ids: never: a predecessor's writes, found by a stale read,
//     brought by a lagging feed or committed late, are not a twin's); the
//     claims and renewals of one Feed carry one incarnation, which no
//     twin's carry;
//   - Stop, Resign and Proclaim return within their context;
//   - a reader of Events slower than the events (up to 2 ms each) gets
//     every leadership event the judges' reader got, Stop's included, and
//     nothing is dropped;
//   - side elections: their leadership intervals never overlap and their
//     terms increase, and a side election's leader keeps leading while
//     nothing fails (whatever the timings it shares batches with);
//   - liveness: once every fault has healed and a campaigning node runs,
//     some node leads within ElectionTimeoutMax plus the longest injected
//     delay (and its grid) plus a few heartbeats, and keeps leading while
//     nothing fails.
//
// go test ./base -run TestSchedules -schedules=5000 runs more schedules
// (-firstseed=F from seed F, -keepgoing past a failure);
// -seed=S replays one (the seed and the trace are printed on failure). The
// driver's choices and every fault decision come from the seed; goroutines
// that run at the same fake instant may still interleave differently, so a
// replay is faithful in its faults and timings, not always to the
// nanosecond.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

var (
	schedCount = flag.Int("schedules", 300, "randomized schedules TestSchedules runs")
	schedSeed  = flag.Uint64("seed", 0, "run only the schedule of this seed (0: schedules 1..N)")
	schedFirst = flag.Uint64("firstseed", 1, "first seed of TestSchedules")
	schedAll   = flag.Bool("keepgoing", false, "TestSchedules runs every schedule, also after one failed (each failure is reported)")
)

func TestSchedules(t *testing.T) {
	if *schedSeed != 0 {
		runSchedule(t, *schedSeed)
		return
	}
	n := uint64(*schedCount)
	if testing.Short() {
		n = min(n, 20)
	}
	t.Cleanup(func() {
		t.Logf("%d transfers returned without error; %d rollouts done; %d worlds of ties, %d with a shared node id (%d duplicate ids reported)",
			schedTransfers.Load(), schedRollouts.Load(), schedTies.Load(), schedShared.Load(), schedDupReports.Load())
	})
	// Two groups in parallel: each schedule is its own bubble.
	for g := uint64(0); g < 2; g++ {
		t.Run(fmt.Sprintf("group%d", g), func(t *testing.T) {
			t.Parallel()
			for s := *schedFirst + g; s < *schedFirst+n; s += 2 {
				if !runSchedule(t, s) && !*schedAll {
					return
				}
			}
		})
	}
}

// schedTransfers counts the transfers of every schedule that succeeded, so
// that a run shows they were exercised.
var schedTransfers atomic.Int64

// schedTies, schedShared and schedDupReports count the worlds of ties,
// those with a shared node id, and the ErrDuplicateID reports in them, so
// that a run shows they were exercised.
var schedTies, schedShared, schedDupReports atomic.Int64

// schedRollouts counts the rolling restarts that restarted every node.
var schedRollouts atomic.Int64

// Regression seeds: schedules that once found a fault, kept as cases.
var schedRegressions = []uint64{1, 50, 1937}

func TestScheduleRegressions(t *testing.T) {
	for _, s := range schedRegressions {
		runSchedule(t, s)
	}
}

// runSchedule runs the schedule of seed and reports whether it passed.
func runSchedule(t *testing.T, seed uint64) bool {
	t.Helper()
	var failure string
	var trace []string
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(seed)
		w.run()
		failure, trace = w.failure, w.trace
	})
	if failure == "" {
		return true
	}
	const maxLines = 3000
	if len(trace) > maxLines {
		trace = append([]string{fmt.Sprintf("... %d earlier lines", len(trace)-maxLines)}, trace[len(trace)-maxLines:]...)
	}
	t.Errorf("schedule seed=%d failed: %s\nreplay: go test ./base -run 'TestSchedules$' -seed=%d -v\ntrace:\n%s",
		seed, failure, seed, strings.Join(trace, "\n"))
	return false
}

// ---- the world: store, nodes, judges ----

type world struct {
	seed uint64
	rng  *rand.Rand // the driver's choices
	trng *rand.Rand // resign or transfer, and to whom
	// rolling is the rolling restart under way (roll): the nodes still
	// to restart, in order, and where the first one is.
	rrng     *rand.Rand
	rolling  []*schedNode
	rollStep int // 0: to stop; 1: stopped by the rollout; 2: started
	timing   heartbeat.Timing
	// alt is a second Timing that some incarnations use when mixed is
	// set: a rolling change of configuration, with leases longer than
	// timing's election timeouts.
	alt   heartbeat.Timing
	mixed bool
	// batched: every incarnation's backend comes from a batching
	// base.Elections of its own (writes through the batcher, reads
	// through the batched reader, renewals aligned on its grid), closed
	// when the schedule ends.
	batched   bool
	elections []*base.Elections
	// multi (of batched worlds): every incarnation also runs the side
	// elections, with timings of their own, on its one batching
	// Elections, behind a faulty.Store that injects batch-level faults
	// (brng's choices); each side election is judged by a Checker, and
	// must keep its leader while nothing fails.
	multi  bool
	sides  []sideElection
	brng   *rand.Rand
	incs   []*incarnation // every incarnation so far (owned by the driver)
	maxDel time.Duration  // the longest injected delay (before landing on the grid)
	store  *memory.DB
	raw    backend.Election // commits writes after their caller gave up
	start  time.Time
	nodes  []*schedNode
	check  *basetest.Checker
	bg     sync.WaitGroup // user calls, event readers, late commits

	// ties: several steps read one clock reading on purpose; the chaos
	// delays land on a grid of grain (0: no delay at all). See newWorld.
	ties  bool
	grain time.Duration
	// shared: one node id is used by two or three schedNodes at once
	// (twins), whose incarnations must act as two or three nodes.
	shared bool

	mu      sync.Mutex
	trace   []string
	failure string
	history map[uint64]heartbeat.Record // committed records by revision
	lastRev uint64
	ctxs    []leaderCtx // leader contexts of EventElected still live
	window  time.Time   // the millisecond calls are counted in
	calls   int         // store calls in window
	storm   bool        // too many calls: every call now hangs
}

// stormCalls is the most store calls all nodes may make in one millisecond
// of the fake clock: a few nodes renewing every 10 ms make a handful; a
// retry loop without a pause makes unboundedly many at one instant.
const stormCalls = 200

// called counts a store call; it reports whether calls must now hang, to
// end a retry loop that never lets the fake clock advance.
func (w *world) called(what string) bool {
	now := time.Now().Truncate(time.Millisecond)
	w.mu.Lock()
	if !now.Equal(w.window) {
		w.window, w.calls = now, 0
	}
	w.calls++
	storm := w.calls > stormCalls
	first := storm && !w.storm
	w.storm = w.storm || storm
	w.mu.Unlock()
	if first {
		w.failf("storm: more than %d store calls in one millisecond (the last: %s)", stormCalls, what)
	}
	return storm
}

type leaderCtx struct {
	key  string
	term uint64
	ctx  context.Context
	rec  heartbeat.Record // EventElected's
}

func newWorld(seed uint64) *world {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	hb := 10 * time.Millisecond
	emin := []time.Duration{40, 50, 60}[rng.IntN(3)] * time.Millisecond
	tm := heartbeat.Timing{
		HeartbeatInterval:  hb,
		ElectionTimeoutMin: emin,
		ElectionTimeoutMax: emin + []time.Duration{0, 10, 20, 40}[rng.IntN(4)]*time.Millisecond,
		LeaseDuration:      []time.Duration{20, 25, 30, 35}[rng.IntN(4)] * time.Millisecond,
	}
	if rng.IntN(3) == 0 {
		tm.VacancyJitter = 2 * time.Millisecond
	}
	if tm.LeaseDuration > emin*9/10 {
		tm.LeaseDuration = emin * 9 / 10
	}
	if err := tm.Validate(); err != nil {
		panic(err)
	}
	store := memory.NewDB()
	raw, _ := store.Election(schedElection)
	w := &world{
		seed: seed, rng: rng, trng: rand.New(rand.NewPCG(seed, 0x7a5)), rrng: rand.New(rand.NewPCG(seed, 0x2011)), timing: tm, maxDel: 2 * tm.LeaseDuration,
		store: store, raw: raw, start: time.Now(), check: basetest.NewChecker(),
		history: map[uint64]heartbeat.Record{},
	}
	// Mixed timings come from a stream of their own, so that the seeds of
	// schedules without them replay as they did before.
	mr := rand.New(rand.NewPCG(seed, 0xa17))
	if mr.IntN(3) == 0 {
		aemin := []time.Duration{60, 80, 100, 120}[mr.IntN(4)] * time.Millisecond
		w.alt = heartbeat.Timing{
			ElectionTimeoutMin: aemin,
			ElectionTimeoutMax: aemin + []time.Duration{0, 10, 30}[mr.IntN(3)]*time.Millisecond,
			LeaseDuration:      aemin * time.Duration(5+mr.IntN(5)) / 10,
		}
		w.alt.HeartbeatInterval = max(5*time.Millisecond, w.alt.LeaseDuration/3)
		if err := w.alt.Validate(); err != nil {
			panic(err)
		}
		w.mixed = true
		w.maxDel = 2 * max(tm.LeaseDuration, w.alt.LeaseDuration)
	}
	// Batched backends come from a stream of their own too.
	w.batched = rand.New(rand.NewPCG(seed, 0xba7c)).IntN(3) == 0
	// So do the side elections of a batched world, and its batch faults.
	w.brng = rand.New(rand.NewPCG(seed, 0x51de))
	if w.batched && w.brng.IntN(3) > 0 {
		w.multi = true
		for i := range 1 + w.brng.IntN(2) {
			st := sideTimings[w.brng.IntN(len(sideTimings))]
			if err := st.Validate(); err != nil {
				panic(err)
			}
			w.sides = append(w.sides, sideElection{name: fmt.Sprintf("side%d", i+1), timing: st, check: basetest.NewChecker()})
		}
	}
	// So do the worlds of ties: in a quarter of them, several steps read
	// one clock reading on purpose. The chaos wrapper's delays are none at
	// all (grain 0) or end on a grid of 1 ms or 10 ms, so that replies,
	// notifications and late commits of every node land on the same
	// instants; the engine's random draws of durations (timeouts, jitter)
	// are whole milliseconds, so its timers fire on them too; and the
	// driver's steps (user calls, checks) land on whole milliseconds.
	if tr := rand.New(rand.NewPCG(seed, 0x71e5)); tr.IntN(4) == 0 {
		w.ties = true
		w.grain = []time.Duration{0, time.Millisecond, 10 * time.Millisecond}[tr.IntN(3)]
	}
	n := 3 + rng.IntN(3)
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		w.nodes = append(w.nodes, &schedNode{w: w, id: id, name: id, idx: i, healed: make(chan struct{})})
	}
	// Shared node ids come from a stream of their own: in a quarter of the
	// worlds, one node id is used by two schedNodes (in a third of those by
	// three), each with its own faults and incarnations, all running at
	// once from the start.
	if dr := rand.New(rand.NewPCG(seed, 0xd0b1)); dr.IntN(4) == 0 {
		j := dr.IntN(n)
		for k := range 1 + dr.IntN(3)/2 {
			id := w.nodes[j].id
			w.nodes = append(w.nodes, &schedNode{w: w, id: id, name: fmt.Sprintf("%s%c", id, 'b'+k), idx: len(w.nodes), healed: make(chan struct{})})
		}
		w.shared = true
	}
	w.tracef("world", "seed=%d nodes=%d timing=%+v", seed, n, tm)
	if w.shared {
		schedShared.Add(1)
		var names []string
		for _, sn := range w.nodes[n:] {
			names = append(names, sn.name)
		}
		w.tracef("world", "shared node id %s: %s run with it too", w.nodes[n].id, strings.Join(names, ", "))
	}
	if w.ties {
		schedTies.Add(1)
		w.tracef("world", "ties: chaos delays on a grid of %v (0: none), engine draws and steps on whole milliseconds", w.grain)
	}
	if w.mixed {
		w.tracef("world", "mixed timings: alt=%+v", w.alt)
	}
	if w.batched {
		w.tracef("world", "batched: every incarnation on a batching Elections of its own")
	}
	for _, se := range w.sides {
		w.tracef("world", "side election %s on every incarnation's Elections: timing=%+v", se.name, se.timing)
	}
	return w
}

// sideElection is an election every incarnation of a multi world runs
// beside schedElection, on the same Elections.
type sideElection struct {
	name   string
	timing heartbeat.Timing
	check  *basetest.Checker
}

// sideTimings are the timings of side elections: much slower and much
// faster than the schedules' own (heartbeat 10 ms), so that one batch
// holds renewals of very different windows.
var sideTimings = []heartbeat.Timing{
	{HeartbeatInterval: 200 * time.Millisecond, LeaseDuration: 400 * time.Millisecond, ElectionTimeoutMin: 500 * time.Millisecond, ElectionTimeoutMax: 600 * time.Millisecond},
	{HeartbeatInterval: 40 * time.Millisecond, LeaseDuration: 80 * time.Millisecond, ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 140 * time.Millisecond},
	{HeartbeatInterval: 4 * time.Millisecond, LeaseDuration: 9 * time.Millisecond, ElectionTimeoutMin: 12 * time.Millisecond, ElectionTimeoutMax: 20 * time.Millisecond},
}

const schedElection = "sched"

func (w *world) since() time.Duration { return time.Since(w.start) }

func (w *world) tracef(who, format string, args ...any) {
	line := fmt.Sprintf("%10.3fms %-6s %s", float64(w.since().Microseconds())/1000, who, fmt.Sprintf(format, args...))
	w.mu.Lock()
	w.trace = append(w.trace, line)
	w.mu.Unlock()
	if schedDebug {
		fmt.Fprintln(os.Stderr, line)
	}
}

var schedDebug = os.Getenv("SCHED_DEBUG") != ""

func (w *world) failf(format string, args ...any) {
	msg := fmt.Sprintf("at %v: %s", w.since(), fmt.Sprintf(format, args...))
	w.tracef("FAIL", "%s", msg)
	w.mu.Lock()
	if w.failure == "" {
		w.failure = msg
	}
	w.mu.Unlock()
}

func (w *world) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failure != ""
}

// committed records a write the store made.
func (w *world) committed(r heartbeat.Record, how string) {
	w.mu.Lock()
	w.history[r.Revision] = r.Clone()
	w.lastRev = max(w.lastRev, r.Revision)
	w.mu.Unlock()
	w.tracef("store", "%s rev=%d leader=%q term=%d handover=%d", how, r.Revision, r.Leader, r.Term, r.Handover)
}

// staleRecord returns a record the store held some revisions ago
// (Revision 0: none yet).
func (w *world) staleRecord(back uint64) heartbeat.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	if back > w.lastRev {
		back = w.lastRev
	}
	return w.history[w.lastRev-back].Clone()
}

// sleep sleeps d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ---- nodes ----

type nodeState int

const (
	stStopped nodeState = iota
	stStarting
	stRunning
	stStopping
)

// schedNode is one node id: its faults (they outlive an incarnation) and
// its current incarnation.
type schedNode struct {
	w    *world
	id   string // the node id its Feeds use: shared by twins
	name string // unique: the id, or the id and a letter for a twin
	idx  int

	mu          sync.Mutex
	f           nodeFaults
	storeFaults bool          // faults were injected into its faulty.Store
	healed      chan struct{} // closed when faults are cleared: releases hangs
	subs        map[*chaosSub]struct{}

	// Owned by the driver.
	state nodeState
	inc   int
	cur   *incarnation
}

// nodeFaults are the faults in force for a node; zero means none.
type nodeFaults struct {
	partitioned bool
	partHang    bool          // partitioned calls hang instead of failing
	lost        float64       // a committed write's reply is lost
	hang        float64       // a call hangs until its context ends
	late        bool          // delayed or hung writes commit after the caller gave up
	delay       time.Duration // requests reach the store up to this late
	replyDelay  time.Duration // replies come back up to this late
	stale       float64       // reads return an older record
	getFail     float64       // reads fail
	subFail     float64       // Subscribe fails
	lag         time.Duration // notifications arrive up to this late
	dup         float64       // notifications are duplicated
}

func (n *schedNode) faults() (nodeFaults, chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.f, n.healed
}

func (n *schedNode) setFaults(fn func(*nodeFaults)) {
	n.mu.Lock()
	old := n.f
	fn(&n.f)
	var subs []*chaosSub
	if n.f.partitioned && !old.partitioned {
		for s := range n.subs {
			subs = append(subs, s)
		}
	}
	n.mu.Unlock()
	for _, s := range subs {
		s.breakWith(errors.New("chaos: partitioned"))
	}
}

// heal clears the faults and releases hung calls.
func (n *schedNode) heal() {
	n.mu.Lock()
	n.f = nodeFaults{}
	n.storeFaults = false
	close(n.healed)
	n.healed = make(chan struct{})
	n.mu.Unlock()
	for _, inc := range n.w.incs {
		if inc.n == n && inc.store != nil {
			inc.store.Heal()
		}
	}
}

func (n *schedNode) breakFeeds() {
	n.mu.Lock()
	var subs []*chaosSub
	for s := range n.subs {
		subs = append(subs, s)
	}
	n.mu.Unlock()
	for _, s := range subs {
		s.breakWith(errors.New("chaos: feed broken"))
	}
}

// incarnation is one Feed of a node.
type incarnation struct {
	n      *schedNode
	key    string // id#incarnation
	timing heartbeat.Timing
	feed   *base.Feed
	be     *chaos
	store  *faulty.Store         // multi: under the Elections, batch faults
	sides  map[string]*base.Feed // multi: the Feeds of the side elections
	slow   chan []base.Event     // the leadership events of a slow reader of Events, once it ended

	born time.Time // when the driver made it

	mu       sync.Mutex
	writes   []writeRec
	presents map[uint64]time.Time // presence token -> when its write was sent
	events   []base.Event         // leadership events, as the judges' reader took them
	ended    time.Time            // when its Feed stopped (Stop returned, or Start failed); zero while it runs
	// The view check (checkView): the last view judged, and the stale
	// reads the chaos wrapper returned to it lately.
	view   viewPoint
	stales []staleRead
	// viewDone: Leader was judged after the Feed stopped (owned by the
	// driver).
	viewDone bool
	// The judges of shared ids: the incarnations its claims and renewals
	// carried (Record.Incarnation: one), whether its first EventNewLeader
	// came, and when it reported ErrDuplicateID.
	wrote      map[uint64]bool
	dupReports []time.Time
}

// viewPoint is a node's view of the record at one moment: the revision
// of the record it holds (0: none, or none in the store) and its term,
// when known (a record's; a missing record's view has none).
type viewPoint struct {
	rev, term uint64
	termKnown bool
	ok        bool   // a view was judged
	what      string // where it came from, for the failure message
}

// staleRead is a record the chaos wrapper returned to a read as a stale
// one, and when.
type staleRead struct {
	rev, term uint64
	at        time.Time
}

// writeRec is one Heartbeat call of an incarnation, as its wrapper saw it.
type writeRec struct {
	sent, replied time.Time
	next          heartbeat.Record
	ok            bool
}

// leaseBound is the end of the lease of term by the engine's rule judged
// from outside: the latest send time + LeaseDuration of a write of term
// whose successful reply came back before that end, or, when the term
// began with a record handed to this node (elected: EventElected's record
// names it with term and the token of one of its presence writes), the
// send time of that presence write + the shorter of LeaseDuration and the
// record's Lease.
func (inc *incarnation) leaseBound(term uint64, elected heartbeat.Record) time.Time {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	var end time.Time
	lease := inc.timing.LeaseDuration
	if r := elected; r.Leader == inc.n.id && r.Term == term && r.Handover != 0 {
		if sent, ok := inc.presents[r.Handover]; ok {
			end = sent.Add(min(lease, r.Lease))
		}
	}
	for _, wr := range inc.writes {
		if wr.ok && wr.next.Leader == inc.n.id && wr.next.Term == term {
			if e := wr.sent.Add(lease); wr.replied.Before(e) && e.After(end) {
				end = e
			}
		}
	}
	return end
}

// ---- the chaos backend ----

// chaos wraps one incarnation's memory backend and injects its node's
// faults. Every decision comes from per-method generators seeded by the
// schedule.
type chaos struct {
	backend.Election
	n   *schedNode
	inc *incarnation

	mu                     sync.Mutex
	rGet, rWrite, rSub, rN *rand.Rand
}

var errChaos = errors.New("chaos: injected fault")

// AlignRenewal passes the renewal grid of a batching Elections through.
func (c *chaos) AlignRenewal(due time.Time, interval time.Duration) time.Time {
	if a, ok := c.Election.(backend.Aligner); ok {
		return a.AlignRenewal(due, interval)
	}
	return due
}

func (c *chaos) roll(r *rand.Rand, p float64) bool {
	if p <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.Float64() < p
}

// dur draws an injected delay of up to d, landed on the grid of a world
// of ties (land).
func (c *chaos) dur(r *rand.Rand, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return c.n.w.land(time.Duration(c.count(r, int64(d))))
}

// count draws from [0, n].
func (c *chaos) count(r *rand.Rand, n int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.Int64N(n + 1)
}

// land returns how long an injected delay of d lasts: d, or in a world of
// ties nothing (grain 0) or until the first instant of the grain's grid at
// least d from now, where the other delays of every node end too.
func (w *world) land(d time.Duration) time.Duration {
	if !w.ties {
		return d
	}
	if w.grain == 0 {
		return 0
	}
	now := time.Now()
	at := now.Add(d)
	if g := at.Truncate(w.grain); g.Before(at) {
		at = g.Add(w.grain)
	}
	return at.Sub(now)
}

// hang blocks until ctx ends or the node's faults heal.
func (c *chaos) hang(ctx context.Context, healed chan struct{}) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-healed:
		return fmt.Errorf("%w: connection reset", errChaos)
	}
}

// gate applies a partition; it returns a non-nil error for a partitioned
// call.
func (c *chaos) gate(ctx context.Context, f nodeFaults, healed chan struct{}) error {
	if c.n.w.called(c.inc.key) {
		<-ctx.Done()
		return ctx.Err()
	}
	if !f.partitioned {
		return nil
	}
	if f.partHang {
		return c.hang(ctx, healed)
	}
	return fmt.Errorf("%w: partitioned", errChaos)
}

func (c *chaos) Start(ctx context.Context) error {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return err
	}
	return c.Election.Start(ctx)
}

func (c *chaos) Create(ctx context.Context) error {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return err
	}
	return c.Election.Create(ctx)
}

func (c *chaos) Get(ctx context.Context) (heartbeat.Record, error) {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return heartbeat.Record{}, err
	}
	if c.roll(c.rGet, f.hang) {
		return heartbeat.Record{}, c.hang(ctx, healed)
	}
	if c.roll(c.rGet, f.getFail) {
		return heartbeat.Record{}, fmt.Errorf("%w: read failed", errChaos)
	}
	if !sleepCtx(ctx, c.dur(c.rGet, f.delay)) {
		return heartbeat.Record{}, ctx.Err()
	}
	var r heartbeat.Record
	var err error
	stale := c.roll(c.rGet, f.stale)
	if stale {
		r = c.n.w.staleRecord(uint64(c.count(c.rGet, 3)))
		if r.Revision == 0 {
			err = fmt.Errorf("chaos: stale read: %w", backend.ErrNotFound)
		}
	} else {
		r, err = c.Election.Get(ctx)
	}
	if !sleepCtx(ctx, c.dur(c.rGet, f.replyDelay)) {
		return heartbeat.Record{}, ctx.Err()
	}
	if stale {
		c.inc.mu.Lock()
		sr := staleRead{rev: r.Revision, term: r.Term, at: time.Now()}
		c.inc.stales = append(c.inc.stales, sr)
		c.inc.mu.Unlock()
	}
	return r, err
}

// Present, Absent and Participants: the presence capability of the
// memory backend, behind the node's partition.
func (c *chaos) Present(ctx context.Context, p backend.Presence) error {
	c.inc.mu.Lock()
	if c.inc.presents == nil {
		c.inc.presents = make(map[uint64]time.Time)
	}
	c.inc.presents[p.Token] = time.Now()
	c.inc.mu.Unlock()
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return err
	}
	return c.Election.(backend.PresenceElection).Present(ctx, p)
}

func (c *chaos) Absent(ctx context.Context, node string) error {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return err
	}
	return c.Election.(backend.PresenceElection).Absent(ctx, node)
}

func (c *chaos) Participants(ctx context.Context) ([]backend.Presence, time.Time, error) {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return nil, time.Time{}, err
	}
	return c.Election.(backend.PresenceElection).Participants(ctx)
}

func (c *chaos) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	sent := time.Now()
	if next.Leader == c.n.id && next.Handover == 0 {
		// A claim or renewal: its incarnation is this Feed's. Noted before
		// the call, since the feed may bring the record before the reply.
		c.inc.mu.Lock()
		if c.inc.wrote == nil {
			c.inc.wrote = make(map[uint64]bool)
		}
		c.inc.wrote[next.Incarnation] = true
		c.inc.mu.Unlock()
	}
	res, err := c.heartbeat(ctx, expected, next, nil)
	return c.logged(sent, next, res, err)
}

// logged notes a write sent at sent for the judge, and returns its result.
func (c *chaos) logged(sent time.Time, next, res heartbeat.Record, err error) (heartbeat.Record, error) {
	c.inc.mu.Lock()
	c.inc.writes = append(c.inc.writes, writeRec{sent: sent, replied: time.Now(), next: next.Clone(), ok: err == nil})
	c.inc.mu.Unlock()
	return res, err
}

// HeartbeatGuarded is the guarded write of the memory backend (a handover
// to a participant), with the faults of Heartbeat.
func (c *chaos) HeartbeatGuarded(ctx context.Context, expected, next heartbeat.Record, guard backend.Guard) (heartbeat.Record, error) {
	sent := time.Now()
	res, err := c.heartbeat(ctx, expected, next, &guard)
	return c.logged(sent, next, res, err)
}

// lateCommit makes the write after d, whatever became of its caller:
// guarded by guard if set.
func (c *chaos) lateCommit(expected, next heartbeat.Record, guard *backend.Guard, d time.Duration) {
	w := c.n.w
	key := c.inc.key
	next = next.Clone()
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		time.Sleep(d)
		res, err := write(context.Background(), w.raw, expected, next, guard)
		if err == nil {
			w.committed(res, "late commit of "+key)
		}
	}()
}

// write is b's Heartbeat, or its HeartbeatGuarded when guard is set.
func write(ctx context.Context, b backend.Election, expected, next heartbeat.Record, guard *backend.Guard) (heartbeat.Record, error) {
	if guard == nil {
		return b.Heartbeat(ctx, expected, next)
	}
	return b.(backend.GuardElection).HeartbeatGuarded(ctx, expected, next, *guard)
}

func (c *chaos) heartbeat(ctx context.Context, expected, next heartbeat.Record, guard *backend.Guard) (heartbeat.Record, error) {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return heartbeat.Record{}, err
	}
	late := f.late && c.roll(c.rWrite, 0.5)
	if c.roll(c.rWrite, f.hang) {
		err := c.hang(ctx, healed)
		if late {
			c.lateCommit(expected, next, guard, c.dur(c.rWrite, c.n.w.maxDel))
		}
		return heartbeat.Record{}, err
	}
	if d := c.dur(c.rWrite, f.delay); !sleepCtx(ctx, d) {
		if late {
			c.lateCommit(expected, next, guard, c.dur(c.rWrite, d))
		}
		return heartbeat.Record{}, ctx.Err()
	}
	res, err := write(ctx, c.Election, expected, next, guard)
	if err != nil {
		return res, err
	}
	c.n.w.committed(res, "write of "+c.inc.key)
	if c.roll(c.rWrite, f.lost) {
		return heartbeat.Record{}, fmt.Errorf("%w: reply lost", errChaos)
	}
	if !sleepCtx(ctx, c.dur(c.rWrite, f.replyDelay)) {
		return heartbeat.Record{}, ctx.Err()
	}
	return res, nil
}

func (c *chaos) Subscribe(ctx context.Context) (<-chan backend.Notification, error) {
	f, healed := c.n.faults()
	if err := c.gate(ctx, f, healed); err != nil {
		return nil, err
	}
	if c.roll(c.rSub, f.hang) {
		return nil, c.hang(ctx, healed)
	}
	if c.roll(c.rSub, f.subFail) {
		return nil, fmt.Errorf("%w: subscribe failed", errChaos)
	}
	inner, cancel := context.WithCancel(ctx)
	in, err := c.Election.Subscribe(inner)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &chaosSub{c: c, out: make(chan backend.Notification), broken: make(chan error, 1)}
	c.n.mu.Lock()
	if c.n.subs == nil {
		c.n.subs = map[*chaosSub]struct{}{}
	}
	c.n.subs[s] = struct{}{}
	c.n.mu.Unlock()
	go s.forward(ctx, in, cancel)
	return s.out, nil
}

// chaosSub forwards a feed with lag and duplicates, and can be broken.
type chaosSub struct {
	c      *chaos
	out    chan backend.Notification
	broken chan error
}

func (s *chaosSub) breakWith(err error) {
	select {
	case s.broken <- err:
	default:
	}
}

type queued struct {
	n   backend.Notification
	due time.Time
}

func (s *chaosSub) forward(ctx context.Context, in <-chan backend.Notification, cancel context.CancelFunc) {
	defer func() {
		cancel()
		for range in {
		}
		close(s.out)
		s.c.n.mu.Lock()
		delete(s.c.n.subs, s)
		s.c.n.mu.Unlock()
	}()
	var q []queued
	var last time.Time
	for {
		var out chan backend.Notification
		var head backend.Notification
		var timer *time.Timer
		var timerC <-chan time.Time
		if len(q) > 0 {
			if d := time.Until(q[0].due); d <= 0 {
				out, head = s.out, q[0].n
			} else {
				timer = time.NewTimer(d)
				timerC = timer.C
			}
		}
		select {
		case n, ok := <-in:
			if !ok {
				return
			}
			f, _ := s.c.n.faults()
			due := time.Now().Add(s.c.dur(s.c.rN, f.lag))
			if due.Before(last) {
				due = last // in order
			}
			last = due
			q = append(q, queued{n, due})
			if n.Type != backend.Failed && s.c.roll(s.c.rN, f.dup) {
				q = append(q, queued{n, due})
			}
		case out <- head:
			q = q[1:]
			if head.Type == backend.Failed {
				return
			}
		case <-timerC:
		case err := <-s.broken:
			select {
			case s.out <- backend.Notification{Type: backend.Failed, Err: err}:
			case <-ctx.Done():
			}
			return
		case <-ctx.Done():
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// ---- the driver ----

func (w *world) newRand(n *schedNode, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(w.seed, uint64(n.idx)<<32|uint64(n.inc)<<8|stream))
}

// startNode starts a new incarnation of n (asynchronously: Start may hang).
func (w *world) startNode(n *schedNode) {
	n.inc++
	inc := &incarnation{n: n, key: fmt.Sprintf("%s#%d", n.name, n.inc), timing: w.timing, born: time.Now()}
	if w.mixed && w.newRand(n, 6).IntN(2) == 0 {
		inc.timing = w.alt
	}
	b, _ := w.store.Election(schedElection)
	var els *base.Elections
	if w.batched {
		var st backend.Store = w.store.Conn()
		if w.multi {
			inc.store = faulty.WrapStore(st)
			st = inc.store
		}
		var err error
		els, err = base.NewElections(st, base.ElectionsOptions{})
		if err != nil {
			w.failf("NewElections: %v", err)
			return
		}
		w.mu.Lock()
		w.elections = append(w.elections, els)
		w.mu.Unlock()
		_ = b.Close()
		b, _ = els.Election(schedElection)
	}
	c := &chaos{Election: b, n: n, inc: inc,
		rGet: w.newRand(n, 1), rWrite: w.newRand(n, 2), rSub: w.newRand(n, 3), rN: w.newRand(n, 4)}
	inc.be = c
	// Every node participates (with one priority: a handover by priority
	// would end the stable leadership the liveness judge expects), so that
	// it can be the target of a transfer.
	var r heartbeat.Rand = w.newRand(n, 5)
	if w.ties {
		r = msRand{r.(*rand.Rand)}
	}
	f, err := base.New(c, n.id, base.Options{Timing: inc.timing, Rand: r, Value: []byte(inc.key), Participate: true})
	if err != nil {
		w.failf("New: %v", err)
		return
	}
	inc.feed = f
	n.cur = inc
	w.incs = append(w.incs, inc)
	n.setState(stStarting)
	sub := f.Subscribe(context.Background())
	w.bg.Add(1)
	go func() { // the event reader
		defer w.bg.Done()
		for e := range sub.C {
			w.onEvent(inc, e)
		}
	}()
	w.slowReader(inc)
	for i, se := range w.sides {
		sf, err := els.Feed(se.name, n.id, base.Options{Timing: se.timing, Rand: w.newRand(n, 16+uint64(i))})
		if err != nil {
			w.failf("side Feed: %v", err)
			return
		}
		if inc.sides == nil {
			inc.sides = make(map[string]*base.Feed)
		}
		inc.sides[se.name] = sf
		ssub := sf.Subscribe(context.Background())
		w.bg.Add(1)
		go func() {
			defer w.bg.Done()
			for e := range ssub.C {
				if e.Type == base.EventElected || e.Type == base.EventUnelected {
					se.check.Observe(inc.key, e)
					w.tracef(inc.key, "%s: %v", se.name, e)
				}
			}
		}()
	}
	w.tracef(inc.key, "start")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		defer cancel()
		err := f.Start(ctx)
		w.tracef(inc.key, "started: %v", err)
		if err != nil {
			_ = f.Stop(context.Background())
			inc.setEnded()
			inc.stopSides()
		} else {
			for name, sf := range inc.sides {
				if err := sf.Start(context.Background()); err != nil {
					w.failf("%s: Start of %s: %v", inc.key, name, err)
				}
			}
		}
		w.mu.Lock()
		if err == nil {
			n.state = stRunning
		} else {
			n.state = stStopped
		}
		w.mu.Unlock()
	}()
}

// msRand is the engine's Rand in a world of ties: its draws of durations
// (a span of up to a minute: timeouts, jitter, backoff) are whole
// milliseconds, so that the timers of several nodes fire at one instant;
// larger draws (incarnations, presence tokens) are left alone.
type msRand struct{ r *rand.Rand }

func (m msRand) Int64N(n int64) int64 {
	const ms = int64(time.Millisecond)
	if n > int64(time.Minute) {
		return m.r.Int64N(n)
	}
	return m.r.Int64N((n-1)/ms+1) * ms
}

func (w *world) onEvent(inc *incarnation, e base.Event) {
	switch e.Type {
	case base.EventChange:
		return
	case base.EventElected:
		w.mu.Lock()
		w.ctxs = append(w.ctxs, leaderCtx{key: inc.key, term: e.Term, ctx: e.LeaderCtx, rec: e.Record})
		w.mu.Unlock()
		w.checkView(inc, recordView(e.Record, "EventElected"))
	case base.EventNewLeader:
		w.checkView(inc, recordView(e.Record, "EventNewLeader"))
	case base.EventError:
		if errors.Is(e.Err, base.ErrDuplicateID) {
			schedDupReports.Add(1)
			inc.mu.Lock()
			inc.dupReports = append(inc.dupReports, time.Now())
			inc.mu.Unlock()
		}
	}
	if leadership(e) {
		inc.mu.Lock()
		inc.events = append(inc.events, e)
		inc.mu.Unlock()
	}
	w.check.Observe(inc.key, e)
	w.tracef(inc.key, "%v", e)
}

// recordView is the view of a node that holds r (Revision 0: none).
func recordView(r heartbeat.Record, what string) viewPoint {
	return viewPoint{rev: r.Revision, term: r.Term, termKnown: r.Revision != 0, ok: true, what: what}
}

// staleWindow is how long after a stale read returned a node's view may
// go back to it: the engine takes a reply in the instant it comes, and the
// next judgement of its view (an event, or Leader at the next step, at
// most 2 ms later) sees it.
const staleWindow = 3 * time.Millisecond

// checkView judges the next view v of inc (from its events in order, and
// from Leader at every step once every event so far was read): never a
// record older than the last view judged (a lower revision, or of one
// revision a lower term), unless a stale read returned a record no newer
// than v to inc within staleWindow.
func (w *world) checkView(inc *incarnation, v viewPoint) {
	now := time.Now()
	inc.mu.Lock()
	prev := inc.view
	back := prev.ok && (v.rev < prev.rev || (v.termKnown && prev.termKnown && v.term < prev.term))
	licensed := false
	keep := inc.stales[:0]
	for _, s := range inc.stales {
		if now.Sub(s.at) > staleWindow {
			continue
		}
		keep = append(keep, s)
		licensed = licensed || (s.rev <= v.rev && (!v.termKnown || s.term <= v.term))
	}
	inc.stales = keep
	if !v.termKnown && prev.ok && prev.rev == v.rev {
		v.term, v.termKnown = prev.term, prev.termKnown
	}
	inc.view = v
	inc.mu.Unlock()
	if back && !licensed {
		w.failf("%s: view went back from revision %d term %d (%s) to revision %d term %d (%s), and no stale read returned it",
			inc.key, prev.rev, prev.term, prev.what, v.rev, v.term, v.what)
	}
}

// checkDuplicates judges, once inc stopped, what it reported of its node
// id being shared: at most one EventError matching ErrDuplicateID, and
// Health.DuplicateSeen set exactly when one came; none at all unless a
// twin (another incarnation with its node id that ran while it ran) sent
// a claim or renewal. Its own claims and renewals carry one incarnation,
// which no twin's carry.
func (w *world) checkDuplicates(inc *incarnation) {
	if inc.feed == nil {
		return
	}
	inc.mu.Lock()
	reports := len(inc.dupReports)
	mine := make(map[uint64]bool, len(inc.wrote))
	for x := range inc.wrote {
		mine[x] = true
	}
	born, ended := inc.born, inc.ended
	inc.mu.Unlock()
	if reports > 1 {
		w.failf("%s: %d EventErrors matching ErrDuplicateID, want at most one", inc.key, reports)
	}
	if seen := !inc.feed.Health().DuplicateSeen.IsZero(); seen != (reports > 0) {
		w.failf("%s: Health.DuplicateSeen set %v, but %d EventErrors matching ErrDuplicateID", inc.key, seen, reports)
	}
	if len(mine) > 1 {
		w.failf("%s: its claims and renewals carry %d incarnations, want one", inc.key, len(mine))
	}
	twinWrote := false
	for _, o := range w.incs {
		if o == inc || o.n.id != inc.n.id {
			continue
		}
		o.mu.Lock()
		overlap := (ended.IsZero() || o.born.Before(ended)) && (o.ended.IsZero() || born.Before(o.ended))
		for x := range o.wrote {
			if mine[x] {
				w.failf("%s and %s: claims or renewals of both carry incarnation %d", inc.key, o.key, x)
			}
			twinWrote = twinWrote || overlap
		}
		o.mu.Unlock()
	}
	if reports > 0 && !twinWrote {
		w.failf("%s: reported ErrDuplicateID, but no other process with its node id sent a claim or renewal while it ran", inc.key)
	}
}

// leadership reports whether e is an event the docs promise never to drop
// for a reader that reads.
func leadership(e base.Event) bool {
	return e.Type == base.EventElected || e.Type == base.EventUnelected || e.Type == base.EventNewLeader
}

// slowReader reads inc's Events slower than the judges' reader (up to 2
// ms an event, well within ElectionTimeoutMin), and hands the leadership
// events it got to inc.slow when the channel closes: after Stop it must
// have got every one the judges' reader got, and dropped nothing.
func (w *world) slowReader(inc *incarnation) {
	events := inc.feed.Events()
	r := w.newRand(inc.n, 7)
	inc.slow = make(chan []base.Event, 1)
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		var got []base.Event
		for e := range events {
			if leadership(e) {
				got = append(got, e)
			}
			time.Sleep(time.Duration(r.Int64N(int64(2 * time.Millisecond))))
		}
		inc.slow <- got
	}()
}

// checkSlowReader compares what inc's slow reader of Events got with what
// the judges' reader got, once both ended.
func (w *world) checkSlowReader(inc *incarnation) {
	got := <-inc.slow
	inc.mu.Lock()
	want := inc.events
	inc.mu.Unlock()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		same = got[i].Type == want[i].Type && got[i].Term == want[i].Term && got[i].Leader == want[i].Leader
	}
	if !same {
		w.failf("%s: the slow reader of Events got %d leadership events, the judges' reader %d: %v, want %v", inc.key, len(got), len(want), got, want)
	}
	if d := inc.feed.Dropped(); d != 0 {
		w.failf("%s: Events dropped %d events for a reader that reads", inc.key, d)
	}
}

// setEnded notes that inc's Feed stopped.
func (inc *incarnation) setEnded() {
	inc.mu.Lock()
	inc.ended = time.Now()
	inc.mu.Unlock()
}

// stopSides stops the side elections' Feeds of inc (after its main one).
func (inc *incarnation) stopSides() {
	for _, sf := range inc.sides {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := sf.Stop(ctx); err != nil {
			inc.n.w.failf("%s: Stop of a side election: %v", inc.key, err)
		}
		cancel()
	}
}

func (n *schedNode) getState() nodeState {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	return n.state
}

func (n *schedNode) setState(s nodeState) {
	n.w.mu.Lock()
	n.state = s
	n.w.mu.Unlock()
}

// userCall runs a call bounded by a context of timeout d (none if 0) in
// the background and checks it returns within it.
func (w *world) userCall(who, what string, d time.Duration, call func(context.Context) error, done func(error)) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	var deadline time.Time
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
		deadline, _ = ctx.Deadline()
	}
	w.tracef(who, "%s (timeout %v)", what, d)
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		defer cancel()
		err := call(ctx)
		if !deadline.IsZero() && time.Now().After(deadline) {
			w.failf("%s %s returned %v after its context's deadline", who, what, time.Since(deadline))
		}
		w.tracef(who, "%s returned %v", what, err)
		if done != nil {
			done(err)
		}
	}()
}

// stopNode stops n's incarnation with a context of timeout d (0: none).
func (w *world) stopNode(n *schedNode, d time.Duration) {
	inc := n.cur
	n.setState(stStopping)
	w.userCall(inc.key, "stop", d, inc.feed.Stop, func(error) {
		select {
		case <-inc.feed.Done():
		default:
			w.failf("%s: Stop returned before Done closed", inc.key)
		}
		inc.setEnded()
		inc.stopSides()
		n.setState(stStopped)
	})
}

// leaderNow returns the running node whose leader context is live, if any.
func (w *world) leaderNow() *schedNode {
	for _, n := range w.nodes {
		if n.getState() == stRunning {
			if ctx, _, ok := n.cur.feed.LeaderContext(); ok && ctx.Err() == nil {
				return n
			}
		}
	}
	return nil
}

func (w *world) pick() *schedNode { return w.nodes[w.rng.IntN(len(w.nodes))] }

func (w *world) randDur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

// act does one random thing.
func (w *world) act() {
	// Rollouts come from a stream of their own, so that the driver's
	// other choices stay those of the seed.
	if len(w.rolling) == 0 && w.rrng.IntN(40) == 0 {
		w.rolling = nil
		for _, i := range w.rrng.Perm(len(w.nodes)) {
			w.rolling = append(w.rolling, w.nodes[i])
		}
		w.rollStep = 0
		w.tracef("world", "rollout begins")
	}
	switch k := w.rng.IntN(20); {
	case k < 11:
		w.injectFault()
	case k < 13: // resign or transfer, mostly the leader
		n := w.leaderNow()
		if n == nil || w.rng.IntN(4) == 0 {
			n = w.pick()
		}
		// Transfers come from a stream of their own, so that the driver's
		// other choices stay those of the seed.
		transfer, to := w.trng.IntN(2) == 0, w.nodes[w.trng.IntN(len(w.nodes))]
		if n.getState() == stRunning {
			f := n.cur.feed
			if transfer {
				w.userCall(n.cur.key, "transfer to "+to.id, w.timeoutChoice(), func(ctx context.Context) error { return f.TransferTo(ctx, to.id) }, func(err error) {
					if err == nil {
						schedTransfers.Add(1)
					}
				})
			} else {
				w.userCall(n.cur.key, "resign", w.timeoutChoice(), f.Resign, nil)
			}
		}
	case k < 15: // proclaim
		n := w.leaderNow()
		if n == nil || w.rng.IntN(4) == 0 {
			n = w.pick()
		}
		if n.getState() == stRunning {
			f := n.cur.feed
			v := fmt.Appendf(nil, "v%d", w.rng.IntN(1000))
			w.userCall(n.cur.key, "proclaim "+string(v), w.timeoutChoice(), func(ctx context.Context) error { return f.Proclaim(ctx, v) }, nil)
		}
	case k < 17: // stop
		n := w.leaderNow()
		if n == nil || w.rng.IntN(3) == 0 {
			n = w.pick()
		}
		if n.getState() == stRunning {
			w.stopNode(n, w.timeoutChoice())
		}
	default: // restart a stopped node
		for _, n := range w.nodes {
			if n.getState() == stStopped {
				w.startNode(n)
				break
			}
		}
	}
}

// roll moves the rollout under way on: it stops each node in turn (a
// clean Stop, as a deploy does), starts it again (a new incarnation with
// its node id), and waits until it runs before the next. Other actions
// may stop or start the node meanwhile; roll takes it from where it is.
func (w *world) roll() {
	if len(w.rolling) == 0 {
		return
	}
	n := w.rolling[0]
	switch n.getState() {
	case stStopped: // by the rollout, another action, or a failed start
		w.startNode(n)
		w.rollStep = 2
	case stRunning:
		if w.rollStep == 0 {
			w.stopNode(n, w.timeoutChoice())
			w.rollStep = 1
			return
		}
		w.rolling, w.rollStep = w.rolling[1:], 0
		if len(w.rolling) == 0 {
			w.tracef("world", "rollout done")
			schedRollouts.Add(1)
		}
	}
}

// timeoutChoice returns the timeout of a user call's context; 0 (none)
// now and then.
func (w *world) timeoutChoice() time.Duration {
	if w.rng.IntN(5) == 0 {
		return 0
	}
	return w.randDur(time.Millisecond, 4*w.timing.HeartbeatInterval)
}

// injectFault sets one fault on a node for a while.
func (w *world) injectFault() {
	if w.multi && w.brng.IntN(3) == 0 {
		w.injectBatchFault()
		return
	}
	n := w.pick()
	if w.rng.IntN(3) == 0 {
		if l := w.leaderNow(); l != nil {
			n = l // faults on the leader matter most
		}
	}
	var what string
	var set func(*nodeFaults)
	p := []float64{0.2, 0.5, 1}[w.rng.IntN(3)]
	d := w.randDur(time.Millisecond, w.maxDel)
	switch w.rng.IntN(12) {
	case 0:
		what, set = "partition", func(f *nodeFaults) { f.partitioned, f.partHang = true, false }
	case 1:
		what, set = "partition (calls hang)", func(f *nodeFaults) { f.partitioned, f.partHang = true, true }
	case 2:
		what, set = fmt.Sprintf("lost replies p=%v", p), func(f *nodeFaults) { f.lost = p }
	case 3:
		what, set = fmt.Sprintf("delayed requests %v, late commits", d), func(f *nodeFaults) { f.delay, f.late = d, true }
	case 4:
		what, set = fmt.Sprintf("delayed replies %v", d), func(f *nodeFaults) { f.replyDelay = d }
	case 5:
		what, set = fmt.Sprintf("hung calls p=%v, late commits", p), func(f *nodeFaults) { f.hang, f.late = p, true }
	case 6:
		what, set = fmt.Sprintf("stale reads p=%v", p), func(f *nodeFaults) { f.stale = p }
	case 7:
		what, set = fmt.Sprintf("failed reads p=%v", p), func(f *nodeFaults) { f.getFail = p }
	case 8:
		what, set = fmt.Sprintf("failed subscribes p=%v", p), func(f *nodeFaults) { f.subFail = p }
	case 9:
		what, set = fmt.Sprintf("feed lag %v", d), func(f *nodeFaults) { f.lag = d }
	case 10:
		what, set = fmt.Sprintf("duplicated notifications p=%v", p), func(f *nodeFaults) { f.dup = p }
	default:
		w.tracef(n.name, "fault: feed broken")
		n.breakFeeds()
		return
	}
	w.tracef(n.name, "fault: %s", what)
	n.setFaults(set)
}

// errBatch is the error of a batch-level fault.
var errBatch = errors.New("chaos: batch failed")

// injectBatchFault sets one fault on the faulty.Store under a node's
// Elections (multi worlds), until the node heals: whole batches failed,
// batches whose reply is lost, one election's write failed or its reply
// lost inside a batch, batches or single writes (claims, vacancies,
// guarded handovers) delayed (a hang to their deadline for the writes
// whose deadline is shorter), replies held back.
// The choices come from brng.
func (w *world) injectBatchFault() {
	n := w.nodes[w.brng.IntN(len(w.nodes))]
	inc := n.cur
	if inc == nil || inc.store == nil || n.getState() != stRunning {
		return
	}
	names := []string{schedElection}
	for _, se := range w.sides {
		names = append(names, se.name)
	}
	election := names[w.brng.IntN(len(names))]
	nth := w.brng.IntN(4) // 0: every call until heal
	d := time.Millisecond + time.Duration(w.brng.Int64N(int64(w.maxDel)))
	single := faulty.MethodHeartbeat // a claim, or an unguarded vacancy
	if w.brng.IntN(2) == 0 {
		single = faulty.MethodHeartbeatGuarded // a handover to a participant
	}
	var ft faulty.Fault
	switch w.brng.IntN(7) {
	case 0:
		ft = faulty.Fault{Method: faulty.MethodHeartbeatBatch, Err: errBatch}
	case 1:
		ft = faulty.Fault{Method: faulty.MethodHeartbeatBatch, Err: errBatch, After: true}
	case 2:
		ft = faulty.Fault{Method: faulty.MethodHeartbeatBatch, Election: election, After: w.brng.IntN(2) == 0}
	case 3:
		ft = faulty.Fault{Method: faulty.MethodHeartbeatBatch, Delay: d}
	case 4:
		ft = faulty.Fault{Method: single, Election: election, Delay: d}
	case 5:
		ft = faulty.Fault{Method: single, Election: election, Err: errBatch, After: w.brng.IntN(2) == 0}
	default:
		ft = faulty.Fault{Method: faulty.MethodHeartbeatBatch, DelayReply: d}
	}
	ft.Nth = nth
	w.tracef(n.name, "batch fault on %s: %+v", inc.key, ft)
	inc.store.Inject(ft)
	n.mu.Lock()
	n.storeFaults = true
	n.mu.Unlock()
}

// checkNow judges the present instant.
func (w *world) checkNow() {
	now := time.Now()
	w.mu.Lock()
	ctxs := w.ctxs[:0]
	var live []leaderCtx
	for _, c := range w.ctxs {
		if c.ctx.Err() == nil {
			ctxs = append(ctxs, c)
			live = append(live, c)
		}
	}
	w.ctxs = ctxs
	w.mu.Unlock()
	// Every event so far was read (the step waited for every goroutine):
	// Leader is each incarnation's view after them.
	// A Feed that stopped was judged once after it stopped: its view
	// no longer changes.
	for _, inc := range w.incs {
		if inc.feed == nil || inc.viewDone {
			continue
		}
		inc.mu.Lock()
		inc.viewDone = !inc.ended.IsZero()
		inc.mu.Unlock()
		if r, ok := inc.feed.Leader(); ok {
			w.checkView(inc, recordView(r, "Leader"))
		}
	}
	if len(live) > 1 {
		var s []string
		for _, c := range live {
			s = append(s, fmt.Sprintf("%s term %d", c.key, c.term))
		}
		w.failf("two leader contexts live at once: %s", strings.Join(s, ", "))
	}
	for _, n := range w.nodes {
		inc := n.cur
		if inc == nil || inc.feed == nil {
			continue
		}
		ctx, term, ok := inc.feed.LeaderContext()
		if !ok || ctx.Err() != nil {
			continue
		}
		found := false
		for _, c := range live {
			found = found || (c.key == inc.key && c.term == term && c.ctx == ctx)
		}
		if !found {
			w.failf("%s: LeaderContext live for term %d without a live EventElected context of it", inc.key, term)
		}
	}
	for _, c := range live {
		var inc *incarnation
		for _, n := range w.nodes {
			if n.cur != nil && n.cur.key == c.key {
				inc = n.cur
			}
		}
		if inc == nil {
			w.failf("%s: leader context of term %d live after a later incarnation started", c.key, c.term)
			continue
		}
		if end := inc.leaseBound(c.term, c.rec); !now.Before(end) {
			w.failf("%s: leader context of term %d live at %v, past its lease by the engine's rule (%v)", c.key, c.term, now.Sub(w.start), end.Sub(w.start))
		}
	}
}

// checkStore checks the committed records: terms never decrease.
func (w *world) checkStore() {
	w.mu.Lock()
	var problems []string
	var prev heartbeat.Record
	for rev := uint64(1); rev <= w.lastRev; rev++ {
		r, ok := w.history[rev]
		if !ok {
			continue
		}
		if r.Term < prev.Term {
			problems = append(problems, fmt.Sprintf("store: term decreased from %v to %v", prev, r))
		}
		prev = r
	}
	w.mu.Unlock()
	for _, p := range problems {
		w.failf("%s", p)
	}
}

// step advances the fake clock by about a millisecond (a random fraction,
// so that checks land on arbitrary instants) and judges the new instant.
func (w *world) step() {
	d := w.randDur(500*time.Microsecond, 1500*time.Microsecond)
	if w.ties {
		// On the next whole millisecond from there: where the replies,
		// notifications and timers of a world of ties land.
		now := time.Now()
		at := now.Add(d)
		if g := at.Truncate(time.Millisecond); g.Before(at) {
			at = g.Add(time.Millisecond)
		}
		d = at.Sub(now)
	}
	time.Sleep(d)
	synctest.Wait()
	w.checkNow()
}

func (w *world) run() {
	defer w.raw.Close()
	for _, n := range w.nodes {
		w.startNode(n)
	}
	// Phase 1: faults and user calls.
	end := time.Now().Add(w.randDur(time.Second, 2500*time.Millisecond))
	healAt := map[*schedNode]time.Time{}
	for time.Now().Before(end) && !w.failed() {
		w.step()
		w.roll()
		for n, at := range healAt {
			if !time.Now().Before(at) {
				delete(healAt, n)
				w.tracef(n.name, "heal")
				n.heal()
			}
		}
		if w.rng.IntN(25) == 0 {
			w.act()
			for _, n := range w.nodes {
				f, _ := n.faults()
				n.mu.Lock()
				sf := n.storeFaults
				n.mu.Unlock()
				if _, ok := healAt[n]; !ok && (f != (nodeFaults{}) || sf) {
					healAt[n] = time.Now().Add(w.randDur(5*time.Millisecond, 400*time.Millisecond))
				}
			}
		}
	}
	// Phase 2: everything heals; wait for the calls in flight (all end
	// once nothing hangs), restart some stopped nodes.
	w.tracef("world", "heal all")
	for _, n := range w.nodes {
		n.heal()
	}
	for i := 0; ; i++ {
		busy := false
		for _, n := range w.nodes {
			s := n.getState()
			busy = busy || s == stStopping || s == stStarting
		}
		if !busy {
			break
		}
		if i == 2000 {
			w.failf("a Stop or Start still running 2 s after every fault healed")
			return
		}
		w.step()
	}
	if !w.failed() {
		w.liveness()
	}
	w.stopAll()
}

// liveness restarts some stopped nodes and checks that a leader is elected
// in time, then keeps leading.
func (w *world) liveness() {
	tm := w.timing
	if w.mixed {
		// The slowest of the two: a follower of either timing waits for
		// the longer lease written in the record.
		a := w.alt
		tm.HeartbeatInterval = max(tm.HeartbeatInterval, a.HeartbeatInterval)
		wait := max(tm.ElectionTimeoutMin, a.ElectionTimeoutMin, heartbeat.FollowerWait(max(tm.LeaseDuration, a.LeaseDuration)))
		tm.ElectionTimeoutMax = wait + max(tm.ElectionTimeoutMax-tm.ElectionTimeoutMin, a.ElectionTimeoutMax-a.ElectionTimeoutMin)
	}
	campaigners := 0
	for _, n := range w.nodes {
		if n.getState() == stStopped && w.rng.IntN(3) > 0 {
			w.startNode(n)
		}
		if n.getState() != stStopped {
			campaigners++
		}
	}
	if campaigners == 0 {
		w.startNode(w.pick())
	}
	healed := time.Now()
	// A leader within ElectionTimeoutMax once the last delayed effect
	// (notification, commit, reply) landed, plus a few heartbeats.
	settled := w.maxDel + w.grain // the last delay landed on its grid
	bound := settled + tm.ElectionTimeoutMax + 5*tm.HeartbeatInterval + 20*time.Millisecond
	var leader *schedNode
	var term uint64
	for !w.failed() {
		w.step()
		if l := w.leaderNow(); l != nil && time.Since(healed) >= settled {
			leader = l
			_, term, _ = l.cur.feed.LeaderContext()
			break
		}
		if time.Since(healed) > bound {
			w.failf("liveness: no leader %v after every fault healed (bound %v)", time.Since(healed), bound)
		}
	}
	if leader != nil {
		w.tracef("world", "leader %s term %d, %v after heal", leader.cur.key, term, time.Since(healed))
		// Nothing fails now: the leader must keep leading, and so must
		// the leaders of the side elections at this instant, whatever the
		// timings of the renewals they share batches with.
		sides := w.sideLeaders()
		// The leader's twins that run now, and run through the window,
		// see its renewals.
		twins := map[*schedNode]*incarnation{}
		for _, n := range w.nodes {
			if n != leader && n.id == leader.id && n.getState() == stRunning {
				twins[n] = n.cur
			}
		}
		stable := time.Now().Add(20 * tm.HeartbeatInterval)
		for time.Now().Before(stable) && !w.failed() {
			w.step()
			if ctx, t2, ok := leader.cur.feed.LeaderContext(); !ok || ctx.Err() != nil || t2 != term {
				w.failf("stability: %s lost leadership of term %d with no fault in force", leader.cur.key, term)
			}
			for name, sl := range sides {
				if ctx, t2, ok := sl.feed.LeaderContext(); !ok || ctx.Err() != nil || t2 != sl.term {
					w.failf("stability: %s lost leadership of %s term %d with no fault in force", sl.key, name, sl.term)
					delete(sides, name)
				}
			}
		}
		for n, inc := range twins {
			if w.failed() || n.cur != inc || n.getState() != stRunning {
				continue
			}
			inc.mu.Lock()
			reported := len(inc.dupReports) > 0
			inc.mu.Unlock()
			if err := inc.feed.Healthy(0); !reported || !errors.Is(err, base.ErrDuplicateID) {
				w.failf("duplicate id: %s ran while %s (its node id) led term %d for %v with nothing failing, but reported ErrDuplicateID %v, and Healthy says %v",
					inc.key, leader.cur.key, term, 20*tm.HeartbeatInterval, reported, err)
			}
		}
	}
}

// sideLeader is the leader of a side election at one instant.
type sideLeader struct {
	key  string
	feed *base.Feed
	term uint64
}

// sideLeaders returns the running leaders of the side elections now.
func (w *world) sideLeaders() map[string]sideLeader {
	out := make(map[string]sideLeader)
	for _, n := range w.nodes {
		if n.getState() != stRunning {
			continue
		}
		for name, sf := range n.cur.sides {
			if ctx, term, ok := sf.LeaderContext(); ok && ctx.Err() == nil {
				out[name] = sideLeader{key: n.cur.key, feed: sf, term: term}
			}
		}
	}
	return out
}

// stopAll stops every node, on a healthy store, and judges the whole run.
func (w *world) stopAll() {
	for _, n := range w.nodes {
		if n.getState() == stStarting {
			for n.getState() == stStarting {
				w.step()
			}
		}
		if n.getState() == stRunning {
			inc := n.cur
			n.setState(stStopping)
			w.userCall(inc.key, "final stop", time.Second, inc.feed.Stop, func(err error) {
				if err != nil {
					w.failf("%s: Stop on a healthy store: %v", inc.key, err)
				}
				inc.setEnded()
				inc.stopSides()
				n.setState(stStopped)
			})
		}
	}
	for i := 0; ; i++ {
		busy := false
		for _, n := range w.nodes {
			busy = busy || n.getState() != stStopped
		}
		if !busy {
			break
		}
		if i == 5000 {
			w.failf("a Stop still running 5 s after every fault healed")
			return
		}
		w.step()
	}
	w.bg.Wait()
	for _, els := range w.elections {
		_ = els.Close()
	}
	w.checkNow()
	w.checkStore()
	if err := w.check.Check(); err != nil {
		w.failf("%v", err)
	}
	for _, inc := range w.incs {
		w.checkSlowReader(inc)
		w.checkDuplicates(inc)
	}
	for _, se := range w.sides {
		if err := se.check.Check(); err != nil {
			w.failf("%s: %v", se.name, err)
		}
		if ls := se.check.Leaders(); len(ls) > 0 {
			w.failf("%s: leadership intervals still open after every node stopped: %v", se.name, ls)
		}
	}
	if ls := w.check.Leaders(); len(ls) > 0 {
		w.failf("leadership intervals still open after every node stopped: %v", ls)
	}
}

// ---- regressions of what the schedules found ----

// spinGuard wraps a backend: writes fail (after committing, with lose) and
// the first failReads reads fail. A write beyond maxWrites hangs until its
// context ends, so that a retry loop that never lets the fake clock advance
// ends and is counted instead of hanging the test.
type spinGuard struct {
	backend.Election
	mu        sync.Mutex
	fail      bool // writes fail
	lose      bool // ... after committing: the reply is lost
	failReads int
	writes    int
}

const maxWrites = 100

func (g *spinGuard) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	g.mu.Lock()
	g.writes++
	n, fail, lose := g.writes, g.fail, g.lose
	g.mu.Unlock()
	if n > maxWrites {
		<-ctx.Done()
		return heartbeat.Record{}, ctx.Err()
	}
	if !fail {
		return g.Election.Heartbeat(ctx, expected, next)
	}
	if lose {
		_, _ = g.Election.Heartbeat(ctx, expected, next)
	}
	return heartbeat.Record{}, errors.New("spin guard: write failed")
}

func (g *spinGuard) Get(ctx context.Context) (heartbeat.Record, error) {
	g.mu.Lock()
	g.failReads--
	fail := g.failReads >= 0
	g.mu.Unlock()
	if fail {
		return heartbeat.Record{}, errors.New("spin guard: read failed")
	}
	return g.Election.Get(ctx)
}

func (g *spinGuard) set(fn func(*spinGuard)) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	fn(g)
	return g.writes
}

var spinTiming = heartbeat.Timing{HeartbeatInterval: 10 * time.Millisecond, ElectionTimeoutMin: 50 * time.Millisecond,
	ElectionTimeoutMax: 60 * time.Millisecond, LeaseDuration: 30 * time.Millisecond}

// Schedule seed 1: a Proclaim waiting while renewals fail made the engine
// renew again as soon as each failed, skipping the retry pause: with a
// store that fails at once, a loop without end at one instant (a storm of
// writes until the lease ran out, on a real clock).
func TestScheduleRegressProclaimDuringFailingRenewals(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(fmt.Sprintf("lose=%v", lose), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, _ := memory.NewDB().Election("e")
				g := &spinGuard{Election: b}
				f, _ := base.New(g, "n", base.Options{Timing: spinTiming})
				if err := f.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				for !f.IsLeader() {
					time.Sleep(time.Millisecond)
				}
				before := g.set(func(g *spinGuard) { g.fail, g.lose = true, lose })
				err := f.Proclaim(context.Background(), []byte("v"))
				if !errors.Is(err, base.ErrNotLeader) {
					t.Errorf("Proclaim while every renewal fails: %v, want ErrNotLeader once the lease ran out", err)
				}
				// A renewal every HeartbeatInterval/5 at most, over a lease.
				if n := g.set(func(*spinGuard) {}) - before; n > 2*int(spinTiming.LeaseDuration/(spinTiming.HeartbeatInterval/5)) {
					t.Errorf("%d renewals during one lease with a Proclaim waiting: a retry loop without pause", n)
				}
				_ = f.Stop(context.Background())
			})
		})
	}
}

// Schedule seed 50: a claim whose reply was lost is the node's own record
// when the feed shows it, and it claimed again at once; with every reply
// lost, a storm of claims at one instant. Now at most one claim per
// heartbeat interval.
func TestScheduleRegressLostClaimRepliesDoNotStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		g := &spinGuard{Election: b, fail: true, lose: true}
		f, _ := base.New(g, "n", base.Options{Timing: spinTiming})
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * spinTiming.HeartbeatInterval)
		if n := g.set(func(*spinGuard) {}); n > 11 {
			t.Errorf("%d claims in 10 heartbeat intervals while every reply is lost, want at most one per interval", n)
		}
		g.set(func(g *spinGuard) { g.fail = false })
		time.Sleep(3 * spinTiming.HeartbeatInterval)
		if !f.IsLeader() {
			t.Error("not leader once replies came back")
		}
		_ = f.Stop(context.Background())
	})
}

// Schedule seed 1937: a node whose first read failed while its feed was up
// never read again, so in an election nobody writes (here: none yet) it
// never campaigned.
func TestScheduleRegressFailedFirstReadIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := memory.NewDB().Election("e")
		g := &spinGuard{Election: b, failReads: 2}
		f, _ := base.New(g, "n", base.Options{Timing: spinTiming})
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer f.Stop(context.Background())
		time.Sleep(spinTiming.ElectionTimeoutMax + 3*spinTiming.HeartbeatInterval)
		if !f.IsLeader() {
			t.Fatal("no leader: the failed first read was not retried")
		}
	})
}
