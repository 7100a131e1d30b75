package mongo

import (
	"context"
	"errors"
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// fieldFence counts the fenced transactions that committed on an
// election's document: the fence's write ($inc) is what makes a
// transaction conflict with any later write of the record. Heartbeats
// never set it; the record ignores it, and the change stream drops the
// events of writes that changed nothing else (fenceOnly).
const fieldFence = "fence"

// codeWriteConflict is the server's WriteConflict (error_codes.yml).
const codeWriteConflict = 112

// Fence makes the transaction of ctx's session commit before any later
// claim, handover or vacancy of election, or fails. ctx must carry a
// session of the store's client with a transaction in progress (the
// context Session.WithTransaction hands its callback; on lungo, the
// lungo.ISessionContext itself); without one, Fence fails with an error
// matching base.ErrInvalidConfig, since a fence outside a transaction
// guards nothing.
//
// In the transaction, Fence increments the field "fence" of the
// election's document where the document names a leader in term: the
// transaction then holds the document until it ends, so every later
// write of the record (a claim, a renewal, a handover) waits for it, and
// the transaction cannot commit once a write of the record committed
// after its snapshot. When the document names another term, no leader,
// or is missing, Fence aborts the transaction (its commit then fails:
// nothing of it commits) and returns an error matching base.ErrFenced
// that names the election, the term asked and the term found. When the
// document was written after the transaction's snapshot, or is held by
// another transaction (a new term, or a renewal of this one), the server
// aborts the transaction with a write conflict: Fence returns an error
// matching base.ErrFenced that wraps the server's error, which carries
// the TransientTransactionError label, so WithTransaction runs the
// callback again in a new transaction, whose fence meets the present
// record.
//
// The fence's write is an update of the election document that the
// store's change stream drops (it changes no field of the record), so
// readers see no event for it; it does cost an oplog entry, and each
// watching store a change event to read. The server ends a transaction
// older than transactionLifetimeLimitSeconds (60 s by default), which
// bounds how long a frozen client can hold up the next claim. Keep
// fenced transactions short: the document they hold holds off the
// leader's own renewals too. It needs a replica set or a sharded cluster
// of MongoDB 4.0 or later (transactions), as the change stream does.
//
// It fails with an error matching base.ErrInvalidConfig when election
// breaks heartbeat.ValidateName or term is 0 or above math.MaxInt64.
func (s *Store) Fence(ctx context.Context, election string, term uint64) error {
	if err := s.check(ctx, fmt.Sprintf("election %q: fence", election)); err != nil {
		return err
	}
	return fence(ctx, s.coll, election, term, s.opError)
}

// Fence is Store.Fence for a program that holds no Store (its election
// made with New): opts are the Options given to New, which name the
// collection of db.
func Fence(ctx context.Context, db *mongodrv.Database, opts Options, election string, term uint64) error {
	if db == nil {
		return fmt.Errorf("mongo: %w: nil database", base.ErrInvalidConfig)
	}
	name := opts.Collection
	if name == "" {
		name = DefaultCollection
	}
	if err := validateNames(db.Name(), name); err != nil {
		return err
	}
	opError := func(ctx context.Context, what string, err error) error {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			return fmt.Errorf("mongo: %s: %w (%v)", what, cerr, err)
		}
		return fmt.Errorf("mongo: %s: %w", what, err)
	}
	return fence(ctx, newV2Collection(db.Collection(name)), election, term, opError)
}

func fence(ctx context.Context, c driver.Collection, election string, term uint64,
	opError func(ctx context.Context, what string, err error) error) error {
	if err := validElection(election); err != nil {
		return err
	}
	if term == 0 || term > math.MaxInt64 {
		return fmt.Errorf("mongo: election %q: fence: term %d is no leader's term: %w", election, term, base.ErrInvalidConfig)
	}
	tc, ok := c.(driver.Transactions)
	if !ok {
		return fmt.Errorf("mongo: election %q: fence: this store has no transactions: %w", election, backend.ErrUnsupported)
	}
	if !tc.InTransaction(ctx) {
		return fmt.Errorf("mongo: election %q: fence: ctx carries no session with a transaction in progress "+
			"(call Fence with the context Session.WithTransaction hands its callback): %w", election, base.ErrInvalidConfig)
	}
	filter := bson.D{
		{Key: "_id", Value: election},
		{Key: fieldMark, Value: int32(1)},
		{Key: fieldTerm, Value: int64(term)},
		{Key: fieldLeader, Value: bson.D{{Key: "$ne", Value: ""}}},
	}
	update := bson.D{{Key: "$inc", Value: bson.D{{Key: fieldFence, Value: int64(1)}}}}
	err := tc.UpdateInTransaction(ctx, filter, update)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, driver.ErrWriteConflict):
		return fmt.Errorf("mongo: election %q: fence: term %d asked, term found unknown: the record was written after this "+
			"transaction's snapshot or another transaction holds it (a new term, or a renewal of this one; the server aborted "+
			"the transaction, retry in a new one): %w: %w", election, term, base.ErrFenced, err)
	case errors.Is(err, driver.ErrNoDocument):
		found := foundTerm(ctx, c, election)
		_ = tc.AbortTransaction(ctx)
		return fmt.Errorf("mongo: election %q is fenced: term %d asked, %s: %w", election, term, found, base.ErrFenced)
	}
	return opError(ctx, fmt.Sprintf("election %q: fence", election), err)
}

// foundTerm says what the document of election holds, as the
// transaction of ctx sees it.
func foundTerm(ctx context.Context, c driver.Collection, election string) string {
	raw, err := c.FindOne(ctx, election)
	if errors.Is(err, driver.ErrNoDocument) {
		return "no record found"
	}
	if err != nil {
		return fmt.Sprintf("term found unknown (reading it failed: %v)", err)
	}
	r, err := decodeRecord(raw, election)
	switch {
	case err != nil:
		return fmt.Sprintf("a malformed record found (%v)", err)
	case r.Vacant():
		return fmt.Sprintf("term %d found with no leader", r.Term)
	}
	return fmt.Sprintf("term %d found (leader %q)", r.Term, r.Leader)
}

// fenceOnly reports whether ev is the event of a fence's write: an
// update that set the fence counter and nothing else.
func fenceOnly(ev *changeEvent) bool {
	if ev.OperationType != "update" {
		return false
	}
	d := ev.UpdateDescription
	fields, err := d.UpdatedFields.Elements()
	if err != nil || len(fields) != 1 || fields[0].Key() != fieldFence {
		return false
	}
	removed, err := d.RemovedFields.Values()
	return err == nil && len(removed) == 0
}

// InTransaction reports whether ctx carries a session of this client with
// a transaction in progress.
func (c *v2Collection) InTransaction(ctx context.Context) bool {
	sess := mongodrv.SessionFromContext(ctx)
	return sess != nil && sess.Client() == c.db.Client() && sess.TransactionRunning()
}

// UpdateInTransaction runs one UpdateOne in ctx's transaction (which sets
// its own read and write concern: the driver leaves the collection's out).
func (c *v2Collection) UpdateInTransaction(ctx context.Context, filter, update bson.D) error {
	res, err := c.coll.UpdateOne(ctx, filter, update)
	switch {
	case err != nil && hasCode(err, codeWriteConflict):
		return fmt.Errorf("%w: %w", driver.ErrWriteConflict, err)
	case err != nil:
		return classify(err)
	case res.MatchedCount == 0:
		return driver.ErrNoDocument
	}
	return nil
}

// AbortTransaction aborts ctx's transaction, also when ctx is done: the
// server must learn of it to free what the transaction holds.
func (c *v2Collection) AbortTransaction(ctx context.Context) error {
	sess := mongodrv.SessionFromContext(ctx)
	if sess == nil {
		return nil
	}
	return sess.AbortTransaction(context.WithoutCancel(ctx))
}
