package mongo

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// v2Collection is the driver.Collection of the official driver v2. Its
// behaviour against a real server is written from the server's and the
// driver's documentation; the tests run it against a server only when
// LEADERFEED_MONGO_URL is set (CI has none).
type v2Collection struct {
	db *mongodrv.Database
	// coll is the caller's collection with primary reads, majority read
	// concern and majority write concern: the election's reads and writes
	// never use a weaker setting of the caller's client, database or
	// collection (a write acknowledged by the primary alone can be rolled
	// back on failover, and then one revision could be handed out twice).
	coll *mongodrv.Collection
}

var _ driver.Collection = (*v2Collection)(nil)

func newV2Collection(coll *mongodrv.Collection) *v2Collection {
	return &v2Collection{
		db: coll.Database(),
		coll: coll.Clone(options.Collection().
			SetWriteConcern(writeconcern.Majority()).
			SetReadConcern(readconcern.Majority()).
			SetReadPreference(readpref.Primary())),
	}
}

func (c *v2Collection) DatabaseName() string { return c.db.Name() }
func (c *v2Collection) Name() string         { return c.coll.Name() }

// Server error codes the adapter tells apart (from the server's
// error_codes.yml).
const (
	codeUserNotFound       = 11
	codeUnauthorized       = 13
	codeAuthFailed         = 18
	codeNamespaceExists    = 48
	codeCommandNotFound    = 59
	codeCappedPositionLost = 136
	codeInvalidResumeToken = 260
	codeChangeStreamFatal  = 280
	codeHistoryLost        = 286
	codeObjectTooLarge     = 10334
)

// hasCode reports whether err is a server error with one of codes.
func hasCode(err error, codes ...int) bool {
	var se mongodrv.ServerError
	if !errors.As(err, &se) {
		return false
	}
	return slices.ContainsFunc(codes, se.HasErrorCode)
}

// classify wraps err with the driver sentinel it stands for, if any.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mongodrv.ErrNoDocuments):
		return fmt.Errorf("%w: %w", driver.ErrNoDocument, err)
	case mongodrv.IsDuplicateKeyError(err):
		return fmt.Errorf("%w: %w", driver.ErrDuplicateKey, err)
	case hasCode(err, codeCappedPositionLost, codeInvalidResumeToken, codeChangeStreamFatal, codeHistoryLost):
		return fmt.Errorf("%w: %w", driver.ErrHistoryLost, err)
	case hasCode(err, codeObjectTooLarge):
		return fmt.Errorf("%w: %w", driver.ErrEventTooLarge, err)
	case hasCode(err, codeUnauthorized):
		return fmt.Errorf("%w: %w", driver.ErrUnauthorized, err)
	case hasCode(err, codeAuthFailed, codeUserNotFound):
		return fmt.Errorf("%w: %w", driver.ErrAuthFailed, err)
	}
	return err
}

func (c *v2Collection) Hello(ctx context.Context) (bson.Raw, error) {
	hello, err := c.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil && hasCode(err, codeCommandNotFound) { // server older than 4.4.2
		hello, err = c.db.RunCommand(ctx, bson.D{{Key: "isMaster", Value: 1}}).Raw()
	}
	return hello, err
}

func (c *v2Collection) Exists(ctx context.Context) (bool, error) {
	names, err := c.db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: c.coll.Name()}})
	return slices.Contains(names, c.coll.Name()), err
}

func (c *v2Collection) Create(ctx context.Context) error {
	err := c.db.CreateCollection(ctx, c.coll.Name())
	if hasCode(err, codeNamespaceExists) {
		return nil
	}
	return err
}

func (c *v2Collection) FindOne(ctx context.Context, id string) (bson.Raw, error) {
	raw, err := c.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	return raw, classify(err)
}

func (c *v2Collection) FindOneAndUpdate(ctx context.Context, filter, update bson.D, upsert bool) (bson.Raw, error) {
	opts := options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(upsert)
	raw, err := c.coll.FindOneAndUpdate(ctx, filter, update, opts).Raw()
	return raw, classify(err)
}

func (c *v2Collection) DeleteOne(ctx context.Context, id string) error {
	_, err := c.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	return classify(err)
}

func (c *v2Collection) Find(ctx context.Context, filter bson.D) ([]bson.Raw, error) {
	cur, err := c.coll.Find(ctx, filter)
	if err != nil {
		return nil, classify(err)
	}
	return readAll(ctx, cur)
}

func readAll(ctx context.Context, cur *mongodrv.Cursor) ([]bson.Raw, error) {
	defer func() { _ = cur.Close(context.WithoutCancel(ctx)) }()
	var docs []bson.Raw
	for cur.Next(ctx) {
		docs = append(docs, slices.Clone(cur.Current))
	}
	return docs, classify(cur.Err())
}

// UpdateBatch runs the bulk write and the find in one causally consistent
// session: with majority write and read concern, the find then reads the
// bulk write's effects (read your writes).
func (c *v2Collection) UpdateBatch(ctx context.Context, ops []driver.UpdateOp, ids []string) (driver.BatchResult, error) {
	models := make([]mongodrv.WriteModel, len(ops))
	for i, op := range ops {
		models[i] = mongodrv.NewUpdateOneModel().SetFilter(op.Filter).SetUpdate(op.Update).SetUpsert(op.Upsert)
	}
	sess, err := c.db.Client().StartSession(options.Session().SetCausalConsistency(true))
	if err != nil {
		return driver.BatchResult{}, err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	res := driver.BatchResult{Errs: make([]error, len(ops))}
	err = mongodrv.WithSession(ctx, sess, func(ctx context.Context) error {
		_, err := c.coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
		var bwe mongodrv.BulkWriteException
		switch {
		case err == nil:
		case errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0:
			// Only some ops failed: the others are applied and majority
			// committed.
			for _, we := range bwe.WriteErrors {
				if we.Index < 0 || we.Index >= len(ops) {
					return fmt.Errorf("bulk write: error of op %d in a batch of %d: %w", we.Index, len(ops), we)
				}
				res.Errs[we.Index] = classify(we)
			}
		default:
			return classify(err)
		}
		cur, err := c.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return classify(err)
		}
		res.Docs, err = readAll(ctx, cur)
		return err
	})
	if err != nil {
		return driver.BatchResult{}, err
	}
	return res, nil
}

func (c *v2Collection) Watch(ctx context.Context, resumeAfter bson.Raw) (driver.Stream, error) {
	// The logic filters in the client, as on lungo: one code path for both.
	opts := options.ChangeStream().SetFullDocument(options.UpdateLookup)
	if resumeAfter != nil {
		opts.SetResumeAfter(resumeAfter)
	}
	cs, err := c.coll.Watch(ctx, mongodrv.Pipeline{}, opts)
	if err != nil {
		return nil, classify(err)
	}
	return &v2Stream{cs: cs}, nil
}

// v2Stream reads with TryNext, so that an empty batch comes back and the
// resume token (the batch's postBatchResumeToken) can be kept while the
// collection is idle: a stream reopened after a long quiet time then
// resumes from a recent position, not from one the oplog may have lost.
type v2Stream struct{ cs *mongodrv.ChangeStream }

func (s *v2Stream) Next(ctx context.Context) (bson.Raw, error) {
	if s.cs.TryNext(ctx) {
		return slices.Clone(s.cs.Current), nil
	}
	if err := s.cs.Err(); err != nil {
		return nil, classify(err)
	}
	if s.cs.ID() == 0 { // the server closed the cursor
		return nil, driver.ErrStreamEnded
	}
	return nil, nil
}

func (s *v2Stream) ResumeToken() bson.Raw           { return s.cs.ResumeToken() }
func (s *v2Stream) Close(ctx context.Context) error { return s.cs.Close(ctx) }
