package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/faulty"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
	"github.com/leaderfeed/leaderfeed/otelmetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var timing = heartbeat.Timing{
	HeartbeatInterval:  10 * time.Millisecond,
	ElectionTimeoutMin: 100 * time.Millisecond,
	ElectionTimeoutMax: 200 * time.Millisecond,
	LeaseDuration:      40 * time.Millisecond,
}

func election(name string) attribute.KeyValue { return attribute.String("leaderfeed.election", name) }
func node(id string) attribute.KeyValue       { return attribute.String("leaderfeed.node", id) }
func outcome(o string) attribute.KeyValue     { return attribute.String("leaderfeed.outcome", o) }

// newMetrics returns a Metrics on a MeterProvider read by hand.
func newMetrics(t *testing.T) (*otelmetrics.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := otelmetrics.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	return m, reader
}

// point is one data point: a sum's or gauge's value, or a histogram's
// count and max.
type point struct {
	attrs attribute.Set
	value float64
	max   float64
}

// collected is one collection: the points of each instrument, by name.
type collected map[string][]point

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var ps []point
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					ps = append(ps, point{attrs: p.Attributes, value: float64(p.Value)})
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					ps = append(ps, point{attrs: p.Attributes, value: float64(p.Value)})
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					ps = append(ps, point{attrs: p.Attributes, value: p.Value})
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					mx, _ := p.Max.Value()
					ps = append(ps, point{attrs: p.Attributes, value: float64(p.Count), max: mx})
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			out[m.Name] = ps
		}
	}
	return out
}

// find returns the points of instrument name whose attributes include want.
func (c collected) find(name string, want ...attribute.KeyValue) []point {
	var out []point
	for _, p := range c[name] {
		match := true
		for _, kv := range want {
			if v, ok := p.attrs.Value(kv.Key); !ok || v != kv.Value {
				match = false
				break
			}
		}
		if match {
			out = append(out, p)
		}
	}
	return out
}

// value returns the value of the one point of instrument name whose
// attributes are exactly want, and whether there is one.
func (c collected) value(name string, want ...attribute.KeyValue) (float64, bool) {
	exact := attribute.NewSet(want...)
	for _, p := range c[name] {
		if p.attrs.Equals(&exact) {
			return p.value, true
		}
	}
	return 0, false
}

// TestMetrics follows one Feed through an election, a slow and a failed
// renewal, a broken changefeed and Stop.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		store := memory.NewDB()
		b, _ := store.Election("e")
		fb := faulty.Wrap(b)
		f, err := base.New(fb, "n1", base.Options{Timing: timing, Trace: m.Trace(), MaxPendingChanges: 1})
		if err != nil {
			t.Fatal(err)
		}
		stop, err := m.Observe(f)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		slow := f.Subscribe(context.Background()) // never read: drops changes
		defer slow.Close()
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for !f.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 1, Delay: 2 * time.Millisecond})
		fb.Inject(faulty.Fault{Method: faulty.MethodHeartbeat, Nth: 2, Err: errors.New("boom")})
		time.Sleep(5 * timing.HeartbeatInterval)
		fb.BreakFeed(nil)
		time.Sleep(timing.HeartbeatInterval) // reopened
		for i := range 3 {
			_ = store.Put("other", i)
		}
		synctest.Wait()

		c := collect(t, reader)
		e, n := election("e"), node("n1")
		checks := []struct {
			name string
			kv   []attribute.KeyValue
			want func(float64) bool
			says string
		}{
			{"leaderfeed.leading", nil, func(v float64) bool { return v == 1 }, "1 (leading)"},
			{"leaderfeed.term", nil, func(v float64) bool { return v == 1 }, "1"},
			{"leaderfeed.leadership.changes", []attribute.KeyValue{attribute.String("leaderfeed.transition", "elected")},
				func(v float64) bool { return v == 1 }, "1 elected"},
			{"leaderfeed.claim.duration", []attribute.KeyValue{outcome("success")}, func(v float64) bool { return v == 1 }, "1 claim"},
			{"leaderfeed.renewal.duration", []attribute.KeyValue{outcome("error")}, func(v float64) bool { return v == 1 }, "1 failed renewal"},
			{"leaderfeed.renewal.duration", []attribute.KeyValue{outcome("success")}, func(v float64) bool { return v >= 4 }, ">= 4 renewals"},
			{"leaderfeed.changefeed.failures", nil, func(v float64) bool { return v == 1 }, "1"},
			{"leaderfeed.event.dropped", nil, func(v float64) bool { return v >= 1 }, ">= 1"},
			{"leaderfeed.heartbeat.age", nil, func(v float64) bool { return v >= 0 && v <= timing.HeartbeatInterval.Seconds() }, "within a heartbeat interval"},
		}
		for _, ck := range checks {
			v, ok := c.value(ck.name, append(ck.kv, e, n)...)
			if !ok || !ck.want(v) {
				t.Errorf("%s%v = %v (present %v), want %s; all points: %+v", ck.name, ck.kv, v, ok, ck.says, c[ck.name])
			}
		}
		if ps := c.find("leaderfeed.renewal.duration", outcome("success")); len(ps) != 1 || ps[0].max != 0.002 {
			t.Errorf("renewal.duration success: %+v, want one point with the injected 0.002 s as max", ps)
		}

		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		c = collect(t, reader)
		if v, _ := c.value("leaderfeed.leadership.changes", e, n, attribute.String("leaderfeed.transition", "unelected"),
			attribute.String("leaderfeed.reason", "stopped")); v != 1 {
			t.Errorf("leadership.changes unelected/stopped = %v, want 1", v)
		}
		if v, _ := c.value("leaderfeed.changefeed.failures", e, n); v != 1 {
			t.Errorf("changefeed.failures = %v after Stop, want still 1 (Stop is no failure)", v)
		}
		for _, g := range []string{"leaderfeed.leading", "leaderfeed.term", "leaderfeed.heartbeat.age", "leaderfeed.event.dropped"} {
			if ps := c[g]; len(ps) != 0 {
				t.Errorf("%s after Stop: %+v, want no point (a stopped Feed leaves the gauges)", g, ps)
			}
		}
	})
}

// TestManyFeeds: one Metrics serves the Feeds of two nodes in many
// elections, each point labelled with its own Feed; only observed Feeds
// are in the gauges, and stopped ones leave them.
func TestManyFeeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		m, reader := newMetrics(t)
		store := memory.NewDB()
		type key struct{ election, node string }
		feeds := map[key]*base.Feed{}
		for _, id := range []string{"a", "b"} {
			els, err := base.NewElections(store.Conn(), base.ElectionsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer els.Close()
			for i := range n {
				name := fmt.Sprintf("e%02d", i)
				f, err := els.Feed(name, id, base.Options{Timing: timing, Trace: m.Trace()})
				if err != nil {
					t.Fatal(err)
				}
				if id == "a" || i%2 == 0 { // b's odd elections are not observed
					if _, err := m.Observe(f); err != nil {
						t.Fatal(err)
					}
				}
				if err := f.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				defer f.Stop(context.Background())
				feeds[key{name, id}] = f
			}
		}
		time.Sleep(2 * timing.ElectionTimeoutMax)
		synctest.Wait()

		c := collect(t, reader)
		if got, want := len(c["leaderfeed.leading"]), n+n/2; got != want {
			t.Errorf("leading: %d points, want %d (the observed Feeds)", got, want)
		}
		for k, f := range feeds {
			e, nd := election(k.election), node(k.node)
			observed := k.node == "a" || k.election[2]%2 == 0
			v, ok := c.value("leaderfeed.leading", e, nd)
			if ok != observed {
				t.Errorf("%v: leading present %v, want %v", k, ok, observed)
			}
			if leads := f.IsLeader(); ok && (v == 1) != leads {
				t.Errorf("%v: leading = %v, but IsLeader() = %v", k, v, leads)
			}
			term, _ := f.Leader()
			if v, ok := c.value("leaderfeed.term", e, nd); ok && v != float64(term.Term) {
				t.Errorf("%v: term = %v, Feed saw %d", k, v, term.Term)
			}
			// Trace labels by the call's own Feed, observed or not.
			_, won := c.value("leaderfeed.leadership.changes", e, nd, attribute.String("leaderfeed.transition", "elected"))
			if won != f.IsLeader() {
				t.Errorf("%v: elected counted %v, IsLeader() = %v", k, won, f.IsLeader())
			}
			if f.IsLeader() && len(c.find("leaderfeed.renewal.duration", e, nd, outcome("success"))) != 1 {
				t.Errorf("%v leads but has no renewal point of its own: %+v", k, c.find("leaderfeed.renewal.duration", e))
			}
		}
		for i := range n {
			if ps := c.find("leaderfeed.claim.duration", election(fmt.Sprintf("e%02d", i)), outcome("success")); len(ps) != 1 {
				t.Errorf("e%02d: successful claims %+v, want one node's", i, ps)
			}
		}

		// Stop both nodes of the first half: their points leave the gauges.
		for k, f := range feeds {
			if k.election < fmt.Sprintf("e%02d", n/2) {
				if err := f.Stop(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
		c = collect(t, reader)
		for _, p := range c["leaderfeed.leading"] {
			if v, _ := p.attrs.Value("leaderfeed.election"); v.AsString() < fmt.Sprintf("e%02d", n/2) {
				t.Errorf("leading after Stop: point %v of a stopped Feed", p.attrs.Encoded(attribute.DefaultEncoder()))
			}
		}
		if got, want := len(c["leaderfeed.leading"]), n/2+n/4; got != want {
			t.Errorf("leading after stopping half: %d points, want %d", got, want)
		}
	})
}

// TestObserve: a Feed is observed once; a second Feed of the same
// election and node is refused while the first runs; stop takes a Feed
// out of the gauges, is idempotent and never removes a newer Feed.
func TestObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		store := memory.NewDB()
		newFeed := func() *base.Feed {
			b, _ := store.Election("e")
			f, err := base.New(b, "n1", base.Options{Timing: timing, Trace: m.Trace()})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Stop(context.Background()) })
			return f
		}
		leading := func() int { return len(collect(t, reader)["leaderfeed.leading"]) }

		f1 := newFeed()
		stop1, err := m.Observe(f1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Observe(f1); err == nil {
			t.Error("observing a Feed twice succeeded")
		}
		f2 := newFeed()
		if _, err := m.Observe(f2); err == nil {
			t.Error("observing a second running Feed of election e, node n1 succeeded")
		}
		stop1()
		if got := leading(); got != 0 {
			t.Errorf("after stop: %d leading points, want 0", got)
		}
		stop2, err := m.Observe(f2)
		if err != nil {
			t.Fatalf("observing f2 after f1's stop: %v", err)
		}
		defer stop2()
		stop1() // idempotent, and f2 stays
		if got := leading(); got != 1 {
			t.Errorf("f2 observed: %d leading points, want 1", got)
		}
		if err := f2.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		f3 := newFeed()
		if _, err := m.Observe(f3); err != nil {
			t.Errorf("observing f3 after f2 stopped: %v", err)
		}
	})
}

// TestClaimConflict: a claim on a stale revision is recorded with the
// outcome conflict, under the claimant's own attributes.
func TestClaimConflict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		store := memory.NewDB()
		start := func(id string) (*base.Feed, *faulty.Backend) {
			b, _ := store.Election("e")
			fb := faulty.Wrap(b)
			f, err := base.New(fb, id, base.Options{Timing: timing, Trace: m.Trace()})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Stop(context.Background()) })
			return f, fb
		}
		a, _ := start("a")
		for !a.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		// b sees a's record, then hears nothing more: its claim, on a
		// stale revision, meets a's renewals.
		_, fb := start("b")
		time.Sleep(timing.HeartbeatInterval)
		synctest.Wait()
		fb.Inject(faulty.Fault{Method: faulty.MethodSubscribe, Err: errors.New("no feed")})
		fb.Inject(faulty.Fault{Method: faulty.MethodGet, Err: errors.New("no reads")})
		fb.BreakFeed(nil)
		time.Sleep(2 * timing.ElectionTimeoutMax)
		synctest.Wait()

		c := collect(t, reader)
		if v, ok := c.value("leaderfeed.claim.duration", election("e"), node("b"), outcome("conflict")); !ok || v < 1 {
			t.Errorf("b's conflicting claims: %v (present %v), want at least 1; all: %+v", v, ok, c["leaderfeed.claim.duration"])
		}
		if ps := c.find("leaderfeed.claim.duration", node("a")); len(ps) != 1 || ps[0].value != 1 {
			t.Errorf("a's claims: %+v, want its one won claim", ps)
		}
	})
}

func TestNewNilProvider(t *testing.T) {
	if _, err := otelmetrics.New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
}

// TestObserveStartsNoGoroutine: observing a Feed costs an entry in a map,
// not a goroutine (the old Observe subscribed to each Feed's events).
func TestObserveStartsNoGoroutine(t *testing.T) {
	m, _ := newMetrics(t)
	store := memory.NewDB()
	els, err := base.NewElections(store.Conn(), base.ElectionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer els.Close()
	var feeds []*base.Feed
	for i := range 100 {
		f, err := els.Feed(fmt.Sprintf("e%03d", i), "n1", base.Options{Timing: timing, Trace: m.Trace()})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Stop(context.Background())
		feeds = append(feeds, f)
	}
	before := runtime.NumGoroutine()
	for _, f := range feeds {
		if _, err := m.Observe(f); err != nil {
			t.Fatal(err)
		}
	}
	// Not equality: a goroutine of the runtime or of an earlier test may
	// end meanwhile (CI saw 6 after, 7 before); Observe must start none.
	if after := runtime.NumGoroutine(); after > before {
		t.Fatalf("%d goroutines after observing 100 Feeds, %d before", after, before)
	}
}
