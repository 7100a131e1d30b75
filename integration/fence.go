package integration

// Fenced writes on PostgreSQL: while it leads, the node program runs
// transactions that call postgres.Fence and then write FenceWriteSQL; the
// tests count, in the database itself and independently of Fence, the
// writes that committed after a newer term had begun (stale commits).
//
// The tables are the tests' own: a log with one row per committed fenced
// write, and a head row per election. A trigger on the election table
// raises the head's max_term to the term of every record naming a leader
// (a claim or a handover), and past the term of a vacant record (term+1:
// the next leader's term at the least), in the transaction that writes
// the record. Every fenced write updates the head row in its own
// transaction too, so the head's row lock orders the two in commit
// order: a fenced write of term T that commits after a newer term's
// record committed finds max_term > T and counts itself stale, in the
// head (stale) and in its log row (T < max_term). A write that commits
// first holds the head row until its commit, so the record's trigger
// waits for it and finds it done. Renewals, which change no term, update
// nothing (the trigger's UPDATE matches no row) and so wait for no
// fenced write.

const (
	// FenceHeadTable has a row per election: max_term, and how many fenced
	// writes committed and how many of them were stale.
	FenceHeadTable = "lf_it_fence_head"
	// FenceLogTable has a row per committed fenced write.
	FenceLogTable = "lf_it_fence_log"
)

// FenceSchemaSQL makes the tables, the trigger on the election table
// public.leaderfeed (postgres.DefaultTable) and the head row of the
// election ($1 is not allowed in DDL: see FenceHeadSQL). Idempotent.
const FenceSchemaSQL = `
CREATE TABLE IF NOT EXISTS ` + FenceHeadTable + ` (
  election text PRIMARY KEY,
  max_term bigint NOT NULL DEFAULT 0,
  commits bigint NOT NULL DEFAULT 0,
  stale bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ` + FenceLogTable + ` (
  id bigserial PRIMARY KEY,
  election text NOT NULL,
  term bigint NOT NULL,
  node text NOT NULL,
  seq bigint NOT NULL,
  mono bigint NOT NULL,
  max_term bigint NOT NULL
);
CREATE OR REPLACE FUNCTION lf_it_fence_bump() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
  t bigint := CASE WHEN NEW.leader = '' THEN NEW.term + 1 ELSE NEW.term END;
BEGIN
  UPDATE ` + FenceHeadTable + ` SET max_term = t WHERE election = NEW.election AND max_term < t;
  RETURN NULL;
END
$f$;
DROP TRIGGER IF EXISTS lf_it_fence_bump ON public.leaderfeed;
CREATE TRIGGER lf_it_fence_bump AFTER INSERT OR UPDATE ON public.leaderfeed
  FOR EACH ROW EXECUTE FUNCTION lf_it_fence_bump();
`

// FenceHeadSQL makes the head row of election $1.
const FenceHeadSQL = `INSERT INTO ` + FenceHeadTable + ` (election) VALUES ($1) ON CONFLICT (election) DO NOTHING`

// FenceWriteSQL is the write of a fenced transaction, after postgres.Fence:
// it counts the write in the head row of election $1, stale when its term
// $2 is below max_term, and logs it with the node $3, its sequence number
// $4, the Monotonic time $5 it was sent at and the max_term it found
// (above $2 when stale: greatest(max_term, $2) > $2 only if max_term >
// $2).
const FenceWriteSQL = `WITH h AS (
  UPDATE ` + FenceHeadTable + ` SET commits = commits + 1, stale = stale + ($2 < max_term)::int,
    max_term = greatest(max_term, $2) WHERE election = $1 RETURNING max_term)
INSERT INTO ` + FenceLogTable + ` (election, term, node, seq, mono, max_term) SELECT $1, $2, $3, $4, $5, h.max_term FROM h`
