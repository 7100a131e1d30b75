// Package base is the election of leaderfeed: Feed, one node in one
// election, and Elections, which shares one store among the elections of a
// process. It knows no database: a backend (package memory, postgres, mongo
// or rethink, or one of your own) implements the contract of package
// base/backend, and base does the rest (timers, leases, retries, reopening a
// broken changefeed, events, batching).
//
// Make a backend for the election's name, a Feed for this node on it, and
// hand the work only the leader may do to Run:
//
//	b, err := postgres.New(pool, "scheduler", postgres.Options{})
//	feed, err := base.New(b, nodeID, base.Options{Value: []byte(myAddr)})
//	err = feed.Run(ctx, func(ctx context.Context, term uint64) error {
//		return work(ctx, term) // until ctx is done; term is the fencing token
//	})
//
// Run waits for a store that is not up yet, campaigns, runs the function
// each time the node is elected, under a context cancelled the moment
// leadership ends (context.Cause says why), and when its own context ends
// stops the work and the Feed, which hands leadership over at once. Node
// ids must be unique per process. A program that needs more calls Start and Stop
// itself, reads events (Subscribe), and uses Resign, Proclaim, TransferTo
// and Participants.
//
// A process with many elections makes one store for the table and one
// Elections on it, and gets a Feed per election from it; they share one
// changefeed, and their renewals are batched:
//
//	store, err := postgres.NewStore(pool, postgres.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{}) // owns store
//	feed, err := els.Feed("partition-7", nodeID, base.Options{})
//
// Guaranteed on every backend that passes the conformance suite (package
// basetest), if every node has an id of its own and nothing else writes the
// election record: at most one leader at any instant, each node judging its
// lease on its own monotonic clock (clocks need not be synchronised, only
// run at about the same rate); every write a compare-and-set on the
// record's identity; a term that increases strictly each time leadership is
// won (a fencing token); the leader context cancelled before anything else
// when leadership ends; a clean Resign or Stop handed over at once, a
// crashed leader replaced within the election timeout; a broken changefeed
// reopened forever, the record polled meanwhile. Not guaranteed: safety on
// a store that loses acknowledged writes, nor that the leader's work has
// stopped when its lease ends (it must watch its context, and what it
// writes should check the term).
//
// The argument for these is the comment on claimDue in machine.go. The
// README of the repository has complete programs; docs/USING.md,
// docs/OPERATING.md, docs/SAFETY.md and docs/EXTENDING.md (writing a
// backend) say the rest.
package base
