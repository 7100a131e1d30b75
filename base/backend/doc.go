// Package backend is the contract between leaderfeed's engine (package
// base) and the stores it runs on: what a backend implements and what it
// reports.
//
// A backend implements Store: one table (or collection) of election
// records keyed by election name, a compare-and-set write of one record,
// and the table's changefeed, which reports each committed change as a
// Notification. Optional capabilities are interfaces discovered by type
// assertion, as in database/sql/driver: BatchStore (many writes in one
// round trip), BatchReader (many reads in one), PresenceStore
// (participants, for transfers and priorities) and PresenceBatchStore
// (many presence refreshes in one round trip).
//
// A Feed runs on an Election, one election's view of a Store;
// base.Elections and base.Open make Elections from a Store, sharing its
// changefeed and batching its writes. Election's optional capabilities,
// Aligner, Submitter and PresenceElection, are what those Elections
// offer; a wrapper of an Election (base/faulty) forwards each of them.
//
// The record rules (names, sizes, lease units, decoding of stored
// records, batch checks) are in package heartbeat. docs/EXTENDING.md walks
// through writing a backend; base/basetest checks one against the
// contract.
package backend
