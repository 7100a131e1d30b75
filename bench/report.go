package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/version"
)

// writesRow is the outcome of the writes scenario for one system, per
// heartbeat interval of leaderfeed.
type writesRow struct {
	system    string
	leader    float64 // store writes by the leader (etcd: mvcc puts of all sessions)
	follower  float64 // store writes by the busiest follower
	observer  float64 // store writes by the observe-only node
	reads     float64 // reads of the record by all nodes (etcd: ranges served)
	renewals  float64 // etcd: lease keepalives per session
	proposals float64 // etcd: raft proposals committed
	intervals float64
	lost      losses // counts done again (the leadership changed during one)
	unsettled bool   // the leadership changed during every count; the last is reported
	note      string
	err       error
}

type report struct {
	cfg       config
	args      []string
	started   time.Time
	finished  time.Time
	load0     string
	load1     string
	pgVersion string
	skipped   []string
	caveats   []string
	series    []series
	cmp       *compareReport
	writes    []writesRow
}

func (r *report) addWrites(row writesRow, err error) {
	row.err = err
	if err != nil {
		logf("  writes %s: FAILED: %v", row.system, err)
	} else {
		logf("  writes %s: leader %.2f, followers %.2f, observer %.2f, reads %.2f, keepalives/session %.2f per interval", row.system, row.leader, row.follower, row.observer, row.reads, row.renewals)
	}
	r.writes = append(r.writes, row)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func etcdVersion() string { return version.Version }

// leaderfeedCommit describes the commit of the library that was measured
// (the replace directive points at ..), or "" when git cannot tell. It is
// read once, when the run starts (run): by the end the run's own outputs
// in docs/ are uncommitted changes.
var leaderfeedCommit = sync.OnceValue(func() string {
	out, err := exec.Command("git", "-C", "..", "log", "-1", "--format=%h (%s)").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += " with uncommitted changes"
	}
	return c
})

var scenarioTitles = map[string]string{
	"handover":      "clean handover: Resign → next leader elected",
	"observer":      "observer learns the new leader (from Resign)",
	"crash":         "crash failover, same dead-leader bound",
	"crash-strict":  "crash failover, leaderfeed timeout fixed at the bound",
	"crash-derived": "crash failover, leaderfeed on heartbeat.TimingFor(bound)",
}

var scenarioOrder = []string{"handover", "handover-jitter", "observer", "crash", "crash-derived", "crash-strict"}

func (r *report) scenarioTitle(key string) string {
	if key == "handover-jitter" {
		return fmt.Sprintf("diagnostic: clean handover with VacancyJitter %v", r.cfg.diagJitter)
	}
	return scenarioTitle(key)
}

func scenarioTitle(key string) string {
	if t, ok := scenarioTitles[key]; ok {
		return t
	}
	if n, ok := strings.CutPrefix(key, "fanout-"); ok {
		return "fan-out to " + n + " followers: Resign → each follower"
	}
	return key
}

// peer returns etcd's series for a scenario (crash-strict compares with
// etcd's crash).
func (r *report) peer(scenario string) (series, bool) {
	switch scenario {
	case "crash-strict", "crash-derived":
		scenario = "crash"
	case "handover-jitter":
		scenario = "handover"
	}
	return r.find(scenario, "etcd")
}

func (r *report) find(scenario, system string) (series, bool) {
	for _, s := range r.series {
		if s.scenario == scenario && s.system == system && len(s.samples) > 0 {
			return s, true
		}
	}
	return series{}, false
}

func (r *report) scenarios() []string {
	keys := append([]string(nil), scenarioOrder...)
	for _, n := range r.cfg.fanout {
		keys = append(keys, fmt.Sprintf("fanout-%d", n))
	}
	return keys
}

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	t := r.cfg.timing
	p("# leaderfeed vs etcd, an advisory lock and a polling lease: benchmark results\n\n")
	p("Made by `bash bench/run.sh%s` (which runs `go run . -out %s%s` in bench/), %s, in %v.\n\n",
		argString(r.args), outArg(r.cfg.out), argString(r.args), r.started.UTC().Format("2006-01-02 15:04 MST"), r.finished.Sub(r.started).Round(time.Second))
	p("- Machine: %s, %d CPUs (GOMAXPROCS %d), %s/%s, %s. Load average (1, 5, 15 min) %s at the start, %s at the end. The machine is shared with other builds and tests: compare the ratios within a run rather than absolute times across runs.\n",
		cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(), r.load0, r.load1)
	if c := leaderfeedCommit(); c != "" {
		p("- leaderfeed at commit %s.\n", c)
	}
	if r.pgVersion != "" {
		p("- PostgreSQL %s on loopback (as started by .ci/postgres.sh: fsync and synchronous_commit off). Every candidate and the observer has a pool of its own (a LISTEN connection each, as separate processes would); the fan-out followers share one pool and its one LISTEN connection.\n", r.pgVersion)
	}
	for _, s := range r.skipped {
		p("- Skipped: %s.\n", s)
	}
	for _, s := range r.caveats {
		p("- Caveat: %s.\n", s)
	}
	p("- etcd %s embedded, single member on loopback, fsync off, raft tick 10 ms and election timeout 100 ms (so that it grants 1 s leases). Each candidate has a client (connection) of its own; observers share one client.\n", etcdVersion())
	p("- Dead-leader bound %d s for both: etcd session TTL %d s (keepalive every max(TTL/3, 500 ms)); leaderfeed heartbeat %v, election timeout %v–%v, lease %v.\n",
		r.cfg.ttl, r.cfg.ttl, t.HeartbeatInterval, t.ElectionTimeoutMin, t.ElectionTimeoutMax, t.LeaseDuration)
	p("- Percentiles are nearest-rank; ratios are leaderfeed ÷ etcd (below 1× means leaderfeed is faster).\n\n")

	if !r.cfg.old {
		p("- The scenarios against etcd were not run (-etcd=false).\n\n")
		if r.cmp != nil {
			p("%s", r.compareMarkdown())
		}
		return b.String()
	}
	p("## Latency (milliseconds)\n\n")
	p("| scenario | system | samples | p50 | p99 | max | p50 ÷ etcd | p99 ÷ etcd |\n")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var notes []string
	for _, key := range r.scenarios() {
		peer, hasPeer := r.peer(key)
		ps := summarize(peer.samples)
		for _, s := range r.series {
			if s.scenario != key {
				continue
			}
			if len(s.samples) == 0 {
				p("| %s | %s | 0 | – | – | – | – | – |\n", r.scenarioTitle(key), s.system)
			} else {
				sum := summarize(s.samples)
				r50, r99 := "", ""
				if hasPeer && s.system != "etcd" {
					r50, r99 = ratio(sum.p50, ps.p50), ratio(sum.p99, ps.p99)
				}
				p("| %s | %s | %d | %s | %s | %s | %s | %s |\n", r.scenarioTitle(key), s.system, sum.n, ms(sum.p50), ms(sum.p99), ms(sum.max), r50, r99)
			}
			if len(s.resign) > 0 {
				rs := summarize(s.resign)
				notes = append(notes, fmt.Sprintf("%s, %s: Resign() itself returned after p50 %s ms, p99 %s ms", key, s.system, ms(rs.p50), ms(rs.p99)))
			}
			if s.failed > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: %d rounds or deliveries gave no sample (timed out)", key, s.system, s.failed))
			}
			if n := s.lost.total(); n > 0 {
				notes = append(notes, fmt.Sprintf("%s, %s: lost rounds: %d, retried (%s)", key, s.system, n, s.lost))
			}
			if s.note != "" {
				notes = append(notes, fmt.Sprintf("%s, %s: %s", key, s.system, s.note))
			}
		}
	}
	p("\n")
	for _, n := range notes {
		p("- %s\n", n)
	}
	if len(notes) > 0 {
		p("\n")
	}

	p("## Store writes per heartbeat interval (%v), steady state over %d intervals\n\n", t.HeartbeatInterval, r.cfg.intervals)
	p("| system | leader | each follower | observer | reads of the record (all nodes) | lease keepalives per session |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, w := range r.writes {
		switch {
		case w.err != nil:
			p("| %s | failed: %v | | | | |\n", w.system, w.err)
		case w.system == "etcd":
			p("| etcd | %.2f (all sessions) | %.2f | – (no observer) | %.2f | %.2f |\n", w.leader, w.follower, w.reads, w.renewals)
		default:
			p("| %s | %.2f | %.2f | %.2f | %.2f | n/a (the heartbeat is the write) |\n", w.system, w.leader, w.follower, w.observer, w.reads)
		}
	}
	p("\n")
	for _, w := range r.writes {
		if w.err == nil && w.note != "" {
			p("- %s: %s.\n", w.system, w.note)
		}
		if n := w.lost.total(); n > 0 {
			p("- %s: lost counts: %d, counted again (%s).\n", w.system, n, w.lost)
		}
	}
	p("\n")

	p("## Targets (issue 8)\n\n")
	for _, line := range r.targets() {
		p("- %s\n", line)
	}
	p("\n## How each number is measured\n\n")
	p("%s", method)
	p("\n![latency distributions](latency.png)\n\n")
	if r.cmp != nil {
		p("%s", r.compareMarkdown())
	}
	return b.String()
}

// outArg is the -out folder as the report names it: relative to bench/
// (the working directory) when it lies there or below its parent.
func outArg(out string) string {
	if wd, err := os.Getwd(); err == nil && filepath.IsAbs(out) {
		if rel, err := filepath.Rel(wd, out); err == nil {
			return rel
		}
	}
	return out
}

func argString(args []string) string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-out" || a == "--out" || a == "-docs" || a == "--docs" {
			i++
			continue
		}
		if strings.HasPrefix(a, "-out=") || strings.HasPrefix(a, "--out=") || strings.HasPrefix(a, "-docs=") || strings.HasPrefix(a, "--docs=") {
			continue
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return ""
	}
	return " " + strings.Join(out, " ")
}

func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**not met**"
}

// targets checks the targets on PostgreSQL (on memory when
// PostgreSQL was not measured).
func (r *report) targets() []string {
	sys := "leaderfeed/postgres"
	if _, ok := r.find("handover", sys); !ok {
		sys = "leaderfeed/memory"
	}
	var out []string
	if h, ok := r.find("handover", sys); ok {
		hs := summarize(h.samples)
		out = append(out, fmt.Sprintf("Clean handover on %s p50 ≤ 5 ms: %s (p50 %s ms).", sys, verdict(hs.p50 <= 5*time.Millisecond), ms(hs.p50)))
		if e, ok := r.find("handover", "etcd"); ok {
			es := summarize(e.samples)
			line := fmt.Sprintf("Clean handover not slower than etcd's Resign handover by more than 1.5×: %s (p50 %s vs %s ms, %s; p99 %s)",
				verdict(float64(hs.p50) <= 1.5*float64(es.p50)), ms(hs.p50), ms(es.p50), ratio(hs.p50, es.p50), ratio(hs.p99, es.p99))
			if d, ok := r.find("handover-jitter", sys); ok {
				ds := summarize(d.samples)
				line += fmt.Sprintf("; diagnostic with VacancyJitter %v: p50 %s ms, %s", r.cfg.diagJitter, ms(ds.p50), ratio(ds.p50, es.p50))
			}
			out = append(out, line+".")
		}
	}
	if c, ok := r.find("crash", sys); ok {
		if e, ok := r.find("crash", "etcd"); ok {
			cs, es := summarize(c.samples), summarize(e.samples)
			line := fmt.Sprintf("Crash failover ≤ etcd's at the same bound: %s (p50 %s vs %s ms, p99 %s vs %s ms)",
				verdict(cs.p50 <= es.p50 && cs.p99 <= es.p99), ms(cs.p50), ms(es.p50), ms(cs.p99), ms(es.p99))
			if d, ok := r.find("crash-derived", sys); ok {
				ds := summarize(d.samples)
				line += fmt.Sprintf("; with heartbeat.TimingFor(bound), p50 at most 0.4× etcd's: %s (p50 %s ms, %s; p99 %s ms)",
					verdict(float64(ds.p50) <= 0.4*float64(es.p50)), ms(ds.p50), ratio(ds.p50, es.p50), ms(ds.p99))
			}
			if s, ok := r.find("crash-strict", sys); ok {
				ss := summarize(s.samples)
				line += fmt.Sprintf("; with leaderfeed's timeout fixed at the bound: %s (p50 %s ms, p99 %s ms)", verdict(ss.p50 <= es.p50 && ss.p99 <= es.p99), ms(ss.p50), ms(ss.p99))
			}
			out = append(out, line+".")
		}
	}
	for _, w := range r.writes {
		if w.system == sys && w.err == nil && w.unsettled {
			out = append(out, fmt.Sprintf("One write per interval by the leader, none by followers: **not measured** (the leadership changed during each of %d counts: %s).", w.lost.total(), w.lost))
		} else if w.system == sys && w.err == nil {
			ok := w.leader > 0.9 && w.leader < 1.1 && w.follower == 0 && w.observer == 0
			out = append(out, fmt.Sprintf("One write per interval by the leader, none by followers: %s (leader %.2f, followers %.2f, observer %.2f writes per interval).", verdict(ok), w.leader, w.follower, w.observer))
		}
	}
	if f, ok := r.find("fanout-1000", sys); ok {
		fs := summarize(f.samples)
		out = append(out, fmt.Sprintf("1,000 followers notified with p99 ≤ 60 ms: %s (p99 %s ms, max %s ms over %d deliveries).", verdict(fs.p99 <= 60*time.Millisecond), ms(fs.p99), ms(fs.max), fs.n))
	}
	return out
}

const method = `- **Handover rounds** (handover, observer, fan-out) start after a pause
  (-settle, 150 ms), longer than etcd's 100 ms sync period for watchers that
  start at a past revision: with shorter pauses the candidate that just
  queued up again can still be in that state, and etcd's handovers turn
  bimodal (half near 2 ms, half near 50 ms). Handovers are rare in
  production, so the steady state is the fair one.
- **Clean handover**: 3 candidates. Just before the leader calls Resign
  until the next leader's application reads its EventElected (leaderfeed) or
  the next candidate's Campaign returns (etcd). The etcd candidate that
  resigned campaigns again after the sample, so it queues up behind. The
  leaderfeed candidates participate (the default PresenceInterval, a
  quarter of the lease; -no-presence: not), so that Resign hands over in
  one write; the
  fan-out's and the other scenarios' do not.
- **Diagnostic handover**: the same on the main backend with
  VacancyJitter = -diag-jitter (2 ms, the default before it became 0): what
  a jitter costs. Followers then wait a random 0–2 ms before they claim a
  vacancy, which spares the store refused claims when there are many
  campaigners.
- **Observer**: in the same rounds, one observe-only node (leaderfeed) or one
  Observe loop on a client of its own (etcd); from just before Resign until
  the observer's application reads the EventNewLeader / the Observe response
  naming the new leader.
- **Crash failover**: 3 candidates; after a random pause of 0–500 ms (so the
  crash falls at every phase of the renewal cycle) the leader dies: leaderfeed:
  its backend is cut off with faulty.Backend.Partition (every call fails, the
  feed breaks: it can neither renew nor resign); etcd: its client is closed
  without closing the session, so keepalives stop and the lease is not
  revoked. Measured from the crash to the next leader's EventElected / Campaign
  return; then the dead node is replaced. The bound is the same: the dead
  leader blocks the election for at most the TTL after its last renewal in
  etcd (plus up to 500 ms until the lessor's next expiry scan) and for at most
  ElectionTimeoutMax after its last heartbeat in leaderfeed, with
  ElectionTimeoutMax = TTL. leaderfeed's followers time out at a random point
  in [TTL/2, TTL] after the last heartbeat they saw; the "timeout fixed at the
  bound" row sets ElectionTimeoutMin = ElectionTimeoutMax = TTL, the slowest
  leaderfeed can be configured at this bound. The crash runs of all systems
  go side by side (each on its own election), since each sample is mostly
  waiting on timers.
- **Fan-out**: 2 candidates and N followers (observe-only feeds sharing one
  backend client / Observe loops sharing one etcd client). Each round the
  leader resigns and the other candidate takes over. Per follower, from just
  before Resign is called until the follower's application reads the event
  naming the new leader, so the handover itself (a few ms) is included.
  Samples = rounds × N. (The commit of the new leader's write is not a usable
  start: on PostgreSQL the NOTIFY often reaches the followers before the
  writer has read its own UPDATE's reply.)
- **Writes**: leaderfeed: 3 candidates and an observer wrapped in
  faulty.Wrap, whose Calls counts Heartbeat (every write leaderfeed makes is
  one compare-and-set Heartbeat) and Get per node. etcd: 3 candidates; the
  embedded server's own counters (etcd_mvcc_put_total,
  etcd_debugging_lease_renewed_total, etcd_mvcc_range_total).
- All times are taken with Go's monotonic clock in the one process that runs
  every node, when the application reads the event (not when the library
  stamped it), for both systems alike.
`
