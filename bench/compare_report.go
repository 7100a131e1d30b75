package main

import (
	"fmt"
	"image/color"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func (c *compareReport) result(kind string) *cmpResult {
	for _, r := range c.results {
		if r.kind == kind {
			return r
		}
	}
	return nil
}

// cutSummary condenses a kind's cut samples.
type cutSummary struct {
	n, withOverlap, noLeader, stillBelieving int
	believed, toLeader, overlap, leaderless  []time.Duration
}

func summarizeCut(ss []cutSample) cutSummary {
	var cs cutSummary
	cs.n = len(ss)
	for _, s := range ss {
		if s.believed >= 0 {
			cs.believed = append(cs.believed, s.believed)
		} else {
			cs.stillBelieving++
		}
		if s.toLeader >= 0 {
			cs.toLeader = append(cs.toLeader, s.toLeader)
			if s.believed >= 0 && s.toLeader > s.believed {
				cs.leaderless = append(cs.leaderless, s.toLeader-s.believed)
			} else {
				cs.leaderless = append(cs.leaderless, 0)
			}
		} else {
			cs.noLeader++
		}
		if s.overlap > 0 {
			cs.withOverlap++
			cs.overlap = append(cs.overlap, s.overlap)
		}
	}
	return cs
}

func p50max(s []time.Duration) string {
	if len(s) == 0 {
		return "–"
	}
	sum := summarize(s)
	return ms(sum.p50) + " / " + ms(sum.max)
}

func (r *report) compareMarkdown() string {
	c := r.cmp
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	t, lt := r.cfg.timing, riverTiming(r.cfg.bound())
	short := ""
	if r.cfg.shortKeepalive > 0 {
		short = fmt.Sprintf("; the advisory lock is cut once more with %v, shorter than the up to two retry periods its holder's check can take", r.cfg.shortKeepalive)
	}
	p("## Side by side with what a PostgreSQL user would write instead (issue 18)\n\n")
	p("Three electors on the same PostgreSQL in the same run, each node a process of its own (this program re-executed as `bench node`) with its own connections; in the crash, the cut and the cost each node reaches the server through a TCP proxy of its own, in the handover directly, as the floor's connections do (a proxy adds a hop through the bench process to every statement and notification):\n\n")
	p("- **leaderfeed**: the postgres backend; heartbeat %v, election timeout %v–%v, lease %v.\n", t.HeartbeatInterval, t.ElectionTimeoutMin, t.ElectionTimeoutMax, t.LeaseDuration)
	p("- **advisory-lock**: `pg_try_advisory_lock` on a dedicated connection, retried every %v (the dead-leader bound: a killed holder's lock is free at once, so the retry period bounds failover); the holder checks its session with `SELECT 1` every period under a deadline of one period and steps down when that fails; resign is `pg_advisory_unlock`.\n", r.cfg.advRetry)
	p("- **polling-lease**: River's elector in one statement (`INSERT ... ON CONFLICT DO UPDATE SET holder = $me, expires_at = now() + ttl WHERE expires_at < now() OR holder = $me`), River's defaults scaled by %v / 15 s so that the TTL is the bound: followers poll every %v + up to %v, the leader renews every %v, each statement has a deadline of %v, and the leader steps down only when a renewal finds another holder or after 5 failed renewals in a row (backoff %v, doubling); resign deletes the row.\n",
		r.cfg.bound(), lt.interval, lt.jitter, lt.interval, lt.deadline, lt.backoff)
	p("- Each node reports when it begins and stops believing it leads (CLOCK_MONOTONIC, shared by all processes); a killed node stops at the kill. The checker compares every two beliefs of different processes in one election and counts overlaps, whatever the elector.\n")
	p("- Silent cut: the leader's proxy stops forwarding in both directions, without FIN or RST. The proxy's own kernel keeps acknowledging, so only application timeouts notice; the server's TCP keepalive is played by resetting the server's side of the cut connections %v after the cut (PostgreSQL's default leaves it to the kernel: about 2 h 12 min on Linux)%s. Only the advisory lock depends on it: the others keep their state in a row. Each cut waits at most %v.\n", r.cfg.serverKeepalive, short, r.cfg.cutWait)
	p("- Handover runs one elector after the other, with a pause of %v plus a random 0–%v before each, so that the resign falls at any phase of the other nodes' timers; crash and cut (after a random 0–500 ms pause) run the three side by side, each in its own election.\n\n", r.cfg.settle, r.cfg.bound())

	p("### Latency (milliseconds)\n\n")
	p("| scenario | elector | samples | p50 | p99 | max | p50 ÷ leaderfeed | p99 ÷ leaderfeed | overlaps found by the checker (longest, ms) |\n")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	lf := c.result(kindLeaderfeed)
	row := func(title, scenario string, get func(*cmpResult) []time.Duration) {
		base := summarize(get(lf))
		for _, res := range c.results {
			if res.cutOnly && scenario != "cut" {
				continue
			}
			s := get(res)
			ov := res.checks[scenario]
			ovs := fmt.Sprintf("%d", ov.count)
			if ov.count > 0 {
				ovs += fmt.Sprintf(" (%s)", ms(summarize(ov.durations).max))
			}
			if len(s) == 0 {
				p("| %s | %s | 0 | – | – | – | – | – | %s |\n", title, res.label, ovs)
				continue
			}
			sum := summarize(s)
			r50, r99 := "", ""
			if res.kind != kindLeaderfeed && base.n > 0 {
				r50, r99 = ratio(sum.p50, base.p50), ratio(sum.p99, base.p99)
			}
			p("| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", title, res.label, sum.n, ms(sum.p50), ms(sum.p99), ms(sum.max), r50, r99, ovs)
		}
	}
	row("clean handover: resign → another node leads", "handover", func(x *cmpResult) []time.Duration { return x.handover.samples })
	row("crash: kill -9 of the leader → another node leads", "crash", func(x *cmpResult) []time.Duration { return x.crash.samples })
	row("silent cut of the leader → another node leads", "cut", func(x *cmpResult) []time.Duration { return summarizeCut(x.cut).toLeader })
	p("\n")
	for _, res := range c.results {
		for _, s := range []series{res.handover, res.crash} {
			if n := s.lost.total(); n > 0 {
				p("- %s, %s: lost rounds: %d, retried (%s).\n", res.label, strings.TrimPrefix(s.scenario, "cmp-"), n, s.lost)
			}
		}
		if n := res.cutLost.total(); n > 0 {
			p("- %s, cut: lost rounds: %d, retried (%s).\n", res.label, n, res.cutLost)
		}
		for _, e := range res.errs {
			p("- %s failed: %s.\n", res.label, e)
		}
	}

	p("\n### Silent cut of the leader (milliseconds from the cut; p50 / max)\n\n")
	p("| elector | cuts | old leader stopped believing after | still believing at the end of the wait | another node led after | no new leader within the wait | cuts with two leaders | overlap | time with no leader |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, res := range c.results {
		cs := summarizeCut(res.cut)
		p("| %s | %d | %s | %d | %s | %d | %d | %s | %s |\n", res.label, cs.n, p50max(cs.believed), cs.stillBelieving, p50max(cs.toLeader), cs.noLeader, cs.withOverlap, p50max(cs.overlap), p50max(cs.leaderless))
	}
	p("\nAn overlap is counted from the moment another node leads until the cut leader stops believing it leads (or, if it never stopped, until the kill that ends the sample after the wait: then it is a lower bound). A node's report of when it stopped counts even if it arrives late: leaderfeed stamps the end of its lease, which a loaded machine may report after the fact.\n\n")

	p("### Steady-state cost (3 nodes, per second)\n\n")
	p("Counted over %v once every election had a leader. Server: statements from %s in this database (the count's own queries excluded), WAL from `pg_current_wal_insert_lsn()` (the whole cluster; nothing else ran). Clients: statements each node sent, counted by a pgx tracer.\n\n", r.cfg.costWindow, c.costSource)
	p("| elector | elections | statements/s (server) | ÷ leaderfeed | WAL bytes/s | ÷ leaderfeed | statements/s by the leader(s) | by the busiest follower | per election (all nodes) | leader changes in the window |\n")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, cr := range c.cost {
		if cr.err != nil {
			p("| %s | %d | failed: %v | | | | | | | |\n", cr.kind, cr.elections, cr.err)
			continue
		}
		var base *costRow
		for i := range c.cost {
			if c.cost[i].kind == kindLeaderfeed && c.cost[i].elections == cr.elections && c.cost[i].err == nil {
				base = &c.cost[i]
			}
		}
		rs, rw := "", ""
		if base != nil && cr.kind != kindLeaderfeed {
			rs, rw = fratio(cr.serverStmts, base.serverStmts), fratio(cr.walBytes, base.walBytes)
		}
		p("| %s | %d | %.1f | %s | %.0f | %s | %.1f | %.1f | %.2f | %d |\n", cr.kind, cr.elections, cr.serverStmts, rs, cr.walBytes, rw, cr.leaderStmts, cr.followerStmts, cr.clientStmts/float64(cr.elections), cr.changes)
	}
	p("\nWith more than one election leaderfeed runs its Feeds through one base.Elections per node (one postgres Store: one LISTEN connection, renewals batched); the advisory lock elector holds all 100 locks on its one connection; the lease elector polls each election's row on its own.\n\n")

	p("### The floors: a handover in bare pgx (milliseconds)\n\n")
	if c.floorErr != nil {
		p("Failed: %v.\n\n", c.floorErr)
	} else {
		f := c.floor
		p("Two floors, with nothing else running, %d samples each. **One write** (what a handover to a participant is): connection A writes the record that names the successor with a compare-and-set on its revision and notifies in the same statement (`WITH u AS (UPDATE ... WHERE rev = $n RETURNING rev) SELECT pg_notify(...) FROM u`); from before A's statement until the successor's listening connection B has the notification. **Two writes** (a handover through a vacancy, what leaderfeed does without participants, -no-presence): A writes the vacancy and notifies, B receives the notification and writes its claim (`UPDATE ... WHERE rev = $n`); until B has its claim's reply. PostgreSQL wakes every listening backend of the database on a commit that notifies, so each floor is also measured with the listeners of the scenario it is compared with: %d more listening connections for the one-process handover (its other two candidates and the observer), %d more across node processes (the other two nodes). Those two also pause between samples as their scenario pauses between handovers, since a machine idle for 150 ms or more (cold caches, sleeping cores) takes longer over a write and its notification than one that wrote 10–20 ms before, as the others pause.\n\n", len(f.total.samples), floorCrowd, nodeCrowd)
		p("| what | p50 | p99 | max | p50 ÷ two-write floor | p50 ÷ one-write floor, same listeners |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
		fs := summarize(f.total.samples)
		line := func(name string, s, one []time.Duration) {
			if len(s) == 0 {
				p("| %s | – | – | – | – | – |\n", name)
				return
			}
			sum := summarize(s)
			r1 := ""
			if len(one) > 0 {
				r1 = ratio(sum.p50, summarize(one).p50)
			}
			p("| %s | %s | %s | %s | %s | %s |\n", name, ms(sum.p50), ms(sum.p99), ms(sum.max), ratio(sum.p50, fs.p50), r1)
		}
		for _, o := range f.one {
			switch o.others {
			case 0:
				line("one-write floor: handover write, notification at the successor", o.samples, o.samples)
				line("… of which the write (A's reply)", o.write, nil)
			default:
				line(fmt.Sprintf("one-write floor with %d more connections listening, pause %s", o.others, o.pause), o.samples, o.samples)
			}
		}
		if f.acrossErr != nil {
			p("| one-write floor across processes | failed: %v | | | | |\n", f.acrossErr)
		} else {
			line(fmt.Sprintf("one-write floor across processes (the successor and the other node each listen in a process of their own, the writer's listener beside it), pause %s", f.across.pause), f.across.samples, f.across.samples)
		}
		line("two-write floor: vacancy write, notification, claim", f.total.samples, nil)
		line("… of which the vacancy write (A's reply)", f.vacancy.samples, nil)
		line("… until B has the notification", f.notified.samples, nil)
		line(fmt.Sprintf("two-write floor with %d more connections listening", floorCrowd), f.crowded.samples, nil)
		lfIn, _ := r.find("handover", "leaderfeed/postgres")
		et, _ := r.find("handover", "etcd")
		line(fmt.Sprintf("leaderfeed handover, one process (Resign → EventElected read; %d other listeners)", floorCrowd), lfIn.samples, f.oneWrite(floorCrowd))
		line(fmt.Sprintf("leaderfeed handover, node processes (table above; %d other listeners; ÷ the floor across processes)", nodeCrowd), lf.handover.samples, f.nodeFloor())
		line("etcd handover (Resign → Campaign returns)", et.samples, nil)
		p("\n")
		for _, h := range []struct {
			name    string
			samples []time.Duration
			floor   []time.Duration
		}{{"in one process", lfIn.samples, f.oneWrite(floorCrowd)}, {"across node processes", lf.handover.samples, f.nodeFloor()}} {
			one := h.floor
			if len(h.samples) == 0 || len(one) == 0 {
				continue
			}
			hs, ofs := summarize(h.samples), summarize(one)
			p("- Target of issue 43, handover p50 at most 1.3× the one-write floor with the scenario's listeners, %s: %s (%s ms vs %s ms, %s; the two-write floor %s ms).\n",
				h.name, verdict(float64(hs.p50) <= 1.3*float64(ofs.p50)), ms(hs.p50), ms(ofs.p50), ratio(hs.p50, ofs.p50), ms(fs.p50))
		}
		if len(lfIn.samples) > 0 && len(et.samples) > 0 {
			ls, es := summarize(lfIn.samples), summarize(et.samples)
			p("- Target of issue 18, leaderfeed's handover p50 ≤ 0.75× etcd's: %s (%s ms vs %s ms, %s).\n", verdict(float64(ls.p50) <= 0.75*float64(es.p50)), ms(ls.p50), ms(es.p50), ratio(ls.p50, es.p50))
		}
		p("\n")
	}
	p("![comparison distributions](compare.png)\n")
	return b.String()
}

func fratio(a, b float64) string {
	if b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

var kindColors = map[string]color.RGBA{
	kindLeaderfeed: {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	kindAdvisory:   {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	kindLease:      {R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	"bare pgx":     {R: 0x55, G: 0x55, B: 0x55, A: 0xff},
}

// plotCompare draws the distributions of the comparison: handover (with
// the floor), crash, and the cut's time to a new leader and overlap.
func plotCompare(path string, c *compareReport) error {
	type line struct {
		name    string
		samples []time.Duration
		dashed  bool
	}
	panels := []struct {
		title string
		log   bool
		lines []line
	}{
		{title: "clean handover: resign → another node leads", log: true},
		{title: "crash: kill -9 → another node leads"},
		{title: "silent cut → another node leads (solid), overlap (dashed)"},
	}
	for _, r := range c.results {
		if !r.cutOnly {
			panels[0].lines = append(panels[0].lines, line{name: r.label, samples: r.handover.samples})
			panels[1].lines = append(panels[1].lines, line{name: r.label, samples: r.crash.samples})
		}
		cs := summarizeCut(r.cut)
		panels[2].lines = append(panels[2].lines, line{name: r.label, samples: cs.toLeader})
		if len(cs.overlap) > 0 {
			panels[2].lines = append(panels[2].lines, line{name: r.label, samples: cs.overlap, dashed: true})
		}
	}
	if c.floorErr == nil {
		panels[0].lines = append(panels[0].lines, line{name: "bare pgx", samples: c.floor.total.samples, dashed: true},
			line{name: "bare pgx, one write", samples: c.floor.oneWrite(0), dashed: true})
	}
	var plots [][]*plot.Plot
	var row []*plot.Plot
	for _, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.Title.TextStyle.Font.Size = vg.Points(10)
		p.X.Label.Text = "ms"
		p.Y.Label.Text = "fraction of samples ≤ x"
		if pn.log {
			p.X.Label.Text = "ms (log scale)"
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		}
		p.Y.Min, p.Y.Max = 0, 1
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		for _, l := range pn.lines {
			if len(l.samples) == 0 {
				continue
			}
			pl, err := plotter.NewLine(ecdf(l.samples))
			if err != nil {
				return err
			}
			pl.Color = kindColors[l.name]
			if _, ok := kindColors[l.name]; !ok {
				pl.Color = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // a variant
			}
			pl.Width = vg.Points(1.5)
			label := fmt.Sprintf("%s n=%d", l.name, len(l.samples))
			if l.dashed {
				pl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				if !strings.HasPrefix(l.name, "bare pgx") {
					label = fmt.Sprintf("%s overlap n=%d", l.name, len(l.samples))
				}
			}
			p.Add(pl)
			p.Legend.Add(label, pl)
		}
		row = append(row, p)
	}
	plots = append(plots, row)
	w, h := 15*vg.Inch, 4.5*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 4, PadBottom: vg.Millimeter * 4, PadLeft: vg.Millimeter * 4, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(plots, tiles, dc)
	for i := range row {
		row[i].Draw(canvases[0][i])
	}
	return writePNG(path, img)
}
