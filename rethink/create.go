package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// The real-server paths of this file (the system tables, table.wait(), the
// "primary replica ... not available" answers) are written from
// RethinkDB's documentation of its system tables and of table_create,
// db_create, wait and the durability options, and from the failures
// measured on a real RethinkDB 2.4.4; no real server could run in the
// environment this was written in. CI runs them on reqlite, which has
// empty system tables and lacks wait, status and config: there Create
// takes the name-based path (createByName) and says so at Debug level.
// plan_test.go runs the convergence loop against a fake catalog that
// behaves like the real server (racing creates that both succeed,
// ambiguous names, drops by id).

const (
	// maxCreateRounds bounds the list-decide-act rounds of one converge,
	// and the converges of one settle. A race of any number of creators
	// needs at most: create database, drop duplicate databases, create
	// table, drop duplicate tables, done; the rest is room for creators
	// that come late.
	maxCreateRounds = 16
	// retryMin and retryMax bound the pause between tries of Create after
	// a transient error (the table not ready yet, as after a restart).
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
	// settleRounds bounds how often create lists the catalog again after
	// the table is ready, looking for duplicates made by late creators.
	settleRounds = 3
)

// errNoSystemTables means that the server's system tables do not describe
// its databases (reqlite: db_config is always empty) or may not be read
// (a user without the admin permission).
var errNoSystemTables = errors.New("system tables not available")

// catalog is what converge needs from the server. serverCatalog is the
// real one; plan_test.go has a fake.
type catalog interface {
	// list returns the rows of db_config named db and the rows of
	// table_config (ids, not names, in "db") of those databases. It
	// returns errNoSystemTables when the system tables are of no use.
	list(ctx context.Context) ([]dbRow, []tableRow, error)
	// createDB and createTable create by name; "already exists" is no
	// error.
	createDB(ctx context.Context) error
	createTable(ctx context.Context) error
	// dropDB and dropTable drop by id through the system tables; the
	// error says why when the outcome is dropFailed.
	dropDB(ctx context.Context, id string) (dropOutcome, error)
	dropTable(ctx context.Context, id string) (dropOutcome, error)
	// waitReady waits until the table, named by its database's name and
	// its own, is ready for writes.
	waitReady(ctx context.Context) error
}

// converge runs plan against c until there is exactly one database and
// one table, and returns the table's row. Every action is followed by a
// new listing, so a process that comes late, or finds duplicates left by
// others (a deployment broken before this code existed), resolves them the
// same way.
func converge(ctx context.Context, c catalog, log *slog.Logger, db, table string, create bool) (tableRow, error) {
	for range maxCreateRounds {
		dbs, tables, err := c.list(ctx)
		if err != nil {
			return tableRow{}, err
		}
		s := plan(db, table, dbs, tables, create)
		switch s.Action {
		case actDone:
			return s.Table, nil
		case actMissing:
			return tableRow{}, fmt.Errorf("rethink: %w: %w: %s does not exist and NoCreate is set; fix: let Create make it (NoCreate unset), or create it as admin",
				base.ErrRefused, base.ErrInvalidConfig, s.What)
		case actRefuse:
			return tableRow{}, fmt.Errorf("rethink: create: %w: %s", base.ErrInvalidConfig, s.What)
		case actCreateDB:
			err = c.createDB(ctx)
		case actCreateTable:
			err = c.createTable(ctx)
			if err != nil && strings.Contains(err.Error(), "does not exist") {
				// Another process dropped the database listed since the
				// listing: list again.
				log.Debug("rethink: the database changed while creating the table; listing again", "database", db, "err", err)
				err = nil
			}
		case actDropDBs, actDropTables:
			err = drop(ctx, c, log, s, db, table)
		}
		if ambiguous(err) {
			// A late creator made a duplicate since the listing.
			log.Debug("rethink: duplicates appeared since the listing; listing again", "database", db, "table", table, "err", err)
			err = nil
		}
		if err != nil {
			return tableRow{}, err
		}
	}
	return tableRow{}, fmt.Errorf("rethink: create: %s.%s: no single database and table after %d rounds of creating and dropping duplicates", db, table, maxCreateRounds)
}

// drop drops the duplicates of step s, in its order. A duplicate already
// dropped by another process is skipped; the first failure ends the round
// with its error.
func drop(ctx context.Context, c catalog, log *slog.Logger, s step, db, table string) error {
	for _, id := range s.Drop {
		var (
			out dropOutcome
			err error
		)
		if s.Action == actDropDBs {
			out, err = c.dropDB(ctx, id)
		} else {
			out, err = c.dropTable(ctx, id)
		}
		switch out {
		case dropped:
			if s.Action == actDropDBs {
				log.Warn("rethink: duplicate database dropped", "database", db, "id", id, "kept", s.Keep)
			} else {
				log.Warn("rethink: duplicate table dropped", "table", db+"."+table, "id", id, "kept", s.Keep)
			}
		case alreadyGone:
			log.Debug("rethink: duplicate already dropped by another process", "database", db, "table", table, "id", id)
		default:
			return fmt.Errorf("rethink: create: dropping the duplicate %s of %s.%s (keeping %s): %w", id, db, table, s.Keep, err)
		}
	}
	return nil
}

// Create makes sure that exactly one database and one table of the
// configured names exist, creating what is missing unless
// Options.NoCreate is set, and waits until the table is ready for writes.
// It is idempotent and safe to run from many processes at once.
//
// On a real RethinkDB, concurrent creators can make duplicate databases or
// tables of one name (see plan.go); Create lists them in the system tables
// rethinkdb.db_config and rethinkdb.table_config, keeps the same one in
// every process and drops the others by id (a drop by name would be
// ambiguous), logging each drop at Warn. Duplicates left by an earlier
// run are resolved the same way, so a deployment broken by them heals on
// the next Create. An answer "ambiguous" to any step that names the
// database or table means such duplicates: Create lists and converges
// again (the package documentation says how processes that start together
// end up). This needs read and write access to the system tables (the
// admin user); without it Create warns and works by name only.
//
// What a dropped duplicate held is lost, and that is safe: while two
// tables (or databases) share a name, every query naming it fails as
// ambiguous, so no election record is read or written in either of them
// until the duplicates are gone. A record can only be in a dropped table
// if it was written while that table was the only one of its name, that
// is, if a creator's create call was still in flight when another process
// had already finished Create and started writing, a window of one create
// round trip. Losing such a record cannot make two leaders: every write is
// a compare-and-set on the revision, leader and term of what Get returns
// from the kept table, so a leader whose record vanished gets a conflict
// on its next renewal (or errors until its lease ends) and steps down, and
// a follower claims only with a compare-and-set on the kept table, after
// its own election timeout, which is longer than any lease. What can be
// lost is the term count: running nodes claim with one more than the
// highest term they ever saw, so the term still grows, but a node that
// starts later and never saw the dropped record may start again from the
// kept table's lower term. A resource fenced by the term then refuses that
// leader's lower term: safe, but it stalls that resource until the term
// passes the lost one.
//
// Create also checks the table's configuration: the primary key must be
// "id" (ErrInvalidConfig otherwise); durability "soft" and write_acks
// "single" are logged at Warn (the election writes ask for hard durability
// themselves, which overrides the table's setting; write_acks cannot be
// overridden per write). A server that answers that the table's primary
// replica is not available (a real server does for about a second after a
// restart) is waited for: Create retries with a short backoff until ctx
// ends or tableReadyTimeout has passed.
func (s *Store) Create(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	start := time.Now()
	pause := retryMin
	for {
		err := s.create(ctx)
		switch {
		case err == nil:
			return nil
		case unavailable(err):
			s.log.Debug("rethink: table not ready, retrying", "database", s.db, "table", s.table, "err", err)
		case ambiguous(err):
			// Only the name-based path gets here (settle resolves
			// duplicates itself): it cannot drop them, but another
			// process's Create may, and a server that only seemed to lack
			// system tables is listed again.
			s.log.Debug("rethink: duplicate databases or tables, retrying", "database", s.db, "table", s.table, "err", err)
		default:
			return err
		}
		if time.Since(start)+pause > tableReadyTimeout {
			if ambiguous(err) {
				return fmt.Errorf("rethink: create: %s.%s: duplicate databases or tables of these names remained for %v; Create drops duplicates only through the system tables, which need the admin user",
					s.db, s.table, tableReadyTimeout)
			}
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return s.wrap(ctx, "create", err)
		case <-s.closeCtx.Done():
			t.Stop()
			return s.wrap(ctx, "create", err)
		}
		pause = min(2*pause, retryMax)
	}
}

// create is one try of Create.
func (s *Store) create(ctx context.Context) error {
	c := &serverCatalog{s: s}
	row, err := settle(ctx, c, s.log, s.db, s.table, !s.noCreate)
	if errors.Is(err, errNoSystemTables) {
		if err := s.createByName(ctx); err != nil {
			return err
		}
		return c.waitReady(ctx)
	}
	if err != nil {
		return err
	}
	checkDurability(s.log, s.db, s.table, row)
	return nil
}

// settle runs converge, checks the primary key and waits until the table is
// ready; then it lists the catalog again, and stops when two listings
// agree: a creator whose create call was still in flight may have added a
// duplicate meanwhile, and the listing resolves it now rather than at the
// next Create. A wait answered "ambiguous" met such a duplicate: settle
// lists and converges again. It returns errNoSystemTables as converge
// does.
func settle(ctx context.Context, c catalog, log *slog.Logger, db, table string, create bool) (tableRow, error) {
	prev := ""
	ready := 0
	for range maxCreateRounds {
		row, err := converge(ctx, c, log, db, table, create)
		if err != nil {
			return tableRow{}, err
		}
		if row.PrimaryKey != fieldID {
			return tableRow{}, fmt.Errorf("rethink: %w: %w: table %s.%s has the primary key %q; leaderfeed needs %q (name another table)",
				base.ErrRefused, base.ErrInvalidConfig, db, table, row.PrimaryKey, fieldID)
		}
		err = c.waitReady(ctx)
		if ambiguous(err) {
			log.Debug("rethink: duplicates appeared since the listing; listing again", "database", db, "table", table, "err", err)
			continue
		}
		if err != nil {
			return tableRow{}, err
		}
		ready++
		if row.ID == prev || ready > settleRounds {
			return row, nil
		}
		prev = row.ID
	}
	return tableRow{}, fmt.Errorf("rethink: create: %s.%s: duplicates kept appearing after %d listings", db, table, maxCreateRounds)
}

// checkDurability warns about a table configuration that may lose
// acknowledged writes.
func checkDurability(log *slog.Logger, db, table string, row tableRow) {
	if row.Durability == "soft" {
		// The election record's writes ask for durability "hard", which
		// overrides the table's setting, so the election is safe; the
		// application's own documents in the table are not.
		log.Warn("rethink: table durability is soft; election writes use hard durability, other writes may be lost on a crash",
			"table", db+"."+table, "durability", row.Durability)
	}
	var acks string
	if json.Unmarshal(row.WriteAcks, &acks) == nil && acks == "single" {
		// A write acknowledged by one replica can be lost when another
		// replica becomes primary: a deposed leader's claim could vanish.
		// Harmless with one replica per shard.
		log.Warn("rethink: table acknowledges writes on a single replica; with several replicas an acknowledged election write can be lost on failover",
			"table", db+"."+table, "write_acks", acks)
	}
}

// createByName is Create on a server whose system tables do not describe
// its databases (reqlite, or a user who may not read them): check and
// create by name, then check the primary key with table.info(). It cannot
// see or resolve duplicates, and cannot read the durability settings.
func (s *Store) createByName(ctx context.Context) error {
	if err := s.ensure(ctx, "database", s.db, r.DBList().Contains(s.db), r.DBCreate(s.db)); err != nil {
		return err
	}
	db := r.DB(s.db)
	if err := s.ensure(ctx, "table", s.db+"."+s.table, db.TableList().Contains(s.table), db.TableCreate(s.table)); err != nil {
		return err
	}
	raw, err := s.run(ctx, "create: reading the table info", s.term().Info().Field("primary_key"))
	if err != nil {
		return err
	}
	var pk string
	if err := json.Unmarshal(raw, &pk); err != nil || pk != fieldID {
		return fmt.Errorf("rethink: %w: %w: table %s.%s has the primary key %s; leaderfeed needs %q (name another table)",
			base.ErrRefused, base.ErrInvalidConfig, s.db, s.table, raw, fieldID)
	}
	return nil
}

// ensure checks with exists whether a database or table exists and creates
// it with create if allowed. A concurrent creator winning the race is fine.
func (s *Store) ensure(ctx context.Context, what, name string, exists, create r.Term) error {
	raw, err := s.run(ctx, "create: looking for "+what+" "+name, exists)
	if err != nil {
		return err
	}
	if string(raw) == "true" {
		return nil
	}
	if s.noCreate {
		return fmt.Errorf("rethink: %w: %w: %s %s does not exist and NoCreate is set; fix: let Create make it (NoCreate unset), or create it as admin",
			base.ErrRefused, base.ErrInvalidConfig, what, name)
	}
	return s.runCreate(ctx, what, name, create)
}

// runCreate runs a dbCreate or tableCreate; "already exists" (a concurrent
// creator was first) is no error.
func (s *Store) runCreate(ctx context.Context, what, name string, create r.Term) error {
	if _, err := s.run(ctx, "create: creating "+what+" "+name, create); err != nil {
		if strings.Contains(err.Error(), "already exists") && ctx.Err() == nil {
			return nil
		}
		return err
	}
	return nil
}

// notImplemented reports the answers of servers without table.wait()
// (reqlite): a response type the driver does not know, or "not
// implemented".
func notImplemented(err error) bool {
	var derr r.RQLDriverError
	if errors.As(err, &derr) && strings.Contains(err.Error(), "Unexpected response type: 0") {
		return true
	}
	return strings.Contains(err.Error(), "has not been implemented")
}

// unavailable reports the answer of a real server whose table has no
// primary replica yet, for about a second after a restart: "Primary
// replica for shard ... not available". It is transient: the table is
// there and will serve again.
func unavailable(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "primary replica") && strings.Contains(s, "not available")
}

// ambiguousName is how RethinkDB 2.4 words its answer to a query naming a
// database or table that has duplicates.
var ambiguousName = regexp.MustCompile("(Database `[^`]+` is ambiguous; there are multiple databases|" +
	"Table `[^`]+` is ambiguous; there are multiple tables) with that name")

// ambiguous reports the answer of a real server to a query naming a
// database or table that has duplicates: an operation failure (the
// driver's RQLOpFailedError) worded as ambiguousName. Create takes it as
// "duplicates exist: list and converge"; nil is not ambiguous.
func ambiguous(err error) bool {
	var opf r.RQLOpFailedError
	return errors.As(err, &opf) && ambiguousName.MatchString(opf.Error())
}

// serverCatalog is the catalog of the server s talks to.
type serverCatalog struct{ s *Store }

var systemDB = r.DB("rethinkdb")

func (c *serverCatalog) list(ctx context.Context) ([]dbRow, []tableRow, error) {
	s := c.s
	// Ask by name first: a database that exists when db_config is read
	// afterwards is listed there (drops keep one of each name). The other
	// order would take a database created between the two reads for a
	// server without system tables, and go the name-based way.
	raw, err := s.run(ctx, "create: looking for database "+s.db, r.DBList().Contains(s.db))
	if err != nil {
		return nil, nil, err
	}
	if string(raw) != "true" {
		return nil, nil, nil
	}
	raw, err = s.run(ctx, "create: reading rethinkdb.db_config",
		systemDB.Table("db_config").Filter(func(row r.Term) r.Term { return row.Field("name").Eq(s.db) }).CoerceTo("array"))
	if err != nil {
		if permissionDenied(err) {
			s.log.Warn("rethink: cannot read the system tables; duplicate databases and tables cannot be resolved and durability is not checked",
				"database", s.db, "table", s.table, "err", err)
			return nil, nil, errNoSystemTables
		}
		return nil, nil, err
	}
	var dbs []dbRow
	if err := json.Unmarshal(raw, &dbs); err != nil {
		return nil, nil, fmt.Errorf("rethink: create: cannot decode rethinkdb.db_config rows %.200s: %w", raw, err)
	}
	if len(dbs) == 0 {
		s.log.Debug("rethink: the system tables do not list the database (reqlite?); duplicate and durability checks skipped",
			"database", s.db, "table", s.table)
		return nil, nil, errNoSystemTables
	}
	ids := make([]any, len(dbs))
	for i, d := range dbs {
		ids[i] = d.ID
	}
	raw, err = s.run(ctx, "create: reading rethinkdb.table_config",
		systemDB.Table("table_config", r.TableOpts{IdentifierFormat: "uuid"}).
			Filter(func(row r.Term) r.Term { return r.Expr(ids).Contains(row.Field("db")) }).
			Pluck("id", "name", "db", "primary_key", "durability", "write_acks").
			CoerceTo("array"))
	if err != nil {
		return nil, nil, err
	}
	var tables []tableRow
	if err := json.Unmarshal(raw, &tables); err != nil {
		return nil, nil, fmt.Errorf("rethink: create: cannot decode rethinkdb.table_config rows %.200s: %w", raw, err)
	}
	return dbs, tables, nil
}

func (c *serverCatalog) createDB(ctx context.Context) error {
	return c.s.runCreate(ctx, "database", c.s.db, r.DBCreate(c.s.db))
}

func (c *serverCatalog) createTable(ctx context.Context) error {
	return c.s.runCreate(ctx, "table", c.s.db+"."+c.s.table, r.DB(c.s.db).TableCreate(c.s.table))
}

func (c *serverCatalog) dropDB(ctx context.Context, id string) (dropOutcome, error) {
	return c.dropRow(ctx, "db_config", id)
}

func (c *serverCatalog) dropTable(ctx context.Context, id string) (dropOutcome, error) {
	return c.dropRow(ctx, "table_config", id)
}

// dropRow deletes the row id of a system table, which drops the database
// or table it describes.
func (c *serverCatalog) dropRow(ctx context.Context, sys, id string) (dropOutcome, error) {
	raw, err := c.s.run(ctx, "create: dropping "+sys+" row "+id, systemDB.Table(sys).Get(id).Delete())
	var res deleteResult
	if err == nil {
		if uerr := json.Unmarshal(raw, &res); uerr != nil {
			err = fmt.Errorf("cannot decode the result %.200s: %w", raw, uerr)
		}
	}
	out := classifyDrop(res, err)
	if out == dropFailed && err == nil {
		err = fmt.Errorf("%s row %s: %s (result %.200s)", sys, id, res.FirstError, raw)
	}
	return out, err
}

// waitReady waits until the table is ready for writes. reqlite lacks
// table.wait(); its tables are always ready.
func (c *serverCatalog) waitReady(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, tableReadyTimeout)
	defer cancel()
	_, err := c.s.run(wctx, "create: waiting for the table", c.s.term().Wait(r.WaitOpts{WaitFor: "ready_for_writes"}))
	if err != nil && !notImplemented(err) {
		return err
	}
	return nil
}

// permissionDenied reports RethinkDB's answer to a user without the
// permission a query needs (only admin may read the system tables).
func permissionDenied(err error) bool {
	return strings.Contains(err.Error(), "does not have the required")
}
