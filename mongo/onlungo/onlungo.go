// Package onlungo runs the MongoDB backend (package
// github.com/leaderfeed/leaderfeed/mongo) on lungo's in-process engine
// (github.com/256dpi/lungo v0.4.0), a MongoDB-compatible store with change
// streams: for tests and examples that have no MongoDB server, and for
// programs whose nodes all live in one process. It proves nothing about
// several processes.
//
// It is a module of its own, so that a service importing only package mongo
// gets neither lungo nor the deprecated driver v1 (which lungo uses) in its
// go.sum.
//
//	client, engine, err := lungo.Open(ctx, lungo.Options{Store: lungo.NewMemoryStore()})
//	...
//	defer engine.Close()
//	b, err := onlungo.New(client.Database("app"), "scheduler", mongo.Options{})
//
// or, for many elections on one change stream,
//
//	store, err := onlungo.NewStore(client.Database("app"), mongo.Options{})
//	els, err := base.NewElections(store, base.ElectionsOptions{})
//
// The backend's logic is the same code that runs on the official driver v2;
// only this adapter differs. Where lungo differs from a real server, the
// adapter keeps to what both do: it watches with an empty pipeline (lungo
// panics on any other) and the backend filters in the client; it passes only
// options lungo supports or ignores; lungo has no hello command, always has
// change streams and no write concerns, so Start always passes.
package onlungo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/256dpi/lungo"
	v1bson "go.mongodb.org/mongo-driver/bson"
	v1mongo "go.mongodb.org/mongo-driver/mongo"
	v1options "go.mongodb.org/mongo-driver/mongo/options"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/mongo/internal/driver"
)

// NewStore returns the store of the collection Options.Collection of db, a
// database of lungo's in-process engine (lungo.Open): a backend.Store and
// backend.BatchStore for any number of elections. The caller owns the engine
// and closes it; the store never does. lungo's adapter of the real driver
// (*lungo.MongoDatabase) is refused: use package mongo with a driver-v2
// client for a real server.
func NewStore(db lungo.IDatabase, opts mongo.Options) (*mongo.Store, error) {
	if db == nil {
		return nil, fmt.Errorf("mongo: %w: nil database", base.ErrInvalidConfig)
	}
	if _, isDriver := db.(*lungo.MongoDatabase); isDriver {
		return nil, fmt.Errorf("mongo: %w: onlungo is for lungo's in-process engine; for a server use mongo.New with a go.mongodb.org/mongo-driver/v2 client",
			base.ErrInvalidConfig)
	}
	name := opts.Collection
	if name == "" {
		name = mongo.DefaultCollection
	}
	s, err := driver.NewStore(Collection(db, name), opts)
	if err != nil {
		return nil, err
	}
	return s.(*mongo.Store), nil
}

// New returns the backend of the one election named election on lungo:
// base.Open on a NewStore of its own, which closing the backend closes.
func New(db lungo.IDatabase, election string, opts mongo.Options) (backend.Election, error) {
	if err := heartbeat.ValidateName("election name", election); err != nil {
		return nil, fmt.Errorf("mongo: %w: %w", base.ErrInvalidConfig, err)
	}
	s, err := NewStore(db, opts)
	if err != nil {
		return nil, err
	}
	b, err := base.Open(s, election)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("mongo: %w", err)
	}
	return b, nil
}

// collection is the driver.Collection of lungo.
type collection struct {
	db   lungo.IDatabase
	coll lungo.ICollection
}

// Collection returns the adapter of the collection name of db.
func Collection(db lungo.IDatabase, name string) driver.Collection {
	return &collection{db: db, coll: db.Collection(name)}
}

func (c *collection) DatabaseName() string { return c.db.Name() }
func (c *collection) Name() string         { return c.coll.Name() }

// Hello answers as a replica set member: lungo has no hello command and
// always supports change streams. Its localTime is this process's clock,
// the clock lungo's $currentDate reads.
func (c *collection) Hello(context.Context) (bson.Raw, error) {
	return bson.Marshal(bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "lungo"},
		{Key: "localTime", Value: bson.NewDateTimeFromTime(time.Now())}})
}

func (c *collection) Exists(ctx context.Context) (bool, error) {
	names, err := c.db.ListCollectionNames(ctx, v1bson.D{{Key: "name", Value: c.coll.Name()}})
	for _, n := range names {
		if n == c.coll.Name() {
			return true, err
		}
	}
	return false, err
}

// Create creates the collection; lungo's create is idempotent.
func (c *collection) Create(ctx context.Context) error {
	return c.db.CreateCollection(ctx, c.coll.Name())
}

func (c *collection) FindOne(ctx context.Context, id string) (bson.Raw, error) {
	raw, err := c.coll.FindOne(ctx, v1bson.D{{Key: "_id", Value: id}}).Raw()
	return bson.Raw(raw), classify(err)
}

func (c *collection) FindOneAndUpdate(ctx context.Context, filter, update bson.D, upsert bool) (bson.Raw, error) {
	f, err := v1(filter)
	if err != nil {
		return nil, err
	}
	u, err := v1(update)
	if err != nil {
		return nil, err
	}
	opts := v1options.FindOneAndUpdate().SetReturnDocument(v1options.After).SetUpsert(upsert)
	raw, err := c.coll.FindOneAndUpdate(ctx, f, u, opts).Raw()
	return bson.Raw(raw), classify(err)
}

func (c *collection) DeleteOne(ctx context.Context, id string) error {
	_, err := c.coll.DeleteOne(ctx, v1bson.D{{Key: "_id", Value: id}})
	return classify(err)
}

func (c *collection) Find(ctx context.Context, filter bson.D) ([]bson.Raw, error) {
	f, err := v1(filter)
	if err != nil {
		return nil, err
	}
	cur, err := c.coll.Find(ctx, f)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = cur.Close(context.WithoutCancel(ctx)) }()
	var docs []bson.Raw
	for cur.Next(ctx) {
		var doc v1bson.Raw
		if err := cur.Decode(&doc); err != nil {
			return nil, err
		}
		docs = append(docs, bson.Raw(append([]byte(nil), doc...)))
	}
	return docs, classify(cur.Err())
}

// UpdateBatch runs one unordered bulk write, then one find: lungo's engine
// is in-process and serializes its transactions, so the find reads the
// bulk write's effects.
func (c *collection) UpdateBatch(ctx context.Context, ops []driver.UpdateOp, ids []string) (driver.BatchResult, error) {
	models := make([]v1mongo.WriteModel, len(ops))
	for i, op := range ops {
		f, err := v1(op.Filter)
		if err != nil {
			return driver.BatchResult{}, err
		}
		u, err := v1(op.Update)
		if err != nil {
			return driver.BatchResult{}, err
		}
		models[i] = v1mongo.NewUpdateOneModel().SetFilter(f).SetUpdate(u).SetUpsert(op.Upsert)
	}
	res := driver.BatchResult{Errs: make([]error, len(ops))}
	_, err := c.coll.BulkWrite(ctx, models, v1options.BulkWrite().SetOrdered(false))
	var wes v1mongo.WriteErrors
	switch {
	case err == nil:
	case errors.As(err, &wes):
		for _, we := range wes {
			if we.Index < 0 || we.Index >= len(ops) {
				return driver.BatchResult{}, fmt.Errorf("bulk write: error of op %d in a batch of %d: %w", we.Index, len(ops), err)
			}
			res.Errs[we.Index] = classify(we)
		}
	default:
		return driver.BatchResult{}, classify(err)
	}
	res.Docs, err = c.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return driver.BatchResult{}, err
	}
	return res, nil
}

func (c *collection) Watch(ctx context.Context, resumeAfter bson.Raw) (driver.Stream, error) {
	opts := v1options.ChangeStream().SetFullDocument(v1options.UpdateLookup)
	if resumeAfter != nil {
		opts.SetResumeAfter(v1bson.Raw(resumeAfter))
	}
	s, err := c.coll.Watch(ctx, v1mongo.Pipeline{}, opts) // lungo panics on a non-empty pipeline
	if err != nil {
		return nil, classify(err)
	}
	return &stream{s: s}, nil
}

// stream blocks in Next until an event or the end: lungo has no batches.
type stream struct{ s lungo.IChangeStream }

func (s *stream) Next(ctx context.Context) (bson.Raw, error) {
	if !s.s.Next(ctx) {
		if err := s.s.Err(); err != nil {
			return nil, classify(err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, driver.ErrStreamEnded // lungo's engine was closed
	}
	var ev v1bson.Raw
	if err := s.s.Decode(&ev); err != nil {
		return nil, err
	}
	return bson.Raw(ev), nil
}

func (s *stream) ResumeToken() bson.Raw {
	if t := s.s.ResumeToken(); t != nil {
		return bson.Raw(append([]byte(nil), t...))
	}
	return nil
}

func (s *stream) Close(ctx context.Context) error { return s.s.Close(ctx) }

// classify wraps err with the driver sentinel it stands for, if any.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, v1mongo.ErrNoDocuments):
		return fmt.Errorf("%w: %w", driver.ErrNoDocument, err)
	case lungo.IsUniquenessError(err):
		return fmt.Errorf("%w: %w", driver.ErrDuplicateKey, err)
	case errors.Is(err, lungo.ErrLostOplogPosition), strings.Contains(err.Error(), "unable to resume change stream"):
		return fmt.Errorf("%w: %w", driver.ErrHistoryLost, err)
	}
	return err
}

// v1 converts a document of the v2 driver's BSON into one lungo takes.
func v1(doc any) (v1bson.Raw, error) {
	raw, err := bson.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("mongo: %w", err)
	}
	return v1bson.Raw(raw), nil
}
