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
func (s *Store) WriteRaw(r heartbeat.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r = r.Clone()
	s.records[r.Election] = r
	s.publishRecord(r)
}

// DeleteRecord deletes the record of election, as a foreign client would.
func (s *Store) DeleteRecord(election string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.records[election]; !ok {
		return
	}
	delete(s.records, election)
	s.publish(backend.Notification{Type: backend.RecordDeleted, Election: election, Record: heartbeat.Record{Election: election}})
}
