// Package otelmetrics records the metrics of leaderfeed Feeds through the
// OpenTelemetry metric API, the vendor-neutral standard: export them with
// any OpenTelemetry exporter (Prometheus users take OpenTelemetry's
// Prometheus exporter, as the leaderfeed command does). It is a module of
// its own, so that the root module keeps no dependency.
//
// One Metrics serves every Feed of a process, however many elections:
//
//	m, err := otelmetrics.New(otel.GetMeterProvider())
//	opts := base.Options{Trace: m.Trace()} // the same Trace for every Feed
//	feed, err := elections.Feed(election, nodeID, opts)
//	stop, err := m.Observe(feed) // adds the Feed to the gauges
//	defer stop()
//
// Trace records claims, renewals, leadership changes and changefeed
// failures; every call of its hooks names its election and node, so no
// point can carry another Feed's attributes. Observe adds a Feed to the
// gauges (leading, term, heartbeat age, dropped events), which one
// callback reads from every observed Feed at each collection; a Feed
// leaves them when it stops. An election costs the SDK's points for its
// attribute sets (7 for a leader in a steady state), not instruments of
// its own. The SDK keeps at most 2,000 points per instrument unless told
// otherwise (sdkmetric.WithCardinalityLimit) and folds the rest into one
// overflow point: a process with more Feeds must raise the limit.
//
// The instruments, attributes and an example scrape are in
// docs/METRICS.md. Names follow the OpenTelemetry semantic conventions:
// durations in seconds as histograms named .duration with an outcome
// attribute, counts named by what they count, attributes in the
// leaderfeed namespace.
package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/leaderfeed/leaderfeed/otelmetrics"

// The attributes. Every point carries election and node.
const (
	attrElection   = attribute.Key("leaderfeed.election")
	attrNode       = attribute.Key("leaderfeed.node")
	attrOutcome    = attribute.Key("leaderfeed.outcome")
	attrTransition = attribute.Key("leaderfeed.transition")
	attrReason     = attribute.Key("leaderfeed.reason")
)

// outcome is the value of leaderfeed.outcome for a claim or renewal whose
// store call returned err. Every outcome of the metrics comes from here.
func outcome(err error) string {
	switch {
	case err == nil:
		return "success"
	case errors.Is(err, backend.ErrConflict):
		return "conflict"
	case errors.Is(err, base.ErrRefused):
		return "refused"
	}
	return "error"
}

// durationBuckets are the histogram boundaries, in seconds: from a local
// store's half millisecond to a lease's few seconds.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// Metrics records the metrics of every Feed of a process. Make one with
// New, put its Trace in the Options of every Feed, and Observe each Feed.
// Its methods are safe for concurrent use.
type Metrics struct {
	trace *base.Trace

	claimDur  metric.Float64Histogram
	renewDur  metric.Float64Histogram
	changes   metric.Int64Counter
	feedFails metric.Int64Counter
	leading   metric.Int64ObservableGauge
	term      metric.Int64ObservableGauge
	age       metric.Float64ObservableGauge
	dropped   metric.Int64ObservableCounter

	// feeds holds a *observed per feedKey. A sync.Map, so that the hooks
	// of every Feed find their attributes without a lock that a
	// collection or an Observe would hold.
	feeds sync.Map
}

type feedKey struct{ election, node string }

// observed is one Feed in the gauges, with the attribute sets of its
// points, made once.
type observed struct {
	feed  *base.Feed
	attrs attribute.Set // election and node

	mu       sync.Mutex
	outcomes []outcomeSet // made on first use of each outcome
}

// outcomeSet is the attribute set of a Feed's election, node and outcome.
type outcomeSet struct {
	outcome string
	attrs   attribute.Set
}

// New creates the instruments on a meter of mp and registers the one
// callback that reads the observed Feeds. Make one per process (per
// MeterProvider): two would export the same series twice.
func New(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: MeterProvider is nil")
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	m.claimDur, err = meter.Float64Histogram("leaderfeed.claim.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a claim of leadership to its reply, by outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	add(err)
	m.renewDur, err = meter.Float64Histogram("leaderfeed.renewal.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a renewal of the leader's record to its reply, by outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	add(err)
	m.changes, err = meter.Int64Counter("leaderfeed.leadership.changes", metric.WithUnit("{change}"),
		metric.WithDescription("Leadership won (transition=elected) and lost (transition=unelected, with its reason) by this node."))
	add(err)
	m.feedFails, err = meter.Int64Counter("leaderfeed.changefeed.failures", metric.WithUnit("{failure}"),
		metric.WithDescription("Times the changefeed failed or could not be reopened; it is reopened with backoff."))
	add(err)
	m.leading, err = meter.Int64ObservableGauge("leaderfeed.leading",
		metric.WithDescription("1 while this node leads, else 0."))
	add(err)
	m.term, err = meter.Int64ObservableGauge("leaderfeed.term", metric.WithUnit("{term}"),
		metric.WithDescription("The term (fencing token) of the last election record seen."))
	add(err)
	m.age, err = meter.Float64ObservableGauge("leaderfeed.heartbeat.age", metric.WithUnit("s"),
		metric.WithDescription("Time since this node saw the newest revision of the election record, on its own clock."))
	add(err)
	m.dropped, err = meter.Int64ObservableCounter("leaderfeed.event.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Change events dropped for readers that fell behind."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(m.observe, m.leading, m.term, m.age, m.dropped); err != nil {
		return nil, err
	}
	m.trace = &base.Trace{ClaimDone: m.claimDone, RenewDone: m.renewDone, Event: m.event}
	return m, nil
}

// Trace returns the hooks to put in base.Options.Trace of every Feed (the
// same value each call). They record claims, renewals, leadership changes
// and changefeed failures under the election and node each call names, of
// observed Feeds or not. They never block.
func (m *Metrics) Trace() *base.Trace { return m.trace }

// Observe adds f to the gauges until f stops or stop is called (stop is
// idempotent). It costs an entry in a map: no goroutine, no registration.
// It fails if a Feed of the same election and node is observed and has
// not stopped: their gauges could not be told apart.
func (m *Metrics) Observe(f *base.Feed) (stop func(), err error) {
	k := feedKey{f.Election(), f.NodeID()}
	o := &observed{feed: f, attrs: attribute.NewSet(attrElection.String(k.election), attrNode.String(k.node))}
	for {
		old, loaded := m.feeds.LoadOrStore(k, o)
		if !loaded {
			break
		}
		if !stopped(old.(*observed).feed) {
			return nil, fmt.Errorf("otelmetrics: election %q, node %q is observed already (one running Feed per election and node)", k.election, k.node)
		}
		if m.feeds.CompareAndSwap(k, old, o) {
			break
		}
	}
	// Never removes a Feed observed later under the same names.
	return func() { m.feeds.CompareAndDelete(k, o) }, nil
}

func stopped(f *base.Feed) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

// observe is the callback of the gauges: one pass over the observed
// Feeds, forgetting those that stopped.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	now := time.Now()
	m.feeds.Range(func(k, v any) bool {
		ob := v.(*observed)
		f := ob.feed
		if stopped(f) {
			m.feeds.CompareAndDelete(k, ob)
			return true
		}
		attrs := metric.WithAttributeSet(ob.attrs)
		leading := int64(0)
		if f.IsLeader() {
			leading = 1
		}
		o.ObserveInt64(m.leading, leading, attrs)
		if rec, ok := f.Leader(); ok {
			o.ObserveInt64(m.term, int64(rec.Term), attrs)
		}
		if h := f.Health(); !h.LastRecord.IsZero() {
			o.ObserveFloat64(m.age, now.Sub(h.LastRecord).Seconds(), attrs)
		}
		o.ObserveInt64(m.dropped, int64(f.DroppedChanges()), attrs)
		return true
	})
	return nil
}

func (m *Metrics) claimDone(c base.ClaimInfo) {
	m.claimDur.Record(context.Background(), c.Latency.Seconds(), m.withOutcome(c.Election, c.NodeID, c.Err))
}

func (m *Metrics) renewDone(r base.RenewInfo) {
	m.renewDur.Record(context.Background(), r.Latency.Seconds(), m.withOutcome(r.Election, r.NodeID, r.Err))
}

func (m *Metrics) event(e base.EventInfo) {
	ctx := context.Background()
	switch e.Event.Type {
	case base.EventElected:
		m.changes.Add(ctx, 1, metric.WithAttributes(attrElection.String(e.Election), attrNode.String(e.NodeID),
			attrTransition.String("elected")))
	case base.EventUnelected:
		m.changes.Add(ctx, 1, metric.WithAttributes(attrElection.String(e.Election), attrNode.String(e.NodeID),
			attrTransition.String("unelected"), attrReason.String(e.Event.Reason.String())))
	case base.EventSubscribeError:
		m.feedFails.Add(ctx, 1, metric.WithAttributeSet(m.attrs(e.Election, e.NodeID)))
	}
}

// lookup returns the observed Feed of election and node, or nil.
func (m *Metrics) lookup(election, node string) *observed {
	if v, ok := m.feeds.Load(feedKey{election, node}); ok {
		return v.(*observed)
	}
	return nil
}

// attrs returns the attribute set of election and node: the observed
// Feed's, or a new one for a Feed that is not observed.
func (m *Metrics) attrs(election, node string) attribute.Set {
	if o := m.lookup(election, node); o != nil {
		return o.attrs
	}
	return attribute.NewSet(attrElection.String(election), attrNode.String(node))
}

// withOutcome returns the attributes of a claim or renewal of election and
// node whose store call returned err.
func (m *Metrics) withOutcome(election, node string, err error) metric.MeasurementOption {
	oc := outcome(err)
	o := m.lookup(election, node)
	if o == nil {
		return metric.WithAttributes(attrElection.String(election), attrNode.String(node), attrOutcome.String(oc))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.outcomes {
		if s.outcome == oc {
			return metric.WithAttributeSet(s.attrs)
		}
	}
	s := attribute.NewSet(attrElection.String(election), attrNode.String(node), attrOutcome.String(oc))
	o.outcomes = append(o.outcomes, outcomeSet{oc, s})
	return metric.WithAttributeSet(s)
}
