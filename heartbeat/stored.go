package heartbeat

import (
	"fmt"
	"time"
)

// The rules of this file are the ones every store's encoding of a Record
// shares: the lease in whole microseconds, the numbers a store can hold,
// the fix-ups of records written by older versions, and the batch that
// names each election once. Backends convert their own types and keep
// their own type checks; they apply these rules through these functions
// only.

// MaxLeaseMicros is MaxLease in microseconds: the largest lease a stored
// record may hold.
const MaxLeaseMicros = int64(MaxLease / time.Microsecond)

// LeaseMicros returns lease in whole microseconds, rounded up, the unit in
// which stores keep it: a follower must never wait less than the writer's
// lease. A lease of 0 or less is 0; a lease Validate accepts gives at most
// MaxLeaseMicros.
func LeaseMicros(lease time.Duration) int64 {
	if lease <= 0 {
		return 0
	}
	us := int64(lease / time.Microsecond)
	if lease%time.Microsecond != 0 {
		us++ // not lease+999ns: that overflows near the longest Duration
	}
	return us
}

// LeaseFromMicros returns the lease stored as us microseconds, or an error
// matching ErrInvalidRecord when us is outside [0, MaxLeaseMicros].
func LeaseFromMicros(us int64) (time.Duration, error) {
	if us < 0 || us > MaxLeaseMicros {
		return 0, fmt.Errorf("%w: lease of %d µs is outside [0, %d] (MaxLease %v)", ErrInvalidRecord, us, MaxLeaseMicros, MaxLease)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// ValidateWrite checks a compare-and-set before a store sends it: next
// passes Validate, and every number the write stores or compares fits the
// largest integer the store holds exactly, maxInt (math.MaxInt64 for a
// 64-bit integer, 1<<53 for a double): next's term, expected's term, and
// expected's revision plus one, the revision the write stores. Errors
// match ErrInvalidRecord.
func ValidateWrite(expected, next Record, maxInt uint64) error {
	if err := next.Validate(); err != nil {
		return err
	}
	switch {
	case next.Term > maxInt:
		return fmt.Errorf("%w: term %d of election %q exceeds the store's largest integer (%d)", ErrInvalidRecord, next.Term, next.Election, maxInt)
	case expected.Term > maxInt:
		return fmt.Errorf("%w: expected term %d of election %q exceeds the store's largest integer (%d)", ErrInvalidRecord, expected.Term, next.Election, maxInt)
	case expected.Revision >= maxInt:
		return fmt.Errorf("%w: expected revision %d of election %q leaves no next revision within the store's largest integer (%d)", ErrInvalidRecord, expected.Revision, next.Election, maxInt)
	}
	return nil
}

// Stored holds the fields of an election record as a store keeps them,
// converted from the store's types but not yet checked: the input of
// Decode.
type Stored struct {
	Election  string
	Leader    string
	Term      int64
	Revision  int64
	Timestamp time.Time
	// Value is kept by Decode, not copied; empty reads as nil.
	Value []byte
	// LeaseMicros is the lease in microseconds (see LeaseMicros); nil when
	// the record has none: it was written before the field existed.
	LeaseMicros *int64
	// Successor is nil when the record has none: it was written before
	// the field existed.
	Successor *string
	// Handover is nil when the record has none: it was written before the
	// field existed.
	Handover *int64
	// Incarnation is nil when the record has none: it was written before
	// the field existed.
	Incarnation *int64
}

// Decode makes the Record of a stored election record, or returns an error
// matching ErrInvalidRecord when it breaks the rules: a negative term, a
// revision below 1, a lease outside [0, MaxLeaseMicros], a handover token
// or incarnation outside [0, MaxToken], or a record that fails Validate. A backend reports that error as a malformed record.
//
// It fixes up what older versions leave behind, so that their records
// still decode: a missing lease or successor reads as none; a vacant
// record's lease is dropped (an older writer's vacancy leaves the previous
// leader's lease in place, and refusing it would leave the election stuck
// on a record no compare-and-set overwrites); a led record's successor is
// dropped (an older writer's claim of a reserved vacancy leaves the
// successor in place); a vacant record's handover token and incarnation
// are dropped (an older writer's vacancy leaves them in place).
func Decode(s Stored) (Record, error) {
	switch {
	case s.Term < 0:
		return Record{}, fmt.Errorf("%w: term %d is negative", ErrInvalidRecord, s.Term)
	case s.Revision < 1:
		return Record{}, fmt.Errorf("%w: revision %d is not positive", ErrInvalidRecord, s.Revision)
	}
	r := Record{
		Election:  s.Election,
		Leader:    s.Leader,
		Term:      uint64(s.Term),
		Revision:  uint64(s.Revision),
		Timestamp: s.Timestamp,
	}
	if len(s.Value) > 0 {
		r.Value = s.Value
	}
	if s.LeaseMicros != nil {
		lease, err := LeaseFromMicros(*s.LeaseMicros)
		if err != nil {
			return Record{}, err
		}
		if r.Leader != "" {
			r.Lease = lease
		}
	}
	if s.Successor != nil && r.Leader == "" {
		r.Successor = *s.Successor
	}
	if s.Handover != nil {
		if *s.Handover < 0 || *s.Handover > MaxToken {
			return Record{}, fmt.Errorf("%w: handover token %d is outside [0, %d]", ErrInvalidRecord, *s.Handover, int64(MaxToken))
		}
		if r.Leader != "" {
			r.Handover = uint64(*s.Handover)
		}
	}
	if s.Incarnation != nil {
		if *s.Incarnation < 0 || *s.Incarnation > MaxToken {
			return Record{}, fmt.Errorf("%w: incarnation %d is outside [0, %d]", ErrInvalidRecord, *s.Incarnation, int64(MaxToken))
		}
		if r.Leader != "" {
			r.Incarnation = uint64(*s.Incarnation)
		}
	}
	if err := r.Validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// Batch indexes the elections of one batch of reads or writes by the
// position of their entry: a batch names each election at most once.
// Make one with make(Batch) per batch.
type Batch map[string]int

// Add admits entry i of the batch, of election: nil when election is a
// valid name (ValidateName) that no entry added before names, else an
// error matching ErrInvalidRecord, and entry i must fail alone.
func (b Batch) Add(election string, i int) error {
	if err := ValidateName("election name", election); err != nil {
		return err
	}
	if first, dup := b[election]; dup {
		return fmt.Errorf("%w: election %q is named by entries %d and %d of one batch; a batch names each election once", ErrInvalidRecord, election, first, i)
	}
	b[election] = i
	return nil
}
