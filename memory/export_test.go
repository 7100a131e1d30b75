package memory

import (
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Test hooks, compiled into the package's tests only: they write as a
// foreign client would, which the public API never does.

// WriteRaw stores r under r.Election as a foreign client would: without
// compare-and-set and without validation. Tests use it to plant malformed
// records; subscribers see the record, or an Ignored notification if it
// breaks the record rules.
func (db *DB) WriteRaw(r heartbeat.Record) {
	db.mu.Lock()
	defer db.mu.Unlock()
	r = r.Clone()
	db.records[r.Election] = r
	db.publishRecord(r)
}

// DeleteRecord deletes the record of election, as a foreign client would.
func (db *DB) DeleteRecord(election string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if _, ok := db.records[election]; !ok {
		return
	}
	delete(db.records, election)
	db.publish(backend.Notification{Type: backend.RecordDeleted, Election: election, Record: heartbeat.Record{Election: election}})
}
