package driver

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ErrWriteConflict: a write in a transaction met a write of the same
// document that committed after the transaction's snapshot, or that
// another transaction holds (server code 112 WriteConflict). The server
// aborts the transaction; the error carries the TransientTransactionError
// label, so a driver's WithTransaction runs its callback again.
var ErrWriteConflict = errors.New("write conflict")

// Transactions is implemented by a Collection whose store runs
// multi-document transactions, for the fence (mongo.Store.Fence). Its
// operations, and those of the Collection given the same ctx, run in the
// transaction of ctx's session.
type Transactions interface {
	// InTransaction reports whether ctx carries a session of this
	// collection's client with a transaction in progress.
	InTransaction(ctx context.Context) bool
	// UpdateInTransaction applies update to the one document matching
	// filter in ctx's transaction. ErrNoDocument when nothing matched,
	// ErrWriteConflict when the document was written after the
	// transaction's snapshot or is held by another transaction.
	UpdateInTransaction(ctx context.Context, filter, update bson.D) error
	// AbortTransaction aborts ctx's transaction, so that nothing of it
	// can commit, also when ctx is done (it is the ctx the caller gave:
	// lungo recognizes its own session context only).
	AbortTransaction(ctx context.Context) error
}
