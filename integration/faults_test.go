//go:build linux

package integration

import (
	"context"
	"testing"
)

// configFor returns the configuration of a fault test: 50 faults of each
// kind (5 with -short), or LEADERFEED_SOAK faults in all.
func configFor(t *testing.T, kinds []string) config {
	cfg := defaultConfig(kinds)
	switch n := soakFaults(t); {
	case n > 0:
		cfg.perKind = (n + len(kinds) - 1) / len(kinds)
	case testing.Short():
		cfg.perKind = 5
	}
	return cfg
}

// TestFaultsPostgres runs five node processes against a private PostgreSQL
// server and injects every kind of fault.
func TestFaultsPostgres(t *testing.T) {
	srv := startPG(t)
	h := newHarness(t, srv, configFor(t, allKinds))
	h.run(context.Background())
}
