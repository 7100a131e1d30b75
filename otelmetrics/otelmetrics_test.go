package otelmetrics_test

import (
	"context"
	"errors"
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

// collected is one collection, by instrument name.
type collected map[string]metricdata.Metrics

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// value returns the value of the point of instrument name whose attributes
// include want (sums and gauges), and whether there is one.
func (c collected) value(name string, want ...attribute.KeyValue) (float64, bool) {
	match := func(s attribute.Set) bool {
		for _, kv := range want {
			if v, ok := s.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	switch d := c[name].Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				return p.Value, true
			}
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		defer func() { _ = mp.Shutdown(context.Background()) }()
		m, err := otelmetrics.New(mp)
		if err != nil {
			t.Fatal(err)
		}
		store := memory.NewStore()
		b, _ := store.Backend("e")
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
		node := attribute.String("node", "n1")
		checks := []struct {
			name string
			want func(float64) bool
			says string
			kv   []attribute.KeyValue
		}{
			{"leaderfeed.leader", func(v float64) bool { return v == 1 }, "1 (leading)", nil},
			{"leaderfeed.term", func(v float64) bool { return v == 1 }, "1", nil},
			{"leaderfeed.leadership.changes", func(v float64) bool { return v == 1 }, "1 elected", []attribute.KeyValue{attribute.String("event", "elected")}},
			{"leaderfeed.claims", func(v float64) bool { return v == 1 }, "1", nil},
			{"leaderfeed.renewal.failures", func(v float64) bool { return v == 1 }, "1", nil},
			{"leaderfeed.feed.reconnects", func(v float64) bool { return v == 1 }, "1", nil},
			{"leaderfeed.changes.dropped", func(v float64) bool { return v >= 1 }, ">= 1", nil},
			{"leaderfeed.heartbeat.age", func(v float64) bool { return v >= 0 && v <= timing.HeartbeatInterval.Seconds() }, "within a heartbeat interval", nil},
		}
		for _, ck := range checks {
			v, ok := c.value(ck.name, append(ck.kv, node, attribute.String("election", "e"))...)
			if !ok || !ck.want(v) {
				t.Errorf("%s = %v (present %v), want %s", ck.name, v, ok, ck.says)
			}
		}
		h, ok := c["leaderfeed.renewal.duration"].Data.(metricdata.Histogram[float64])
		if !ok || len(h.DataPoints) != 1 || h.DataPoints[0].Count < 5 {
			t.Fatalf("renewal.duration: %+v, want one histogram with at least 5 renewals", c["leaderfeed.renewal.duration"].Data)
		}
		if mx, _ := h.DataPoints[0].Max.Value(); mx != 0.002 {
			t.Errorf("renewal.duration max %v s, want the injected 0.002 s", mx)
		}

		if err := f.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		c = collect(t, reader)
		if v, _ := c.value("leaderfeed.leadership.changes", node, attribute.String("event", "unelected"), attribute.String("reason", "stopped")); v != 1 {
			t.Errorf("leadership.changes unelected/stopped = %v, want 1", v)
		}
		if v, _ := c.value("leaderfeed.leader", node); v != 0 {
			t.Errorf("leader = %v after Stop, want 0", v)
		}
	})
}

func TestNewNilProvider(t *testing.T) {
	if _, err := otelmetrics.New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
}
