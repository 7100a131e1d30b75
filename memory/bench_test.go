package memory_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
)

// benchNodes starts n nodes of one election on a memory DB and returns
// them with a channel of every node's Elected events.
func benchNodes(b *testing.B, tm heartbeat.Timing, n int) ([]*benchNode, <-chan elected) {
	b.Helper()
	return benchNodesWith(b, base.Options{Timing: tm}, n)
}

// benchNodesWith is benchNodes with the options of every node.
func benchNodesWith(b *testing.B, opts base.Options, n int) ([]*benchNode, <-chan elected) {
	b.Helper()
	store := memory.NewDB()
	ch := make(chan elected, 64)
	var nodes []*benchNode
	for i := range n {
		be, err := store.Election("bench")
		if err != nil {
			b.Fatal(err)
		}
		link := faulty.Wrap(be)
		id := fmt.Sprintf("node-%d", i)
		f, err := base.New(link, id, opts)
		if err != nil {
			b.Fatal(err)
		}
		node := &benchNode{id: id, feed: f, link: link}
		events := f.Subscribe(context.Background()).C
		done := make(chan struct{})
		go func() {
			defer close(done)
			for e := range events {
				if e.Type == base.EventElected {
					ch <- elected{node: node, at: e.At}
				}
			}
		}()
		if err := f.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		node.done = done
		nodes = append(nodes, node)
	}
	b.Cleanup(func() {
		for _, n := range nodes {
			_ = n.feed.Stop(context.Background())
			<-n.done
		}
	})
	return nodes, ch
}

type benchNode struct {
	id   string
	feed *base.Feed
	link *faulty.Backend
	done chan struct{}
}

type elected struct {
	node *benchNode
	at   time.Time
}

func nextElected(b *testing.B, ch <-chan elected, except *benchNode) elected {
	b.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-ch:
			if e.node != except {
				return e
			}
		case <-timeout:
			b.Fatal("no leader elected within 10 s")
		}
	}
}

// report adds p50, p99 and max of samples as metrics in milliseconds.
func report(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	q := func(p float64) float64 {
		i := int(p * float64(len(samples)-1))
		return float64(samples[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op") // the per-op time is the sample itself
}

// BenchmarkHandover measures a clean handover: from the call of Resign on
// the leader to the moment the next leader is elected (its Elected event's
// At). Three nodes, default timings.
//
//	go test -run '^$' -bench Handover -benchtime 500x ./memory/
func BenchmarkHandover(b *testing.B) {
	nodes, ch := benchNodes(b, heartbeat.Timing{}, 3)
	leader := nextElected(b, ch, nil).node
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := leader.feed.Resign(context.Background()); err != nil {
			b.Fatal(err)
		}
		e := nextElected(b, ch, leader)
		samples = append(samples, e.at.Sub(start))
		leader = e.node
	}
	b.StopTimer()
	_ = nodes
	report(b, samples)
}

// BenchmarkTransfer measures a transfer: from the call of TransferTo on the
// leader (which reads the participants, steps down and writes the vacancy
// reserved for the target) to the moment the target is elected (its
// Elected event's At). Three participating nodes, default timings; the
// target is the next node in turn.
//
//	go test -run '^$' -bench Transfer -benchtime 500x ./memory/
func BenchmarkTransfer(b *testing.B) {
	nodes, ch := benchNodesWith(b, base.Options{Participate: true}, 3)
	leader := nextElected(b, ch, nil).node
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		target := nodes[(slices.Index(nodes, leader)+1)%len(nodes)]
		start := time.Now()
		if err := leader.feed.TransferTo(context.Background(), target.id); err != nil {
			b.Fatal(err)
		}
		e := nextElected(b, ch, leader)
		if e.node != target {
			b.Fatalf("%s elected after the transfer to %s", e.node.id, target.id)
		}
		samples = append(samples, e.at.Sub(start))
		leader = e.node
	}
	b.StopTimer()
	report(b, samples)
}

// BenchmarkCrashFailover measures failover after a crash: the leader is cut
// off its store (it can neither renew nor resign), and the time to the next
// leader's election is compared with the configured election timeout.
// Timings are shrunk tenfold from the defaults: heartbeat 100 ms, election
// timeout 200..400 ms. Each sample takes about one election timeout.
//
//	go test -run '^$' -bench CrashFailover -benchtime 200x ./memory/
func BenchmarkCrashFailover(b *testing.B) {
	tm := heartbeat.Timing{HeartbeatInterval: 100 * time.Millisecond, ElectionTimeoutMin: 200 * time.Millisecond, ElectionTimeoutMax: 400 * time.Millisecond}
	_, ch := benchNodes(b, tm, 3)
	leader := nextElected(b, ch, nil).node
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		leader.link.Partition()
		e := nextElected(b, ch, leader)
		samples = append(samples, e.at.Sub(start))
		leader.link.Heal()
		leader = e.node
	}
	b.StopTimer()
	report(b, samples)
	b.ReportMetric(float64(tm.ElectionTimeoutMin)/float64(time.Millisecond), "timeout-min-ms")
	b.ReportMetric(float64(tm.ElectionTimeoutMax)/float64(time.Millisecond), "timeout-max-ms")
}

// statementCounter counts the write calls (statements) that reach a store.
type statementCounter struct {
	backend.BatchStore
	stmts atomic.Int64
}

func (c *statementCounter) Heartbeat(ctx context.Context, expected, next heartbeat.Record) (heartbeat.Record, error) {
	c.stmts.Add(1)
	return c.BatchStore.Heartbeat(ctx, expected, next)
}

func (c *statementCounter) HeartbeatBatch(ctx context.Context, writes []backend.Write) ([]backend.WriteResult, error) {
	c.stmts.Add(1)
	return c.BatchStore.HeartbeatBatch(ctx, writes)
}

// BenchmarkManyElections leads 100 and 10,000 elections (-elections: a
// comma-separated list, e.g. -elections=10000,100000) from one process on
// one Elections and measures, per heartbeat interval once every election
// leads: write statements, records written, CPU time, goroutines, failed
// renewals, and the heap and resident memory of the process. Each b.N is
// one interval. bench/run.sh runs it for 10,000 and 100,000 elections.
//
//	cd memory && go test -run '^$' -bench ManyElections -benchtime 20x .
func BenchmarkManyElections(b *testing.B) {
	tm := heartbeat.DefaultTiming()
	sizes, err := electionSizes(*manyElections)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range append([]int{100}, sizes...) {
		for _, batch := range []bool{true, false} {
			name := fmt.Sprintf("elections=%d/batched=%v", n, batch)
			b.Run(name, func(b *testing.B) { benchManyElections(b, tm, n, batch) })
		}
	}
}

var (
	manyElections = flag.String("elections", "10000", "elections of BenchmarkManyElections besides 100, a comma-separated list")
	leadWithin    = flag.Duration("leadwithin", time.Minute, "BenchmarkManyElections: how long every election may take to get its leader before the measured intervals")
	steadyProfile = flag.String("steadyprofile", "", "BenchmarkManyElections: write a CPU profile of the measured intervals (steady state only) to this file")
	steadyHeap    = flag.String("steadyheap", "", "BenchmarkManyElections: write a heap profile of the steady state (every election leads) to this file")
)

// electionSizes parses -elections.
func electionSizes(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-elections: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// renewals records the latencies of renewals (Trace.RenewDone) and counts
// the failed ones.
type renewals struct {
	mu        sync.Mutex
	on        bool
	latencies []time.Duration
	at        []time.Time
	failed    int
	errs      map[string]int // failed renewals by error
}

func (r *renewals) done(ri base.RenewInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	r.latencies = append(r.latencies, ri.Latency)
	r.at = append(r.at, time.Now())
	if ri.Err != nil {
		r.failed++
		if r.errs == nil {
			r.errs = map[string]int{}
		}
		r.errs[ri.Err.Error()]++
	}
}

func benchManyElections(b *testing.B, tm heartbeat.Timing, n int, batch bool) {
	store := memory.NewDB()
	sc := &statementCounter{BatchStore: store.Conn()}
	//lint:ignore SA1019 the benchmark compares the unbatched mode
	els, err := base.NewElections(sc, base.ElectionsOptions{NoBatch: !batch})
	if err != nil {
		b.Fatal(err)
	}
	defer els.Close()
	ren := &renewals{}
	trace := &base.Trace{RenewDone: ren.done}
	feeds := make([]*base.Feed, n)
	for i := range feeds {
		f, err := els.Feed(fmt.Sprintf("election-%05d", i), "node", base.Options{Timing: tm, Trace: trace})
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		feeds[i] = f
	}
	deadline := time.Now().Add(*leadWithin)
	for _, f := range feeds {
		for !f.IsLeader() {
			if time.Now().After(deadline) {
				led := 0
				for _, f := range feeds {
					if f.IsLeader() {
						led++
					}
				}
				b.Fatalf("not every election has a leader after %v: %d of %d lead", *leadWithin, led, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(2 * tm.HeartbeatInterval) // renewals fall into step
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if *steadyHeap != "" {
		out, err := os.Create(*steadyHeap)
		if err != nil {
			b.Fatal(err)
		}
		err = pprof.Lookup("heap").WriteTo(out, 0)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if *steadyProfile != "" {
		out, err := os.Create(*steadyProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			b.Fatal(err)
		}
	}
	ren.mu.Lock()
	ren.on = true
	ren.mu.Unlock()
	goroutines := runtime.NumGoroutine()
	mallocs0 := ms.Mallocs
	stmts0, recs0, cpu0 := sc.stmts.Load(), store.Writes(), cpuTime()
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * tm.HeartbeatInterval)
	b.StopTimer()
	if *steadyProfile != "" {
		pprof.StopCPUProfile()
	}
	ren.mu.Lock()
	ren.on = false
	lat, failed := ren.latencies, ren.failed
	ren.mu.Unlock()
	// Every metric is reported, and also logged when the run fails (a
	// failed benchmark's metrics are not printed), so that what a lost
	// leadership cost is still on record.
	var metrics []string
	report := func(v float64, unit string) {
		b.ReportMetric(v, unit)
		metrics = append(metrics, fmt.Sprintf("%.4g %s", v, unit))
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		report(float64(lat[len(lat)/2])/float64(time.Millisecond), "renew-p50-ms")
		report(float64(lat[len(lat)*99/100])/float64(time.Millisecond), "renew-p99-ms")
		report(float64(lat[len(lat)-1])/float64(time.Millisecond), "renew-max-ms")
	}
	report(float64(failed), "renew-failures")
	if failed > 0 {
		b.Logf("failed renewals by error: %v", ren.errs)
	}
	report(float64(goroutines), "goroutines")
	intervals := float64(b.N)
	report(float64(sc.stmts.Load()-stmts0)/intervals, "statements/interval")
	report(float64(store.Writes()-recs0)/intervals, "records/interval")
	report(float64(cpuTime()-cpu0)/float64(time.Millisecond)/intervals, "cpu-ms/interval")
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	report(float64(after.Mallocs-mallocs0)/intervals/float64(n), "allocs/election/interval")
	report(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	report(float64(rss())/(1<<20), "rss-MiB")
	b.ReportMetric(0, "ns/op")
	lost := 0
	for _, f := range feeds {
		if !f.IsLeader() {
			lost++
		}
	}
	report(float64(lost), "leaders-lost")
	if lost > 0 || testing.Verbose() {
		hist := map[int]int{}
		if len(ren.at) > 0 {
			t0 := ren.at[0]
			for _, t := range ren.at {
				hist[int(t.Sub(t0)/(50*time.Millisecond))]++
			}
		}
		b.Logf("renewals per 50 ms: %v", hist)
	}
	if lost > 0 {
		b.Logf("metrics: %s", strings.Join(metrics, " "))
		var maxLat time.Duration
		if len(lat) > 0 {
			maxLat = lat[len(lat)-1]
		}
		b.Errorf("%d of %d elections lost their leader while nothing failed (renewals: %d, %d failed, latency max %v)",
			lost, n, len(lat), failed, maxLat)
	}
	// Bounded, so that a Stop that hangs fails the benchmark instead of
	// holding up the run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var stuck atomic.Int64
	for _, f := range feeds {
		wg.Go(func() {
			if err := f.Stop(ctx); err != nil {
				stuck.Add(1)
			}
		})
	}
	wg.Wait()
	if k := stuck.Load(); k > 0 {
		b.Errorf("%d of %d feeds did not stop within a minute", k, n)
	}
}

// cpuTime returns the user and system CPU time of the process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rss returns the resident set size of the process in bytes (Linux), or 0.
func rss() int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(data), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize())
}

// BenchmarkLeaderAfterSlowStore measures the time to a leader once a store
// that was slower than the lease recovers (fault 7 of tracker issue 12).
// Three nodes, heartbeat 20 ms, lease 60 ms, timeout 100-200 ms; for 500 ms
// every write is held 80 ms, longer than the lease, so every claim and
// renewal times out (the leader loses its lease, claims fail); then writes
// are fast again. Each op is one slow period; the sample is from its end to
// the next Elected event of any node. (Writes that commit after their
// caller gave up are TestRegressLateClaimDoesNotStall's case.)
//
//	go test -run '^$' -bench LeaderAfterSlowStore -benchtime 50x ./memory/
func BenchmarkLeaderAfterSlowStore(b *testing.B) {
	tm := heartbeat.Timing{HeartbeatInterval: 20 * time.Millisecond, LeaseDuration: 60 * time.Millisecond,
		ElectionTimeoutMin: 100 * time.Millisecond, ElectionTimeoutMax: 200 * time.Millisecond}
	nodes, ch := benchNodes(b, tm, 3)
	nextElected(b, ch, nil)
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		for _, n := range nodes {
			n.link.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Delay: 80 * time.Millisecond})
		}
		time.Sleep(500 * time.Millisecond)
	drain:
		for {
			select {
			case <-ch:
			default:
				break drain
			}
		}
		healed := time.Now()
		for _, n := range nodes {
			n.link.Heal()
		}
		var e elected
		for {
			e = nextElected(b, ch, nil)
			if e.at.After(healed) {
				break
			}
		}
		samples = append(samples, e.at.Sub(healed))
		time.Sleep(tm.ElectionTimeoutMax)
	}
	b.StopTimer()
	report(b, samples)
}
