// Package basetest is the conformance suite every leaderfeed backend must
// pass. A backend's test runs it in one line:
//
//	func TestConformance(t *testing.T) { basetest.Run(t, harness) }
//
// Each case states the rule it checks in one sentence, so that a failure
// tells a backend author what to fix. The suite has two parts: the backend
// contract (compare-and-set, ordering of the feed, errors, lifecycle) and
// scenarios that run several base.Feed nodes on the backend and check, with
// a leadership-interval checker, that no two nodes ever lead at once.
//
// The nodes of a Cluster sit behind base/faulty's fault-injecting wrapper.
// LEADERFEED_TEST_SCALE (ScaleEnv) stretches every timing of the suite for
// a slow machine or store; safety is checked as strictly at every scale.
package basetest

import (
	"context"
	"testing"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Harness tells the suite how to reach the store under test and what it can
// do. Only Open is required; a nil function is a capability the harness
// lacks, and the cases that need it are skipped with a message naming it.
type Harness struct {
	// Open returns a new, not yet started backend for the election named
	// election. All backends that one Run opens must share one store, so
	// that several nodes of one election meet. The suite uses a fresh
	// election name for every case, and Closes every backend it opens.
	Open func(t *testing.T, election string) (backend.Election, error)

	// OpenStore returns a new, not yet started Store on the same table as
	// Open's backends (a backend.BatchStore if the backend can batch). When
	// set, the suite checks the Store contract: many elections on one
	// Elections, one changefeed for all of them, independence of
	// elections, and batched writes. The suite closes every Store it opens.
	OpenStore func(t *testing.T) (backend.Store, error)

	// Timing is used by the Feed scenarios. Zero fields take the values of
	// FastTiming.
	Timing heartbeat.Timing

	// PutOther inserts or replaces the record with key in the table that the
	// backends of election watch, and DeleteOther deletes it. The suite
	// checks that they arrive as OtherChanged notifications. doc is a
	// JSON-able object without the key.
	PutOther    func(ctx context.Context, election, key string, doc map[string]any) error
	DeleteOther func(ctx context.Context, election, key string) error

	// WriteMalformed writes, with a client of its own, a record under the
	// election's key that the backend cannot decode or that breaks the
	// record rules. The suite checks that Get reports ErrMalformedRecord,
	// that the feed reports it as Ignored and goes on, and that a Feed
	// survives it.
	WriteMalformed func(ctx context.Context, election string) error

	// Invalid lists constructor calls with unsafe names or impossible
	// options, by a description. Each must fail with an error matching
	// base.ErrInvalidConfig and return no backend.
	Invalid map[string]func() (backend.Election, error)

	// SerializedWrites says that the harness serializes the backend's
	// writes because the store under test does not execute them atomically
	// (reqlite). The suite then notes that its concurrency cases prove
	// nothing about atomicity.
	SerializedWrites bool
}
