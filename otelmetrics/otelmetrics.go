// Package otelmetrics records the metrics of a leaderfeed Feed through the
// OpenTelemetry metric API, the vendor-neutral standard: export them with
// any OpenTelemetry exporter (Prometheus users take OpenTelemetry's
// Prometheus exporter, as the leaderfeed command does). It is a module of
// its own, so that the root module keeps no dependency.
//
//	m, err := otelmetrics.New(otel.GetMeterProvider())
//	feed, err := base.New(b, id, base.Options{Trace: m.Trace()})
//	stop, err := m.Observe(feed) // before feed.Start or feed.Run
//	defer stop()
//
// The instruments (every point carries the attributes election and node):
//
//	leaderfeed.leader              gauge        1 while this node leads, else 0
//	leaderfeed.term                gauge        term of the last record seen (the election's current term)
//	leaderfeed.leadership.changes  counter      elections won and lost; attributes event (elected, unelected) and reason (unelected only: resigned, stopped, deposed, lease-expired)
//	leaderfeed.renewal.duration    histogram    seconds from sending a renewal to its reply
//	leaderfeed.renewal.failures    counter      renewals that failed or were refused
//	leaderfeed.claims              counter      claims of leadership sent
//	leaderfeed.claims.lost         counter      claims refused because another node wrote first
//	leaderfeed.feed.reconnects     counter      changefeed reopened after a failure
//	leaderfeed.changes.dropped     counter      change events dropped for slow readers
//	leaderfeed.heartbeat.age       gauge        seconds since the newest revision of the record was seen
package otelmetrics

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/leaderfeed/leaderfeed/base"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/leaderfeed/leaderfeed/otelmetrics"

// Metrics records the metrics of one Feed. Make it with New, put Trace in
// the Feed's Options, and call Observe with the Feed before starting it.
type Metrics struct {
	meter metric.Meter

	changes   metric.Int64Counter
	renewDur  metric.Float64Histogram
	renewFail metric.Int64Counter
	claims    metric.Int64Counter
	lost      metric.Int64Counter
	reconnect metric.Int64Counter
	leader    metric.Int64ObservableGauge
	term      metric.Int64ObservableGauge
	dropped   metric.Int64ObservableCounter
	age       metric.Float64ObservableGauge

	attrs atomic.Pointer[attribute.Set] // election and node, set by Observe
}

// New creates the instruments on a meter of mp.
func New(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: MeterProvider is nil")
	}
	m := &Metrics{meter: mp.Meter(ScopeName)}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	m.changes, err = m.meter.Int64Counter("leaderfeed.leadership.changes", metric.WithUnit("{change}"),
		metric.WithDescription("Leadership won (event=elected) and lost (event=unelected, with its reason) by this node."))
	add(err)
	m.renewDur, err = m.meter.Float64Histogram("leaderfeed.renewal.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a renewal of the leader's record to its reply."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	add(err)
	m.renewFail, err = m.meter.Int64Counter("leaderfeed.renewal.failures", metric.WithUnit("{renewal}"),
		metric.WithDescription("Renewals of the leader's record that failed or were refused."))
	add(err)
	m.claims, err = m.meter.Int64Counter("leaderfeed.claims", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims of leadership sent by this node."))
	add(err)
	m.lost, err = m.meter.Int64Counter("leaderfeed.claims.lost", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims of leadership refused because another node wrote the record first."))
	add(err)
	m.reconnect, err = m.meter.Int64Counter("leaderfeed.feed.reconnects", metric.WithUnit("{reconnect}"),
		metric.WithDescription("Times the changefeed was reopened after a failure."))
	add(err)
	m.leader, err = m.meter.Int64ObservableGauge("leaderfeed.leader",
		metric.WithDescription("1 while this node leads, else 0."))
	add(err)
	m.term, err = m.meter.Int64ObservableGauge("leaderfeed.term",
		metric.WithDescription("The term (fencing token) of the last election record seen."))
	add(err)
	m.dropped, err = m.meter.Int64ObservableCounter("leaderfeed.changes.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Change events dropped for readers that fell behind."))
	add(err)
	m.age, err = m.meter.Float64ObservableGauge("leaderfeed.heartbeat.age", metric.WithUnit("s"),
		metric.WithDescription("Time since this node saw the newest revision of the election record, on its own clock."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) opt() metric.MeasurementOption {
	if s := m.attrs.Load(); s != nil {
		return metric.WithAttributeSet(*s)
	}
	return metric.WithAttributeSet(*attribute.EmptySet())
}

// Trace returns the hooks to put in base.Options.Trace: they record the
// renewals and claims. They never block.
func (m *Metrics) Trace() *base.Trace {
	ctx := context.Background()
	return &base.Trace{
		ClaimDone: func(c base.ClaimInfo) {
			m.claims.Add(ctx, 1, m.opt())
			if errors.Is(c.Err, base.ErrConflict) {
				m.lost.Add(ctx, 1, m.opt())
			}
		},
		RenewDone: func(r base.RenewInfo) {
			m.renewDur.Record(ctx, r.Latency.Seconds(), m.opt())
			if r.Err != nil {
				m.renewFail.Add(ctx, 1, m.opt())
			}
		},
	}
}

// Observe records f's metrics: it subscribes to f's events (for the
// leadership changes and reconnects; call it before Start, or Run, to miss
// none) and reads f's state when the metrics are collected. The attributes
// election and node are f's. stop ends it and waits for its goroutine; it
// is idempotent. It also ends when f has stopped.
func (m *Metrics) Observe(f *base.Feed) (stop func(), err error) {
	set := attribute.NewSet(attribute.String("election", f.Election()), attribute.String("node", f.NodeID()))
	m.attrs.Store(&set)
	attrs := metric.WithAttributeSet(set)
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		leading := int64(0)
		if f.IsLeader() {
			leading = 1
		}
		o.ObserveInt64(m.leader, leading, attrs)
		if rec, ok := f.Leader(); ok {
			o.ObserveInt64(m.term, int64(rec.Term), attrs)
		}
		o.ObserveInt64(m.dropped, int64(f.DroppedChanges()), attrs)
		if h := f.Health(); !h.LastRecord.IsZero() {
			o.ObserveFloat64(m.age, time.Since(h.LastRecord).Seconds(), attrs)
		}
		return nil
	}, m.leader, m.term, m.dropped, m.age)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub := f.Subscribe(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		opened := false
		for e := range sub.C {
			switch e.Type {
			case base.EventElected:
				m.changes.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(set.ToSlice(), attribute.String("event", "elected"))...)))
			case base.EventUnelected:
				m.changes.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(set.ToSlice(),
					attribute.String("event", "unelected"), attribute.String("reason", e.Reason.String()))...)))
			case base.EventSubscribeStarted:
				if opened {
					m.reconnect.Add(ctx, 1, attrs)
				}
				opened = true
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			_ = reg.Unregister()
		})
	}, nil
}
