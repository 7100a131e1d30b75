package onlungo

import (
	"context"

	"github.com/256dpi/lungo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

var _ driver.Transactions = (*collection)(nil)

// inTransaction is what lungo's session context has: lungo finds the
// session by a context key of its own, which no other package can read,
// so only the context its WithTransaction (or WithSession) hands the
// callback is recognized, not one derived from it.
type inTransaction interface {
	Transaction() *lungo.Transaction
}

// InTransaction reports whether ctx is a lungo session context with a
// transaction in progress. lungo runs one write transaction at a time
// (every write waits for it), so a fence on lungo orders a claim after
// the transaction the simple way.
func (c *collection) InTransaction(ctx context.Context) bool {
	sc, ok := ctx.(inTransaction)
	return ok && sc.Transaction() != nil
}

func (c *collection) UpdateInTransaction(ctx context.Context, filter, update bson.D) error {
	f, err := v1(filter)
	if err != nil {
		return err
	}
	u, err := v1(update)
	if err != nil {
		return err
	}
	res, err := c.coll.UpdateOne(ctx, f, u)
	if err != nil {
		return classify(err)
	}
	if res.MatchedCount == 0 {
		return driver.ErrNoDocument
	}
	return nil
}

func (c *collection) AbortTransaction(ctx context.Context) error {
	if sc, ok := ctx.(lungo.ISessionContext); ok {
		return sc.AbortTransaction(ctx)
	}
	return nil
}
