package otelmetrics_test

// BenchmarkScrape measures what docs/METRICS.md reports: the size of one
// scrape of many elections run through one Elections and one Metrics,
// and the heap the metrics cost.
//
//	go test -run '^$' -bench Scrape -benchtime 20x -scrapeout /tmp/NAME.txt ./otelmetrics/

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
	"github.com/leaderfeed/leaderfeed/otelmetrics"
)

var (
	scrapeElections = flag.Int("scrape-elections", 1000, "elections of BenchmarkScrape")
	scrapeOut       = flag.String("scrapeout", "", "BenchmarkScrape: write the scrape, in Prometheus text format, to this file (NAME is replaced by the benchmark's name)")
)

// forward is a Trace that hands every call to the Trace set last, or to
// none: the Feeds outlive the Metrics, so that the heap is measured with
// and without it under the same Feeds.
type forward struct{ to atomic.Pointer[base.Trace] }

func (fw *forward) trace() *base.Trace {
	return &base.Trace{
		ClaimDone: func(c base.ClaimInfo) {
			if t := fw.to.Load(); t != nil {
				t.ClaimDone(c)
			}
		},
		RenewDone: func(r base.RenewInfo) {
			if t := fw.to.Load(); t != nil {
				t.RenewDone(r)
			}
		},
		Event: func(e base.EventInfo) {
			if t := fw.to.Load(); t != nil {
				t.Event(e)
			}
		},
	}
}

// heapAlloc returns the least of ten readings of the live heap over two
// heartbeat intervals, and their spread: the Feeds' own heap grows while
// a batch of renewals is in flight, and the least reading is between
// batches.
func heapAlloc(interval time.Duration) (least, spread uint64) {
	var hs []uint64
	for i := range 10 {
		if i > 0 {
			time.Sleep(interval / 5)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		hs = append(hs, ms.HeapAlloc)
	}
	return slices.Min(hs), slices.Max(hs) - slices.Min(hs)
}

// BenchmarkScrape runs with the SDK's default exemplar filter (the
// histograms keep a reservoir of exemplars per point) and with exemplars
// off, which a process that traces nothing loses nothing by: the default
// filter keeps exemplars of sampled spans only.
func BenchmarkScrape(b *testing.B) {
	b.Run("exemplars=default", func(b *testing.B) { benchScrape(b) })
	off := sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter)
	b.Run("exemplars=off", func(b *testing.B) { benchScrape(b, off) })
	// The View of docs/METRICS.md that keeps the durations per node, not
	// per election.
	perNode := sdkmetric.WithView(sdkmetric.NewView(
		sdkmetric.Instrument{Name: "leaderfeed.*.duration"},
		sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter("leaderfeed.election")}))
	b.Run("exemplars=off/durations-per-node", func(b *testing.B) { benchScrape(b, off, perNode) })
}

func benchScrape(b *testing.B, opts ...sdkmetric.Option) {
	n := *scrapeElections
	store := memory.NewDB()
	els, err := base.NewElections(store.Conn(), base.ElectionsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer els.Close()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(append(opts, sdkmetric.WithReader(reader))...)
	m, err := otelmetrics.New(mp)
	if err != nil {
		b.Fatal(err)
	}
	fw := &forward{}
	fw.to.Store(m.Trace())
	tm := heartbeat.DefaultTiming()
	feeds := make([]*base.Feed, n)
	stops := make([]func(), n)
	for i := range feeds {
		f, err := els.Feed(fmt.Sprintf("election-%04d", i), "node-a", base.Options{Timing: tm, Trace: fw.trace()})
		if err != nil {
			b.Fatal(err)
		}
		if stops[i], err = m.Observe(f); err != nil {
			b.Fatal(err)
		}
		if err := f.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		feeds[i] = f
		defer f.Stop(context.Background())
	}
	deadline := time.Now().Add(time.Minute)
	for _, f := range feeds {
		for !f.IsLeader() {
			if time.Now().After(deadline) {
				b.Fatal("not every election has a leader after a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(3 * tm.HeartbeatInterval) // a few renewals each

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		b.Fatal(err)
	}
	points := 0
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			points += len(dataPoints(mt.Data))
		}
	}
	var text strings.Builder
	writeProm(&text, rm)
	if *scrapeOut != "" {
		if err := os.WriteFile(strings.ReplaceAll(*scrapeOut, "NAME", strings.ReplaceAll(b.Name(), "/", "_")), []byte(text.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}

	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := reader.Collect(context.Background(), &rm); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(points), "points")
	b.ReportMetric(float64(text.Len()), "prom-bytes")
	rm = metricdata.ResourceMetrics{}

	// The heap with the metrics, then without them: the Feeds run on.
	with, spread1 := heapAlloc(tm.HeartbeatInterval)
	fw.to.Store(nil)
	for _, stop := range stops {
		stop()
	}
	if err := mp.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	without, spread2 := heapAlloc(tm.HeartbeatInterval)
	b.ReportMetric(float64(int64(with)-int64(without))/(1<<10), "metrics-heap-KiB")
	b.ReportMetric(float64(int64(with)-int64(without))/float64(n), "metrics-heap-B/election")
	b.ReportMetric(float64(max(spread1, spread2))/(1<<10), "heap-spread-KiB")
}

// dataPoints returns the attribute sets of the points of data.
func dataPoints(data metricdata.Aggregation) []attribute.Set {
	var out []attribute.Set
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

// writeProm writes rm in the Prometheus text format, named as
// OpenTelemetry's Prometheus exporter names them (dots to underscores,
// the unit as a suffix, _total on counters), without the exporter's
// otel_scope_* labels and target_info.
func writeProm(w io.Writer, rm metricdata.ResourceMetrics) {
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			name := strings.ReplaceAll(mt.Name, ".", "_")
			if mt.Unit == "s" {
				name += "_seconds"
			}
			kind := "gauge"
			switch mt.Data.(type) {
			case metricdata.Sum[int64]:
				kind = "counter"
				name += "_total"
			case metricdata.Histogram[float64]:
				kind = "histogram"
			}
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, mt.Description, name, kind)
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					fmt.Fprintf(w, "%s%s %d\n", name, labels(p.Attributes), p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					fmt.Fprintf(w, "%s%s %d\n", name, labels(p.Attributes), p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					fmt.Fprintf(w, "%s%s %s\n", name, labels(p.Attributes), num(p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					var cum uint64
					for i, bound := range p.Bounds {
						cum += p.BucketCounts[i]
						fmt.Fprintf(w, "%s_bucket%s %d\n", name, labels(p.Attributes, "le", num(bound)), cum)
					}
					fmt.Fprintf(w, "%s_bucket%s %d\n", name, labels(p.Attributes, "le", "+Inf"), p.Count)
					fmt.Fprintf(w, "%s_sum%s %s\n", name, labels(p.Attributes), num(p.Sum))
					fmt.Fprintf(w, "%s_count%s %d\n", name, labels(p.Attributes), p.Count)
				}
			}
		}
	}
}

// labels formats s, and one more label if given, as Prometheus labels.
func labels(s attribute.Set, extra ...string) string {
	var kv []string
	for _, a := range s.ToSlice() {
		kv = append(kv, fmt.Sprintf("%s=%q", strings.ReplaceAll(string(a.Key), ".", "_"), a.Value.String()))
	}
	slices.Sort(kv)
	if len(extra) == 2 {
		kv = append(kv, fmt.Sprintf("%s=%q", extra[0], extra[1]))
	}
	return "{" + strings.Join(kv, ",") + "}"
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
