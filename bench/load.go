package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Many elections beside busy loops (issue 43): -many-elections elections
// across three node processes, as in the many-elections scenario (the
// first process started alone leads them all, then the other two start),
// each process connected to the server directly; once every election has
// a leader, -many-load-spin processes ("bench spin") spin on the CPUs for
// -many-load. From the nodes' own reports: per election, every interval
// in which no process believed it led; the elections that were without a
// leader for longer than their bound (-many-ttl) at least once.

// manyLoad is one mode's run beside the busy loops.
type manyLoad struct {
	label      string
	mode       string
	window     time.Duration
	spin       int
	conns      int
	unsteady   string         // not every election led before the window
	overBound  int            // elections without a leader longer than the bound, at least once
	neverLed   int            // elections no process led at any time in the window
	longest    time.Duration  // the longest leaderless interval of any election
	leaderless time.Duration  // summed over the elections
	changes    int            // leadership moved to another process
	reasons    map[string]int // why leaderships ended in the window
	endedWhen  [10]int        // leaderships ended in each tenth of the window
	perProc    map[string]float64
	cpuMs      float64 // server CPU per heartbeat interval; -1: unknown
	load0      string
	load1      string
	err        error
}

// spinMain is "bench spin": one busy loop on one CPU until stdin ends.
func spinMain() {
	runtime.GOMAXPROCS(1)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for n := 0; ; n++ {
		_ = n
	}
}

// startSpinners starts n busy loops as processes of their own, so they
// compete for the CPUs with the nodes and the server as any other work
// would; stop ends them (and the end of this process ends their stdin).
func startSpinners(n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	var pipes []io.Closer
	stop = func() {
		for _, p := range pipes {
			_ = p.Close()
		}
		for _, c := range cmds {
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = c.Process.Kill()
				<-done
			}
		}
	}
	for range n {
		c := exec.Command(selfExe, "spin")
		w, err := c.StdinPipe()
		if err != nil {
			stop()
			return nil, err
		}
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds, pipes = append(cmds, c), append(pipes, w)
	}
	return stop, nil
}

// runManyLoad runs the elections of each -many-load-modes mode beside the
// busy loops.
func runManyLoad(ctx context.Context, cfg config, pool *pgxpool.Pool) []manyLoad {
	mcfg, err := manyConfig(cfg)
	if err != nil {
		return []manyLoad{{label: "many elections beside busy loops", err: err}}
	}
	mcfg.postmaster = postmasterPID(ctx, pool)
	var out []manyLoad
	for _, mode := range cfg.manyLoadModes {
		ml := manyLoadRun(ctx, mcfg, mode)
		logLoad(ml)
		out = append(out, ml)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

func manyLoadRun(ctx context.Context, mcfg config, mode string) (ml manyLoad) {
	n := mcfg.manyElections
	ml = manyLoad{mode: mode, window: mcfg.manyLoad, spin: mcfg.manyLoadSpin, conns: mcfg.manyLoadConns, cpuMs: -1}
	extra := []string{"-conns", fmt.Sprint(mcfg.manyLoadConns)}
	switch mode {
	case "nobatch":
		ml.label = "one statement per election"
		extra = append(extra, "-nobatch")
	default:
		ml.label = "batched"
	}
	logf("many elections beside %d busy loops: %s, %d elections, 3 processes, %v (load %s)", mcfg.manyLoadSpin, ml.label, n, mcfg.manyLoad, loadNow())
	c, err := newManyClusterVia(mcfg, kindLeaderfeed, "load", mcfg.pgURL, n, false, extra...)
	if err != nil {
		ml.err = err
		return ml
	}
	defer c.close()
	unsteady, err := c.startOneThenTwo(ctx)
	if err != nil {
		ml.err = err
		return ml
	}
	if err := c.waitAllLed(ctx, nil, mcfg.within(mcfg.bound())); err != nil {
		if ctx.Err() != nil {
			ml.err = ctx.Err()
			return ml
		}
		unsteady = joinNonEmpty(unsteady, "not every election had a leader when the busy loops started ("+err.Error()+")")
	}
	ml.unsteady = unsteady
	c0, err := c.counts(ctx)
	if err != nil {
		ml.err = err
		return ml
	}
	cpu0 := postgresCPU(mcfg.postmaster)
	stop, err := startSpinners(mcfg.manyLoadSpin)
	if err != nil {
		ml.err = err
		return ml
	}
	ml.load0 = loadNow()
	t0, w0 := monotonic(), time.Now()
	err = sleep(ctx, mcfg.manyLoad)
	t1 := monotonic()
	ml.load1 = loadNow()
	stop()
	if err != nil {
		ml.err = err
		return ml
	}
	iv := float64(time.Since(w0)) / float64(mcfg.timing.HeartbeatInterval)
	if cpu1 := postgresCPU(mcfg.postmaster); cpu0 >= 0 && cpu1 >= 0 {
		ml.cpuMs = float64(cpu1-cpu0) / float64(time.Millisecond) / iv
	}
	if c1, err := c.counts(ctx); err == nil {
		ml.perProc = map[string]float64{}
		for i, p := range c.procs {
			ml.perProc[p.name] = float64(c1[i]-c0[i]) / iv
		}
	}
	byIdx := c.beliefsOf(t0, t1)
	ml.reasons = map[string]int{}
	for i := range n {
		bs := byIdx[i]
		if len(bs) == 0 {
			ml.neverLed++
		}
		for _, b := range bs {
			if b.end < t1 && b.end > t0 && b.reason != "" {
				ml.reasons[b.reason]++
				ml.endedWhen[min(9, int((b.end-t0)*10/(t1-t0)))]++
			}
		}
		moves, leaderless, longest := leadershipOf(bs, t0, t1)
		ml.changes += moves
		ml.leaderless += leaderless
		ml.longest = max(ml.longest, longest)
		if longest > mcfg.bound() {
			ml.overBound++
		}
	}
	return ml
}

func logLoad(ml manyLoad) {
	if ml.err != nil {
		logf("  beside busy loops, %s: FAILED: %v", ml.label, ml.err)
		return
	}
	logf("  beside busy loops, %s: %d elections without a leader longer than the bound, %d never led, longest gap %s ms, %.1f election-seconds leaderless, %d leader changes, ended %v; statements/interval %s; server CPU %.1f ms/interval; load %s → %s",
		ml.label, ml.overBound, ml.neverLed, ms(ml.longest), ml.leaderless.Seconds(), ml.changes, fmtReasons(ml.reasons), fmtShort(ml.perProc), ml.cpuMs, ml.load0, ml.load1)
	logf("  beside busy loops, %s: leaderships ended in each tenth of the window: %v", ml.label, ml.endedWhen)
	if ml.unsteady != "" {
		logf("  beside busy loops, %s: %s", ml.label, ml.unsteady)
	}
}

func fmtReasons(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// loadMarkdown is the busy-loop part of the many-elections section.
func loadMarkdown(loads []manyLoad, bound, hb time.Duration, elections int) string {
	if len(loads) == 0 {
		return ""
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("\n### Beside busy loops (issue 43)\n\n")
	p("%d elections across 3 node processes (the first, started alone, leads them all; the other two follow), each process connected to the server directly with a pool of %d connections; once every election has a leader, %d busy loops (processes of their own) spin for %v. Per election, from the nodes' reports: every interval in which no process believed it led. Statements per heartbeat interval (%v) per process, the server's CPU per interval, the load average when the loops started and ended.\n\n",
		elections, loads[0].conns, loads[0].spin, loads[0].window, hb)
	p("%s", loadTable(loads, bound, elections))
	p("\n")
	for _, ml := range loads {
		if ml.unsteady != "" {
			p("- %s: %s.\n", ml.label, ml.unsteady)
		}
		if ml.err == nil && ml.changes > 0 {
			p("- %s: leaderships ended in each tenth of the window: %v.\n", ml.label, ml.endedWhen)
		}
		if ml.err == nil && ml.mode == "nobatch" {
			p("- Target of issue 43, one statement per election beside busy loops: 0 elections without a leader for longer than their bound: %s (%d; leaderships that ended in the window: %s).\n", verdict(ml.overBound == 0 && ml.unsteady == ""), ml.overBound, fmtReasons(ml.reasons))
		}
	}
	return b.String()
}

// loadTable is the table of the runs beside busy loops, one row per mode.
func loadTable(loads []manyLoad, bound time.Duration, elections int) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("| mode | elections without a leader longer than the bound (%v) | never led | longest leaderless ms | leaderless election-seconds (share) | leader changes | leaderships ended (why) | statements/interval per process | server CPU ms/interval | load at the start → end |\n", bound)
	p("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |\n")
	for _, ml := range loads {
		if ml.err != nil {
			p("| %s | failed: %v | | | | | | | | |\n", ml.label, ml.err)
			continue
		}
		cpu := "–"
		if ml.cpuMs >= 0 {
			cpu = fmt.Sprintf("%.1f", ml.cpuMs)
		}
		share := ml.leaderless.Seconds() / (float64(elections) * ml.window.Seconds())
		p("| %s | %d of %d | %d | %s | %.1f (%.1f %%) | %d | %s | %s | %s | %s → %s |\n", ml.label, ml.overBound, elections, ml.neverLed, ms(ml.longest), ml.leaderless.Seconds(), 100*share, ml.changes, fmtReasons(ml.reasons), fmtShort(ml.perProc), cpu, ml.load0, ml.load1)
	}
	return b.String()
}
