package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// docs/BENCHMARKS.md holds the tables of the latest run between two
// markers; -docs names the file, and the run rewrites what lies between
// them (bench/run.sh passes it when it writes docs/bench). Everything
// else in the file is written by hand.
const (
	docsBegin = "<!-- bench run: begin (bench/run.sh writes what follows, up to the end marker) -->"
	docsEnd   = "<!-- bench run: end -->"
)

// runResults is everything a run measured, for the docs' tables.
type runResults struct {
	rep     *report
	fence   string // the fence's table, as results.md has it
	rollout *rolloutReport
	many    *manyReport
	mem     *memoryReport
}

// writeDocs replaces the part of path between the markers with the
// run's tables.
func writeDocs(path string, rr runResults) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(old, []byte(docsBegin)), bytes.Index(old, []byte(docsEnd))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q ... %q to write the run's tables between", path, docsBegin, docsEnd)
	}
	var b bytes.Buffer
	b.Write(old[:i+len(docsBegin)])
	b.WriteString("\n\n")
	b.WriteString(rr.summary())
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// summary is the docs' part of a run: its conditions, then one table per
// scenario, the peers side by side.
func (rr runResults) summary() string {
	r := rr.rep
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	commit := leaderfeedCommit()
	if commit == "" {
		commit = "(unknown)"
	}
	p("## The latest run\n\n")
	p("`bash bench/run.sh%s` at commit %s, %s, in %v; %s, %d CPUs, %s; load average %s at the start, %s at the end",
		argString(r.args), commit, r.started.UTC().Format("2006-01-02"), r.finished.Sub(r.started).Round(time.Second),
		cpuModel(), runtime.NumCPU(), runtime.Version(), r.load0, r.load1)
	if r.pgVersion != "" {
		p("; PostgreSQL %s on loopback (fsync and synchronous_commit off)", strings.Fields(r.pgVersion)[0])
	}
	p("; etcd %s embedded (fsync off). Every number, how it is measured and the load during each part: [docs/bench/results.md](bench/results.md).\n\n", etcdVersion())

	if r.cfg.old {
		p("%s", rr.etcdTable())
	}
	if r.cmp != nil {
		p("%s", rr.compareTable())
		p("%s", rr.floorTable())
	}
	if rr.fence != "" {
		p("### Fenced transactions\n\n`postgres.Fence` in a leader's job: 100 transactions a second, each open 5 ms after the fence, with a second node following; default timing.\n%s\n", fenceTable(rr.fence))
	}
	if rr.rollout != nil {
		m := rr.rollout
		p("### Rolling restarts\n\n%d node processes; each step starts a new node, waits until it participates and SIGTERMs the oldest old node; dead-leader bound %v (leaderfeed's default timing); %d rollouts per elector.\n\n%s\n", m.nodes, m.bound, m.rollouts, m.table())
	}
	if rr.many != nil {
		p("%s", rr.manyTables())
	}
	if rr.mem != nil {
		p("### Many elections in one process, memory backend\n\nOne `base.Elections`, renewals batched, heartbeat 1 s, %d intervals.\n\n%s\n", rr.mem.intervals, rr.mem.table())
	}
	return b.String()
}

// fenceTable keeps the table of the fence's Markdown.
func fenceTable(md string) string {
	var out []string
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "|") {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return strings.TrimSpace(md) + "\n"
	}
	return "\n" + strings.Join(out, "\n") + "\n"
}

func p50p99(s []time.Duration) string {
	if len(s) == 0 {
		return "–"
	}
	sum := summarize(s)
	return ms(sum.p50) + " / " + ms(sum.p99)
}

// etcdTable: leaderfeed on each backend and etcd, p50 / p99.
func (rr runResults) etcdTable() string {
	r := rr.rep
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	var systems []string
	for _, s := range r.series {
		if s.system != "etcd" && !contains(systems, s.system) {
			systems = append(systems, s.system)
		}
	}
	mainSys := "leaderfeed/memory"
	if contains(systems, "leaderfeed/postgres") {
		mainSys = "leaderfeed/postgres"
	}
	t := r.cfg.timing
	p("### leaderfeed and etcd\n\nDead-leader bound %d s: etcd session TTL %d s; leaderfeed heartbeat %v, election timeout %v–%v. Milliseconds, p50 / p99.\n\n", r.cfg.ttl, r.cfg.ttl, t.HeartbeatInterval, t.ElectionTimeoutMin, t.ElectionTimeoutMax)
	p("| scenario |")
	for _, s := range systems {
		p(" %s |", s)
	}
	p(" etcd | %s ÷ etcd, p50 |\n|---|", mainSys)
	for range systems {
		p("---:|")
	}
	p("---:|---:|\n")
	for _, key := range r.scenarios() {
		peer, hasPeer := r.peer(key)
		row := ""
		found := false
		for _, sys := range systems {
			s, ok := r.find(key, sys)
			found = found || ok
			row += " " + p50p99(s.samples) + " |"
		}
		if !found {
			continue
		}
		e, _ := r.find(key, "etcd")
		ratioCell := ""
		if m, ok := r.find(key, mainSys); ok && hasPeer {
			ratioCell = ratio(summarize(m.samples).p50, summarize(peer.samples).p50)
		}
		p("| %s |%s %s | %s |\n", r.scenarioTitle(key), row, p50p99(e.samples), ratioCell)
	}
	p("\nStore writes per heartbeat interval:")
	for _, w := range r.writes {
		switch {
		case w.err != nil:
			p(" %s failed;", w.system)
		case w.system == "etcd":
			p(" etcd %.2f puts and %.2f lease keepalives per session;", w.leader, w.renewals)
		default:
			p(" %s leader %.2f, each follower %.2f;", w.system, w.leader, w.follower)
		}
	}
	p("\n\n")
	return strings.Replace(b.String(), ";\n\n", ".\n\n", 1)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// compareTable: leaderfeed, the advisory lock and the polling lease.
func (rr runResults) compareTable() string {
	c := rr.rep.cmp
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("### Against an advisory lock and a polling lease\n\n")
	p("Node processes on PostgreSQL, dead-leader bound %v (the advisory lock retries and the lease expires at it). Milliseconds, p50 / p99; overlaps: two nodes believing they lead at once, found by the checker.\n\n", rr.rep.cfg.bound())
	var kinds []*cmpResult
	for _, res := range c.results {
		if !res.cutOnly {
			kinds = append(kinds, res)
		}
	}
	p("| scenario |")
	for _, k := range kinds {
		p(" %s |", k.label)
	}
	p("\n|---|")
	for range kinds {
		p("---:|")
	}
	p("\n")
	cell := func(res *cmpResult, scenario string, s []time.Duration) string {
		out := p50p99(s)
		if ov := res.checks[scenario]; ov.count > 0 {
			out += fmt.Sprintf(", **%d overlaps**", ov.count)
		}
		return out
	}
	rows := []struct {
		title, scenario string
		get             func(*cmpResult) []time.Duration
	}{
		{"clean handover: resign → another node leads", "handover", func(x *cmpResult) []time.Duration { return x.handover.samples }},
		{"crash: kill -9 → another node leads", "crash", func(x *cmpResult) []time.Duration { return x.crash.samples }},
		{"silent cut → another node leads", "cut", func(x *cmpResult) []time.Duration { return summarizeCut(x.cut).toLeader }},
	}
	for _, row := range rows {
		p("| %s |", row.title)
		for _, k := range kinds {
			p(" %s |", cell(k, row.scenario, row.get(k)))
		}
		p("\n")
	}
	p("| silent cut: the cut leader still believed it led after |")
	for _, k := range kinds {
		p(" %s |", p50p99(summarizeCut(k.cut).believed))
	}
	p("\n")
	for _, n := range rr.rep.cfg.costElections {
		p("| steady cost, %d election(s), 3 nodes: statements/s (WAL bytes/s) |", n)
		for _, k := range kinds {
			v := "–"
			for _, cr := range c.cost {
				if cr.kind == k.kind && cr.elections == n && cr.err == nil {
					v = fmt.Sprintf("%.1f (%.0f)", cr.serverStmts, cr.walBytes)
				}
			}
			p(" %s |", v)
		}
		p("\n")
	}
	for _, res := range c.results {
		if res.cutOnly {
			p("\n%s: silent cut → another node leads %s ms.\n", res.label, p50p99(summarizeCut(res.cut).toLeader))
		}
	}
	p("\n")
	return b.String()
}

// floorTable: the handovers against the floors.
func (rr runResults) floorTable() string {
	c := rr.rep.cmp
	if c.floorErr != nil {
		return "### Handover floors\n\nFailed: " + c.floorErr.Error() + ".\n\n"
	}
	f := c.floor
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("### Handover floors\n\nIn bare pgx: the one-write floor (the UPDATE naming the successor, with its NOTIFY, until the successor's listening connection has it) and the two-write floor (vacancy, notification, claim), alone and with each scenario's other listening connections; with a scenario's listeners the one-write floor also pauses between samples as that scenario pauses between handovers (a machine idle for 150 ms or more is slower than one that wrote 10–20 ms before).\n\n")
	p("| handover | p50 / p99 ms | ÷ one-write floor, same listeners | ÷ two-write floor |\n|---|---:|---:|---:|\n")
	two := summarize(f.total.samples).p50
	line := func(name string, s, one []time.Duration) {
		if len(s) == 0 {
			return
		}
		r1 := "–"
		if len(one) > 0 {
			r1 = ratio(summarize(s).p50, summarize(one).p50)
		}
		p("| %s | %s | %s | %s |\n", name, p50p99(s), r1, ratio(summarize(s).p50, two))
	}
	for _, o := range f.one {
		line(fmt.Sprintf("one-write floor, %d other listeners, pause %s", o.others, o.pause), o.samples, o.samples)
	}
	line(fmt.Sprintf("one-write floor across processes, %d other listeners, pause %s", nodeCrowd, f.across.pause), f.across.samples, f.across.samples)
	line("two-write floor", f.total.samples, nil)
	line(fmt.Sprintf("two-write floor, %d other listeners", floorCrowd), f.crowded.samples, nil)
	lfIn, _ := rr.rep.find("handover", "leaderfeed/postgres")
	line(fmt.Sprintf("leaderfeed, one process (%d other listeners)", floorCrowd), lfIn.samples, f.oneWrite(floorCrowd))
	if lf := c.result(kindLeaderfeed); lf != nil {
		line(fmt.Sprintf("leaderfeed, node processes (%d other listeners; ÷ the floor across processes)", nodeCrowd), lf.handover.samples, f.nodeFloor())
	}
	et, _ := rr.rep.find("handover", "etcd")
	line("etcd", et.samples, nil)
	p("\n")
	return b.String()
}

// manyTables: many elections across processes, their crash, and beside
// busy loops.
func (rr runResults) manyTables() string {
	m := rr.many
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("### Many elections\n\n%d elections across 3 node processes on PostgreSQL; leaderfeed on `heartbeat.TimingFor`: heartbeat %v, lease %v, election timeout %v–%v; etcd session TTL %v.\n\n",
		m.elections, m.timing.HeartbeatInterval, m.timing.LeaseDuration, m.timing.ElectionTimeoutMin, m.timing.ElectionTimeoutMax, m.timing.ElectionTimeoutMax)
	p("| system, phase | statements per interval, per process | server CPU ms per interval | leader changes |\n|---|---|---:|---:|\n")
	for _, ph := range m.phases {
		switch {
		case ph.err != nil:
			p("| %s | failed: %v | | |\n", ph.label, ph.err)
		case ph.etcdOps != nil:
			var total float64
			for _, v := range ph.etcdOps {
				total += v
			}
			p("| %s | %.2f server operations (all sessions) | – | %d |\n", ph.label, total, ph.changes)
		default:
			cpu := "–"
			if ph.cpuMs >= 0 {
				cpu = fmt.Sprintf("%.1f", ph.cpuMs)
			}
			mark := ""
			if ph.unsteady != "" {
				mark = " (not steady)"
			}
			p("| %s%s | %s | %s | %d |\n", ph.label, mark, fmtShort(ph.perProc), cpu, ph.changes)
		}
	}
	p("\nKill -9 of the process leading every election, per election until another process leads it (ms):\n\n| system | p50 | p99 | last | with a new leader |\n|---|---:|---:|---:|---:|\n")
	for _, cr := range m.crashes {
		if cr.err != nil {
			p("| %s | failed: %v | | | |\n", cr.label, cr.err)
			continue
		}
		s := summarize(cr.samples)
		p("| %s | %s | %s | %s | %d of %d |\n", cr.label, ms(s.p50), ms(s.p99), ms(cr.last), s.n, s.n+cr.missing)
	}
	p("\n")
	if len(m.single) > 0 {
		p("One election's handover and crash, node processes (p50 / p99 ms):")
		for _, r := range m.single {
			p(" %s %s and %s;", r.label, p50p99(r.handover.samples), p50p99(r.crash.samples))
		}
		p("\n\n")
	}
	if len(m.loads) > 0 {
		l := m.loads[0]
		p("Beside %d busy loops for %v (3 processes, pools of %d connections):\n\n%s\n", l.spin, l.window, l.conns, loadTable(m.loads, m.timing.ElectionTimeoutMax, m.elections))
	}
	return strings.Replace(b.String(), ";\n\n", ".\n\n", 1)
}
