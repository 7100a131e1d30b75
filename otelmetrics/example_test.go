package otelmetrics_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/memory"
	"github.com/leaderfeed/leaderfeed/otelmetrics"
)

// One Metrics serves the Feeds of every election of the process: its
// Trace goes in the Options of each, and Observe adds each to the gauges.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	m, err := otelmetrics.New(mp)
	if err != nil {
		panic(err)
	}

	els, err := base.NewElections(memory.NewDB().Conn(), base.ElectionsOptions{})
	if err != nil {
		panic(err)
	}
	defer els.Close()
	opts := base.Options{Trace: m.Trace()}
	for _, name := range []string{"billing", "mailer", "scheduler"} {
		feed, err := els.Feed(name, "node-a", opts)
		if err != nil {
			panic(err)
		}
		stop, err := m.Observe(feed)
		if err != nil {
			panic(err)
		}
		defer stop()
		if err := feed.Start(context.Background()); err != nil {
			panic(err)
		}
		defer feed.Stop(context.Background())
		for !feed.IsLeader() {
			time.Sleep(time.Millisecond)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, mt := range rm.ScopeMetrics[0].Metrics {
		if mt.Name == "leaderfeed.leading" {
			for _, p := range mt.Data.(metricdata.Gauge[int64]).DataPoints {
				election, _ := p.Attributes.Value("leaderfeed.election")
				fmt.Println(election.AsString(), p.Value)
			}
		}
	}
	// Unordered output:
	// billing 1
	// mailer 1
	// scheduler 1
}
