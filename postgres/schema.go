package postgres

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leaderfeed/leaderfeed/base"
)

// createLockKey is the transaction-level advisory lock that serializes
// Create across processes ("LFCreate").
const createLockKey int64 = 0x4c46437265617465

// recordFunctionBody is the trigger function of the election table: three
// statement-level triggers (INSERT, UPDATE, DELETE) with transition tables
// call it, so that one statement that writes many records (a batch) sends
// them in a few notifications, each a chunk of records under the 8,000-byte
// payload limit: {"k":"b","s":schema,"t":table,"rs":[record, ...]}, a
// record being {"op","e","l","n","r","ts","v","ls","sc","h","i"}, or
// {"op","e","big"} when it does not fit in a notification, or
// {"op":"D","e"} for a deleted row. TG_ARGV[0] is the channel. A key longer
// than any valid election name cannot be an election of ours and is not
// announced, nor is a presence row (its key holds chr(31), see
// backend.PresenceKey): a participant's refresh wakes no follower.
const recordFunctionBody = `
DECLARE
  op text := left(TG_OP, 1);
  head text := '{"k":"b","s":' || to_json(TG_TABLE_SCHEMA::text)::text || ',"t":' || to_json(TG_TABLE_NAME::text)::text || ',"rs":[';
  lim int;
  buf text := '';
  item text;
  cur refcursor;
BEGIN
  lim := 7997 - octet_length(head);
  IF TG_OP = 'DELETE' THEN
    OPEN cur FOR SELECT json_build_object('op', 'D', 'e', o.election)::text
      FROM lf_old AS o WHERE octet_length(o.election) <= 1024 AND strpos(o.election, chr(31)) = 0;
  ELSIF TG_OP = 'INSERT' THEN
    OPEN cur FOR SELECT CASE WHEN octet_length(x.j) > lim THEN json_build_object('op', op, 'e', x.election, 'big', true)::text ELSE x.j END
      FROM (SELECT n.election, json_build_object('op', op, 'e', n.election, 'l', n.leader, 'n', n.term, 'r', n.revision,
              'ts', CASE WHEN isfinite(n.ts) THEN (extract(epoch FROM n.ts) * 1000000)::bigint END,
              'v', translate(encode(n.value, 'base64'), E'\n', ''), 'ls', n.lease_us, 'sc', n.successor, 'h', n.handover, 'i', n.incarnation)::text AS j
            FROM lf_new AS n WHERE octet_length(n.election) <= 1024 AND strpos(n.election, chr(31)) = 0) AS x;
  ELSE
    OPEN cur FOR SELECT y.item FROM (
        SELECT 0 AS g, json_build_object('op', 'D', 'e', o.election)::text AS item
          FROM lf_old AS o
         WHERE octet_length(o.election) <= 1024 AND strpos(o.election, chr(31)) = 0 AND NOT EXISTS (SELECT 1 FROM lf_new AS n WHERE n.election = o.election)
        UNION ALL
        SELECT 1, CASE WHEN octet_length(x.j) > lim THEN json_build_object('op', op, 'e', x.election, 'big', true)::text ELSE x.j END
          FROM (SELECT n.election, json_build_object('op', op, 'e', n.election, 'l', n.leader, 'n', n.term, 'r', n.revision,
                  'ts', CASE WHEN isfinite(n.ts) THEN (extract(epoch FROM n.ts) * 1000000)::bigint END,
                  'v', translate(encode(n.value, 'base64'), E'\n', ''), 'ls', n.lease_us, 'sc', n.successor, 'h', n.handover, 'i', n.incarnation)::text AS j
                FROM lf_new AS n WHERE octet_length(n.election) <= 1024 AND strpos(n.election, chr(31)) = 0) AS x
      ) AS y ORDER BY y.g;
  END IF;
  LOOP
    FETCH cur INTO item;
    EXIT WHEN NOT FOUND;
    IF buf <> '' AND octet_length(buf) + 1 + octet_length(item) > lim THEN
      PERFORM pg_notify(TG_ARGV[0], head || buf || ']}');
      buf := '';
    END IF;
    IF buf = '' THEN
      buf := item;
    ELSE
      buf := buf || ',' || item;
    END IF;
  END LOOP;
  CLOSE cur;
  IF buf <> '' THEN
    PERFORM pg_notify(TG_ARGV[0], head || buf || ']}');
  END IF;
  RETURN NULL;
END
`

// notifiedSetting is the transaction-local setting by which a statement
// tells the election table's triggers that it announced every row it wrote
// itself (ddl.announce): their WHEN (skipWhen) then skips the trigger
// function. A writer that sets it must announce its rows, or followers
// learn of them only by their own reads.
const notifiedSetting = "leaderfeed.notified"

// skipWhen is the WHEN condition of the election table's triggers: the
// statement's transaction did not set notifiedSetting.
const skipWhen = "current_setting('" + notifiedSetting + "', true) IS DISTINCT FROM 'on'"

// recordTriggers are the statement-level triggers of the election table:
// the suffix of their name (after ChannelPrefix), the event and the
// transition tables.
var recordTriggers = []struct{ suffix, event, referencing string }{
	{"_ins", "INSERT", "REFERENCING NEW TABLE AS lf_new"},
	{"_upd", "UPDATE", "REFERENCING OLD TABLE AS lf_old NEW TABLE AS lf_new"},
	{"_del", "DELETE", "REFERENCING OLD TABLE AS lf_old"},
}

// changeFunctionBody is the trigger function of a watched table: the row
// before and after as JSON and its primary key, or the key alone when that
// does not fit in a notification, or nothing but the operation when not even
// the key fits.
const changeFunctionBody = `
DECLARE
  cols text[];
  o json;
  n json;
  r json;
  k json;
  payload text;
BEGIN
  SELECT array_agg(a.attname::text ORDER BY x.ord) INTO cols
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS x(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum
   WHERE i.indrelid = TG_RELID AND i.indisprimary;
  IF TG_OP <> 'INSERT' THEN
    o := to_json(OLD);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    n := to_json(NEW);
  END IF;
  r := coalesce(n, o);
  IF cols IS NULL THEN
    k := NULL;
  ELSIF array_length(cols, 1) = 1 THEN
    k := r -> cols[1];
  ELSE
    SELECT json_object_agg(u.c, r -> u.c ORDER BY u.i) INTO k FROM unnest(cols) WITH ORDINALITY AS u(c, i);
  END IF;
  payload := json_build_object('k', 'c', 's', TG_TABLE_SCHEMA, 't', TG_TABLE_NAME,
    'op', left(TG_OP, 1), 'key', k, 'old', o, 'new', n)::text;
  IF octet_length(payload) >= 8000 THEN
    payload := json_build_object('k', 'c', 's', TG_TABLE_SCHEMA, 't', TG_TABLE_NAME,
      'op', left(TG_OP, 1), 'key', k, 'p', true)::text;
    IF octet_length(payload) >= 8000 THEN
      payload := json_build_object('k', 'c', 's', TG_TABLE_SCHEMA, 't', TG_TABLE_NAME,
        'op', left(TG_OP, 1), 'p', true)::text;
    END IF;
  END IF;
  PERFORM pg_notify(TG_NAME, payload);
  RETURN NULL;
END
`

// columns are the columns of the election table and their types as
// format_type prints them.
var columns = []struct{ name, typ, ddl string }{
	{"election", "text", "text PRIMARY KEY"},
	{"leader", "text", "text NOT NULL DEFAULT ''"},
	{"term", "bigint", "bigint NOT NULL DEFAULT 0"},
	{"revision", "bigint", "bigint NOT NULL"},
	{"ts", "timestamp with time zone", "timestamptz NOT NULL DEFAULT clock_timestamp()"},
	{"value", "bytea", "bytea NOT NULL DEFAULT ''::bytea"},
	{"lease_us", "bigint", "bigint NOT NULL DEFAULT 0"},
	{"successor", "text", "text NOT NULL DEFAULT ''"},
	{"handover", "bigint", "bigint NOT NULL DEFAULT 0"},
	{"incarnation", "bigint", "bigint NOT NULL DEFAULT 0"},
	// When a presence row's incarnation first wrote it; NULL in election
	// rows.
	{"joined", "timestamp with time zone", "timestamptz"},
}

// keyIndexColumn is the column of the key index, as pg_get_indexdef
// prints it: the election table's keys in byte order. An election's
// presence rows are a range of keys (keyRange), which the primary key
// serves only in a database whose default collation is C; in any other
// (en_US.UTF-8, what initdb usually gets) every read of the participants
// would scan the whole table.
const keyIndexColumn = `election COLLATE "C"`

// keyRange is the condition that t.election is the key of a presence row
// of the election named by the SQL expression name (election||chr(31)||
// node): a range of the key index.
func keyRange(name string) string {
	return `t.election COLLATE "C" >= ` + name + ` || chr(31) AND t.election COLLATE "C" < ` + name + ` || chr(32)`
}

func (d ddl) createKeyIndex() string {
	return "CREATE INDEX ON " + d.table + " (" + keyIndexColumn + ")"
}

// keyIndexExists is the condition that the table (an SQL string literal
// of its quoted name) has a btree index of keyIndexColumn alone, whole.
func keyIndexExists(table string) string {
	return "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(" + table + ") AND i.indpred IS NULL" +
		" AND pg_get_indexdef(i.indexrelid) LIKE '% USING btree (" + keyIndexColumn + ")')"
}

// addedColumns are the columns added after the first release: Create and
// SchemaSQL add them to a table made before (an existing row reads as
// having no lease, no successor, no handover token, no incarnation and,
// a presence row, no joined time).
var addedColumns = []string{"lease_us", "successor", "handover", "incarnation", "joined"}

func (d ddl) addColumns() []string {
	var out []string
	for _, c := range columns {
		if slices.Contains(addedColumns, c.name) {
			out = append(out, "ALTER TABLE "+d.table+" ADD COLUMN IF NOT EXISTS "+c.name+" "+c.ddl)
		}
	}
	return out
}

// ddl holds the statements that make what a Store needs. Every name in
// them is a validated identifier, quoted with pgx.Identifier.Sanitize.
type ddl struct {
	schema, table, recordFunc, changeFunc, trigger string
	channel                                        string // the channel as an SQL string literal
	head                                           string // the start of a notification of records, as an SQL string literal
	watch                                          string // "" when no watched table
}

func newDDL(o Options) ddl {
	d := ddl{
		schema:     pgx.Identifier{o.Schema}.Sanitize(),
		table:      pgx.Identifier{o.Schema, o.Table}.Sanitize(),
		recordFunc: pgx.Identifier{o.Schema, o.ChannelPrefix + recordFuncSuffix}.Sanitize(),
		changeFunc: pgx.Identifier{o.Schema, o.ChannelPrefix + "_notify_change"}.Sanitize(),
		trigger:    pgx.Identifier{o.ChannelPrefix}.Sanitize(),
		channel:    "'" + o.ChannelPrefix + "'", // a plain identifier: nothing to escape
		// As the trigger function's head: plain identifiers need no
		// escaping in JSON either.
		head: `'{"k":"b","s":"` + o.Schema + `","t":"` + o.Table + `","rs":['`,
	}
	if o.WatchTable != "" {
		d.watch = pgx.Identifier{o.WatchSchema, o.WatchTable}.Sanitize()
	}
	return d
}

func (d ddl) createSchema() string { return "CREATE SCHEMA IF NOT EXISTS " + d.schema }

func (d ddl) createTable() string {
	var b strings.Builder
	b.WriteString("CREATE TABLE IF NOT EXISTS " + d.table + " (\n")
	for i, c := range columns {
		b.WriteString("  " + c.name + " " + c.ddl)
		if i < len(columns)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString(")")
	return b.String()
}

func createFunction(name, body string) string {
	return "CREATE OR REPLACE FUNCTION " + name + "() RETURNS trigger LANGUAGE plpgsql AS $leaderfeed$" + body + "$leaderfeed$"
}

// recordFuncSuffix names the function of the election table's triggers
// (ChannelPrefix+recordFuncSuffix). Versions before the statement-level
// triggers used ChannelPrefix+"_notify_record" with a row-level trigger
// named ChannelPrefix, which Create drops.
const recordFuncSuffix = "_notify_rows"

func (d ddl) createRecordTrigger(prefix string, i int) string {
	rt := recordTriggers[i]
	return "CREATE TRIGGER " + pgx.Identifier{prefix + rt.suffix}.Sanitize() + " AFTER " + rt.event + " ON " + d.table +
		" " + rt.referencing + " FOR EACH STATEMENT WHEN (" + skipWhen + ") EXECUTE FUNCTION " + d.recordFunc + "(" + d.channel + ")"
}

// dropRecordTrigger drops the trigger createRecordTrigger(prefix, i) makes.
func (d ddl) dropRecordTrigger(prefix string, i int) string {
	return "DROP TRIGGER " + pgx.Identifier{prefix + recordTriggers[i].suffix}.Sanitize() + " ON " + d.table
}

// announce returns what a write's RETURNING adds so that it announces the
// row it wrote (alias t) itself: the notification the trigger function
// sends for a statement that wrote that row alone, byte for byte (op "I"
// or "U"), and notifiedSetting. RETURNING runs for every row written
// before the statement's triggers are queued, so a WHEN that finds the
// setting finds every row of the statement announced; a statement that
// wrote nothing leaves it unset, and its trigger announces nothing. The
// setting lasts until the transaction ends, and the Store's transactions
// that set it write only with announce. A record that passes
// heartbeat.ValidateWrite (names of at most heartbeat.MaxNameLen bytes, a
// value of at most heartbeat.MaxValueLen) fits in one notification, so
// none is sent "big".
func (d ddl) announce(op string) string {
	return "pg_notify(" + d.channel + ", " + d.head + " || json_build_object('op', '" + op + "', 'e', t.election, 'l', t.leader," +
		" 'n', t.term, 'r', t.revision, 'ts', CASE WHEN isfinite(t.ts) THEN (extract(epoch FROM t.ts) * 1000000)::bigint END," +
		" 'v', translate(encode(t.value, 'base64'), E'\\n', ''), 'ls', t.lease_us, 'sc', t.successor, 'h', t.handover, 'i', t.incarnation)::text || ']}') AS notified," +
		" set_config('" + notifiedSetting + "', 'on', true) AS announced"
}

// dropRowTrigger drops the row-level trigger of older versions.
func (d ddl) dropRowTrigger() string {
	return "DROP TRIGGER IF EXISTS " + d.trigger + " ON " + d.table
}

func (d ddl) createTrigger(table, function string) string {
	return "CREATE TRIGGER " + d.trigger + " AFTER INSERT OR UPDATE OR DELETE ON " + table +
		" FOR EACH ROW EXECUTE FUNCTION " + function + "()"
}

// SchemaSQL returns the SQL script that creates what a Store with opts
// needs (schema, election table, its key index, trigger functions,
// triggers, the fence function), for a database administrator to run when the application
// runs with NoCreate. The script is one transaction (one DO block) that
// changes only what is missing or out of date, as Create does: it adds
// the columns of later versions to an older table, replaces a function
// whose body differs, and replaces the triggers of earlier versions (the
// row-level one, and statement-level ones without WHEN), with no write
// committed between a drop and its create. Applied again, or to a table
// Create made, it only reads the catalog: it takes no lock on the table
// and needs no privilege on what exists. It fails with an error matching
// base.ErrInvalidConfig for the names NewStore rejects.
func SchemaSQL(opts Options) (string, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return "", err
	}
	d := newDDL(o)
	lit := func(s string) string { return "'" + s + "'" } // validated identifiers: nothing to escape
	table := lit(d.table)
	var b strings.Builder
	step := func(comment, cond string, stmts ...string) {
		b.WriteString("\n  -- " + comment + "\n  IF " + cond + " THEN\n")
		for _, st := range stmts {
			// Not indented past the first line: a function's body is
			// stored as written, and compared with md5 above.
			b.WriteString("    " + st + ";\n")
		}
		b.WriteString("  END IF;\n")
	}
	fn := func(schema, name string, nargs int, body string) string {
		return fmt.Sprintf("NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace\n"+
			"      WHERE n.nspname = %s AND p.proname = %s AND p.pronargs = %d AND md5(p.prosrc) = '%x')",
			lit(schema), lit(name), nargs, md5.Sum([]byte(body)))
	}
	// trigger is a condition: the trigger exists, and also satisfies and
	// when that is not "".
	trigger := func(relation, name, and string) string {
		cond := fmt.Sprintf("EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s) AND t.tgname = %s AND NOT t.tgisinternal", lit(relation), lit(name))
		if and != "" {
			cond += "\n      AND " + and
		}
		return cond + ")"
	}
	b.WriteString("BEGIN;\n\nDO $leaderfeed_schema$\nBEGIN")
	step("the schema", fmt.Sprintf("NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", lit(o.Schema)), "CREATE SCHEMA "+d.schema)
	step("the election table", "to_regclass("+table+") IS NULL", d.createTable())
	for _, c := range columns {
		if slices.Contains(addedColumns, c.name) {
			step("a column a table of an earlier version lacks",
				fmt.Sprintf("NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND attnum > 0 AND NOT attisdropped)", table, lit(c.name)),
				"ALTER TABLE "+d.table+" ADD COLUMN "+c.name+" "+c.ddl)
		}
	}
	step("the key index, for the reads of an election's participants", "NOT "+keyIndexExists(table), d.createKeyIndex())
	step("the trigger function of the election table", fn(o.Schema, o.ChannelPrefix+recordFuncSuffix, 0, recordFunctionBody),
		createFunction(d.recordFunc, recordFunctionBody))
	step("the row-level trigger of earlier versions, replaced by the statement-level ones", trigger(d.table, o.ChannelPrefix, ""), d.dropRowTrigger())
	for i, rt := range recordTriggers {
		name := o.ChannelPrefix + rt.suffix
		step("a statement-level trigger of an earlier version (without WHEN), replaced below",
			trigger(d.table, name, "pg_get_triggerdef(t.oid) NOT LIKE "+lit("%"+notifiedSetting+"%")), d.dropRecordTrigger(o.ChannelPrefix, i))
		step("a statement-level trigger of the election table", "NOT "+trigger(d.table, name, ""), d.createRecordTrigger(o.ChannelPrefix, i))
	}
	if d.watch != "" {
		step("the trigger function of the watched table", fn(o.Schema, o.ChannelPrefix+"_notify_change", 0, changeFunctionBody),
			createFunction(d.changeFunc, changeFunctionBody))
		step("the trigger of the watched table", "NOT "+trigger(d.watch, o.ChannelPrefix, ""), d.createTrigger(d.watch, d.changeFunc))
	}
	step("the fence function (Fence, FenceFunction), for any language", fn(o.Schema, fenceFuncName(o.Table), 2, fenceFunctionBody(d.table)),
		createFenceFunction(o))
	b.WriteString("END\n$leaderfeed_schema$;\n\nCOMMIT;\n")
	return b.String(), nil
}

// querier is what pgx.Tx and *pgxpool.Pool have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// create makes what is missing, in one transaction that holds an advisory
// lock, so that processes racing to create do not collide.
func (s *Store) create(ctx context.Context) error {
	o, d := s.opts, s.ddl
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", createLockKey); err != nil {
		return err
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", o.Schema).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := tx.Exec(ctx, d.createSchema()); err != nil {
			return err
		}
	}
	if err := tableExists(ctx, tx, o.Schema, o.Table, "election table"); errors.As(err, new(*missingError)) {
		if _, err := tx.Exec(ctx, d.createTable()); err != nil {
			return err
		}
	} else if err != nil {
		return err
	} else if err := addMissingColumns(ctx, tx, o, d); err != nil {
		return err
	}
	if err := checkColumns(ctx, tx, o); err != nil {
		return err
	}
	if err := s.ensureKeyIndex(ctx, tx); err != nil {
		return err
	}
	if err := ensureFunction(ctx, tx, o.Schema, o.ChannelPrefix+recordFuncSuffix, d.recordFunc, recordFunctionBody); err != nil {
		return err
	}
	if err := s.ensureRecordTriggers(ctx, tx); err != nil {
		return err
	}
	if err := ensureFenceFunction(ctx, tx, o); err != nil {
		return err
	}
	if d.watch != "" {
		// The watched table needs no privilege of this role once its
		// trigger exists: a hidden one is fine.
		if err := tableExists(ctx, tx, o.WatchSchema, o.WatchTable, "watched table"); err != nil && !errors.As(err, new(*hiddenError)) {
			if errors.As(err, new(*missingError)) {
				return fmt.Errorf("%w (the backend never creates the watched table): %w", err, base.ErrInvalidConfig)
			}
			return err
		}
		if err := ensureFunction(ctx, tx, o.Schema, o.ChannelPrefix+"_notify_change", d.changeFunc, changeFunctionBody); err != nil {
			return err
		}
		if err := s.ensureTrigger(ctx, tx, o.WatchSchema, o.WatchTable, d.watch, d.changeFunc); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// check verifies, without changing anything, that the election table (with
// the right columns) and the triggers exist.
func (s *Store) check(ctx context.Context) error {
	o := s.opts
	if err := tableExists(ctx, s.pool, o.Schema, o.Table, "election table"); err != nil {
		return err
	}
	if err := checkColumns(ctx, s.pool, o); err != nil {
		return err
	}
	for _, rt := range recordTriggers {
		ok, err := triggerExists(ctx, s.pool, o.Schema, o.Table, o.ChannelPrefix+rt.suffix)
		if err != nil {
			return err
		}
		if !ok {
			return &missingError{"trigger " + pgx.Identifier{o.ChannelPrefix + rt.suffix}.Sanitize() + " on " + s.ddl.table +
				" (a table made by a version before the statement-level triggers: Create upgrades it)"}
		}
	}
	if o.WatchTable != "" {
		if err := tableExists(ctx, s.pool, o.WatchSchema, o.WatchTable, "watched table"); err != nil && !errors.As(err, new(*hiddenError)) {
			return err
		}
		if err := triggerMissing(ctx, s.pool, o, o.WatchSchema, o.WatchTable); err != nil {
			return err
		}
	}
	return nil
}

// tableExists returns a *missingError when the table does not exist, and
// a *hiddenError when it exists but this role may not read it (no USAGE
// on its schema or no SELECT on it): the catalog shows every table to
// every role, so "absent" and "not yours" are told apart.
func tableExists(ctx context.Context, q querier, schema, table, what string) error {
	var usage, sel bool
	err := q.QueryRow(ctx, `SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, schema, table).Scan(&usage, &sel)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &missingError{what + " " + pgx.Identifier{schema, table}.Sanitize()}
	case err != nil:
		return err
	case !usage:
		return &hiddenError{fmt.Sprintf("%s %s exists, but this role has no USAGE privilege on schema %s",
			what, pgx.Identifier{schema, table}.Sanitize(), pgx.Identifier{schema}.Sanitize())}
	case !sel:
		return &hiddenError{fmt.Sprintf("%s %s exists, but this role has no SELECT privilege on it",
			what, pgx.Identifier{schema, table}.Sanitize())}
	}
	return nil
}

// hiddenError reports a table that exists but that this role may not
// read.
type hiddenError struct{ what string }

func (e *hiddenError) Error() string { return e.what }

// missingError reports a table or trigger that does not exist.
type missingError struct{ what string }

func (e *missingError) Error() string { return e.what + " does not exist" }

func checkColumns(ctx context.Context, q querier, o Options) error {
	rows, err := q.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, o.Schema, o.Table)
	if err != nil {
		return err
	}
	have := map[string]string{}
	var name, typ string
	if _, err := pgx.ForEachRow(rows, []any{&name, &typ}, func() error { have[name] = typ; return nil }); err != nil {
		return err
	}
	var problems []string
	for _, c := range columns {
		switch t, ok := have[c.name]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s is missing", c.name))
		case t != c.typ:
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", c.name, t, c.typ))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("election table %s does not have the expected shape: %s: %w: %w; fix: %s",
			pgx.Identifier{o.Schema, o.Table}.Sanitize(), strings.Join(problems, "; "), base.ErrRefused, base.ErrInvalidConfig, fixSchema())
	}
	return nil
}

// addMissingColumns adds the columns of addedColumns that a table made by
// an older version lacks. It checks first: ALTER TABLE takes an exclusive
// lock even when the column exists.
func addMissingColumns(ctx context.Context, tx pgx.Tx, o Options, d ddl) error {
	var missing bool
	err := tx.QueryRow(ctx, `SELECT count(*) < $3 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attname = ANY($4) AND a.attnum > 0 AND NOT a.attisdropped`,
		o.Schema, o.Table, len(addedColumns), addedColumns).Scan(&missing)
	if err != nil || !missing {
		return err
	}
	for _, stmt := range d.addColumns() {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// ensureKeyIndex creates the key index when the table lacks it (a table of
// an earlier version). Building it holds off writes to the table (a
// SHARE lock, for as long as the build takes: milliseconds for thousands
// of rows), so it checks first. Only the table's owner may create it: for
// another role it logs what an owner must run, and goes on (the reads of
// participants are right without it, only slower).
func (s *Store) ensureKeyIndex(ctx context.Context, tx pgx.Tx) error {
	var exists, owner bool
	err := tx.QueryRow(ctx, "SELECT "+keyIndexExists("$1::text")+", pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = to_regclass($1::text)",
		s.ddl.table).Scan(&exists, &owner)
	if err != nil || exists {
		return err
	}
	if !owner {
		s.opts.Logger.Warn("postgres: the election table lacks its key index and this role does not own it: each read of an election's participants scans the table until its owner runs the statement",
			"table", s.ddl.table, "statement", s.ddl.createKeyIndex())
		return nil
	}
	_, err = tx.Exec(ctx, s.ddl.createKeyIndex())
	return err
}

func triggerExists(ctx context.Context, q querier, schema, table, trigger string) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND t.tgname = $3 AND NOT t.tgisinternal)`,
		schema, table, trigger).Scan(&exists)
	return exists, err
}

func triggerMissing(ctx context.Context, q querier, o Options, schema, table string) error {
	ok, err := triggerExists(ctx, q, schema, table, o.ChannelPrefix)
	if err != nil {
		return err
	}
	if !ok {
		return &missingError{"trigger " + pgx.Identifier{o.ChannelPrefix}.Sanitize() + " on " + pgx.Identifier{schema, table}.Sanitize()}
	}
	return nil
}

func ensureFunction(ctx context.Context, tx pgx.Tx, schema, name, quoted, body string) error {
	var src string
	err := tx.QueryRow(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = $2 AND p.pronargs = 0`, schema, name).Scan(&src)
	switch {
	case err == nil && src == body:
		return nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	_, err = tx.Exec(ctx, createFunction(quoted, body))
	return err
}

func (s *Store) ensureTrigger(ctx context.Context, tx pgx.Tx, schema, table, quotedTable, function string) error {
	ok, err := triggerExists(ctx, tx, schema, table, s.opts.ChannelPrefix)
	if err != nil || ok {
		return err
	}
	_, err = tx.Exec(ctx, s.ddl.createTrigger(quotedTable, function))
	return err
}

// ensureRecordTriggers drops the row-level trigger of older versions and
// creates the statement-level triggers that are missing.
func (s *Store) ensureRecordTriggers(ctx context.Context, tx pgx.Tx) error {
	o := s.opts
	old, err := triggerExists(ctx, tx, o.Schema, o.Table, o.ChannelPrefix)
	if err != nil {
		return err
	}
	if old {
		if _, err := tx.Exec(ctx, s.ddl.dropRowTrigger()); err != nil {
			return err
		}
	}
	for i, rt := range recordTriggers {
		def, err := triggerDef(ctx, tx, o.Schema, o.Table, o.ChannelPrefix+rt.suffix)
		if err != nil {
			return err
		}
		if def != "" && !strings.Contains(def, notifiedSetting) {
			// A trigger of a version before skipWhen: it announces the
			// Store's writes a second time (the server drops a
			// notification identical to one sent before in the same
			// transaction, but pays for it). Replaced in this
			// transaction, so no write goes unannounced meanwhile.
			if _, err := tx.Exec(ctx, s.ddl.dropRecordTrigger(o.ChannelPrefix, i)); err != nil {
				return err
			}
			def = ""
		}
		if def == "" {
			if _, err := tx.Exec(ctx, s.ddl.createRecordTrigger(o.ChannelPrefix, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// triggerDef returns the definition of a trigger (pg_get_triggerdef), ""
// when it does not exist.
func triggerDef(ctx context.Context, q querier, schema, table, trigger string) (string, error) {
	var def string
	err := q.QueryRow(ctx, `SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND t.tgname = $3 AND NOT t.tgisinternal`,
		schema, table, trigger).Scan(&def)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return def, err
}
