// Package base is the election of leaderfeed: Feed, one node in one
// election; Store, the contract a backend implements (a table of any
// number of elections and its changefeed); Elections, which shares a Store
// among the elections of a process; and Backend, the view of one election
// that a Feed uses. It knows no database; the backends (packages memory,
// postgres, mongo and rethink, or one of your own) do.
//
// # Using a Feed
//
// Make a backend for the election's name, then a Feed for this node on it,
// and hand the work only the leader may do to Run:
//
//	b, err := postgres.New(pool, "scheduler", postgres.Options{})
//	feed, err := base.New(b, nodeID, base.Options{Value: []byte(myAddr)})
//	err = feed.Run(ctx, func(ctx context.Context, term uint64) error {
//		return work(ctx, term) // until ctx is done
//	})
//
// Run starts the Feed, which campaigns, leads, renews, steps down and
// campaigns again; it runs the function each time the node is elected,
// under a context that ends with that leadership, and when its own
// context ends it cancels the work, waits for it, and stops the Feed,
// which hands leadership over at once. Feed.Run says what it does when the
// function fails or panics.
//
// A program that needs more calls Start and Stop itself and reads events.
// Feed.Subscribe gives each reader its own subscription from that moment
// on (subscribe before Start to miss none): every event, in order, but
// change events beyond Options.MaxPendingChanges waiting for that reader,
// which are dropped and counted (Subscription.Dropped). Feed.Events is one
// subscription that lasts as long as the Feed. Nothing a reader does or
// fails to do delays the Feed or Stop: Stop never waits for a reader, and
// returns within its context. An unread subscription holds one goroutine
// and bounded memory until its context ends or it is closed; one whose
// reader falls maxPendingEvents behind is ended (ErrSlowReader).
//
// The work only the leader may do runs under the leader context of its
// term (the context Run passes, Event.LeaderCtx of EventElected, or
// Feed.LeaderContext), which is cancelled the moment leadership ends,
// context.Cause saying why (ErrResigned, ErrDeposed, ErrLeaseExpired,
// ErrStopped, ErrTransferred), and passes the term (Event.Term, Feed.Term)
// to what it writes, as a fencing token. Feed.Resign hands over at once and
// goes on as a follower; Feed.Proclaim publishes a new value; Feed.Leader
// returns the last record seen; Options.ObserveOnly makes a feed that
// follows but never campaigns.
//
// # Transfer, participants and priorities
//
// With Options.Participate a node keeps a presence record in the store
// (one write per PresenceInterval), and Feed.Participants lists the live
// ones, judged by the store's clock. Feed.TransferTo hands leadership to a
// live participant: the leader steps down first, then writes a vacancy
// reserved for the target (heartbeat.Record.Successor), which the target
// claims at once and every other node only after its election timeout. A
// participating leader that sees a live participant of higher
// Options.Priority for Options.PriorityHysteresis transfers to it; equal
// priorities never transfer.
//
// # Many elections
//
// A process with many elections (one per partition or tenant, say) makes
// one Store for the table and one Elections on it, and gets a Feed per
// election from it:
//
//	store, err := postgres.NewStore(pool, postgres.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{}) // owns store
//	feed, err := els.Feed("partition-7", nodeID, base.Options{})
//
// The Store's one changefeed serves every election: Elections opens it
// once, hands each election the notifications of its record (queued and
// coalesced to the latest in this package, once for every backend) and every election the
// changes of other records. When the Store is a BatchStore, the renewals
// of elections with the same heartbeat interval fall on two instants per
// interval (half of the elections each, by name) and are written in one
// batch an instant, so a leading process makes two writes per interval
// (one more per ElectionsOptions.MaxBatch elections an instant); each
// write of a batch is the compare-and-set of a single one. A batched claim
// or renewal needs no goroutine of its own. Batches are sent each on its
// own goroutine (a bounded number in flight) and every write ends at its
// own deadline: a write that hangs holds up no other election's. When the
// Store is a BatchReader, elections that read at once (every one does when
// the shared changefeed failed) read their records in one batch.
// Elections gives out one Backend per election at a time.
// Stop the Feeds before closing the Elections: closing it closes the
// Store and ends every Feed on it with ErrClosed, without handing over.
//
// One election is the same with one member: Open(store, election) returns
// its Backend on an Elections of its own, without batching, and closing
// the Backend (the Feed does when it stops) closes the Store. The
// backends' New functions do that.
//
// # What is guaranteed
//
// These hold on every backend that passes the conformance suite of package
// basetest, provided every node of an election uses a node id of its own
// and no other program writes the election record. Nodes may use different
// Timings: every record carries its writer's LeaseDuration (Record.Lease),
// and a follower waits for the longer of its own ElectionTimeoutMin and
// heartbeat.FollowerWait of that lease.
//
//   - At most one leader at any instant. A leader counts itself leader only
//     until LeaseDuration after it sent its last renewal that succeeded; a
//     follower claims only after it has seen no new revision for
//     ElectionTimeoutMin, which is longer. So the old leader has stepped
//     down, on its own clock, before any claim can be sent.
//   - Every write is a compare-and-set on the record's identity (revision,
//     leader and term), executed atomically by the store: of many
//     concurrent claimants exactly one wins, and a deposed leader's renewal
//     fails and makes it step down, even on a store that handed one
//     revision out twice.
//   - The term increases strictly each time leadership is won, also when
//     the same node wins again, and is kept in a vacant record.
//   - The leader context is cancelled before anything else when leadership
//     ends: before the vacant record is written on Resign and Stop, when a
//     record naming another leader or a conflict is seen, and at the end of
//     the lease when renewals fail (EventUnelected with ReasonLeaseExpired).
//   - A clean Resign or Stop writes a vacant record, which the followers
//     claim at once (after a jitter of at most Timing.VacancyJitter); a
//     crashed leader is replaced within the election timeout. A transfer's
//     vacancy is claimed at once by its target only; if the target is dead,
//     another node claims it within the election timeout.
//   - The node is never deaf: a failed changefeed is reported and reopened
//     with backoff, forever, and while it is down the node reads the record
//     every heartbeat interval.
//
// # Clocks
//
// Clocks need not be synchronised: each node judges its lease and its
// election timeout on its own monotonic clock, and the store's Timestamp
// is for observers only. Safety assumes that clocks run at about the same
// rate: the margin is ElectionTimeoutMin-LeaseDuration (0.5 s with the
// default timing, and at least a tenth of ElectionTimeoutMin, which
// heartbeat.Timing.Validate requires), and it must cover the difference in
// elapsed time between two machines over one election timeout, plus
// scheduling delays. A paused
// process is fine: on waking, a leader finds its lease over before it
// renews. A clock that jumps (wall-clock adjustments) is fine too, as
// monotonic readings do not jump.
//
// # During a partition
//
// Nodes never talk to each other; each talks only to the store, which is
// the only authority. A leader cut off from the store keeps leading until
// its lease ends and then steps down, whether or not the others can reach
// the store; it cannot resign, so the others take over after their election
// timeout. Followers cut off from the store cannot claim and report errors
// (EventError, EventSubscribeError) until they reach it again; they never
// lead meanwhile. If nobody reaches the store, nobody leads. The guarantees
// rest on the store: a store that loses acknowledged writes (a failover
// that rolls them back) can let two nodes win the same revision. Use the
// settings of your database under which an acknowledged write is durable.
//
// # What the fencing token protects
//
// The leader context tells the leader's work to stop, but it cannot stop a
// write that is already on its way, or one that a paused process sends when
// it wakes. The term protects against those: a resource that remembers the
// highest term it has seen and refuses lower ones (for example a row with
// a term column and UPDATE ... WHERE term <= $term) never accepts a write
// from a deposed leader once the new leader has written. It protects only
// resources that check it, and it does not order the writes of one term.
// See examples/leaderonly.
//
// # What is not guaranteed
//
//   - That the leader's work has stopped at the instant the lease ends: the
//     leader context is cancelled then, and the work must watch it.
//   - That followers see every intermediate revision: a slow changefeed may
//     deliver only the latest record.
//   - Anything when another program writes the election record, or when two
//     nodes share a node id.
//   - Mixed timings while some nodes run a version from before records
//     carried the lease (they write no lease and ignore it).
//
// # When the store refuses
//
// A backend wraps with ErrRefused the errors that retrying cannot fix: a
// missing privilege, wrong credentials, a missing database or table, a
// table of another shape. The message gives the cause and the fix (a
// GRANT, or how to make the schema). Start fails with such an error. While
// running, a Feed logs the first refusal at Error and then at most a
// summary a minute (not once per retry), reports it in Health (Healthy
// fails at once: "store refuses (for D): ..."), passes it to the Trace
// hooks (errors.Is(info.Err, ErrRefused)), and retries that kind of call
// (writes, reads, the changefeed) only every refusalRetry, so that a fix
// applied later is picked up without a restart. A refused renewal is a
// failed renewal: the leader steps down at the end of its lease. Run
// returns the refusal instead of running on.
//
// # Writing a backend
//
// A backend implements Store: six methods, with the election as a key of
// Get and Heartbeat and one Subscribe for the whole table, which sends raw
// changes and neither queues nor coalesces them. It may implement
// BatchStore too (HeartbeatBatch), to renew many elections in one round
// trip, BatchReader (GetBatch), to read many in one, and PresenceStore (Present, Absent, Participants), for
// participants, transfers and priorities. It does not implement Backend: Elections and Open provide it.
// docs/EXTENDING.md explains the contract method by method and builds a
// complete backend, and basetest.Run (with Harness.OpenStore set) checks
// that a backend keeps it.
package base
