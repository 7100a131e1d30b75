package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SIGTERM of the leading run hands the election to the other run in one
// write (issue 41): run participates by default, so its Stop withdraws
// its presence record, then writes the record that names the other run
// leader of the next term with the token of its presence write
// (heartbeat.Record.Handover), and the other run starts its CMD from
// that record, with no vacancy and no claim of its own between. What is
// observed: the runs' CMDs (which write LEADERFEED_NODE and
// LEADERFEED_TERM to a file), their exit codes, and every write of the
// election table, kept by a trigger the test adds. b's first presence
// write that carries a handover token is noted too, to tell why a
// handover went wrong: a leader skips a participant without one, and the
// presence write of b's Start has none.
func TestRunSIGTERMHandsOver(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	table := uniqueName("handover")
	applySchema(t, bin, url, "--table", table)
	t.Cleanup(func() {
		adminExec(t, url, `DROP TABLE IF EXISTS "`+table+`" CASCADE; DROP TABLE IF EXISTS "`+table+`_hist"; DROP FUNCTION IF EXISTS "`+table+`_hist"()`)
	})
	adminExec(t, url, strings.ReplaceAll(handoverHistorySQL, "{T}", table))

	dir := t.TempDir()
	terms := filepath.Join(dir, "terms")
	run := func(id string) *proc {
		args := append([]string{"run", "--store", url, "--election", "e", "--table", table, "--no-create", "--id", id}, timingFlags...)
		args = append(args, "--", "sh", "-c", `echo "$LEADERFEED_NODE $LEADERFEED_TERM" >> "$0"; exec sleep 600`, terms)
		return start(t, bin, io.Discard, args...)
	}
	cmds := func() []string {
		data, _ := os.ReadFile(terms)
		return strings.Fields(string(data))
	}

	a := run("a")
	waitFor(t, 20*time.Second, "a's CMD", func() bool { return len(cmds()) == 2 })
	var term uint64
	if c := cmds(); c[0] != "a" {
		t.Fatalf("CMD of %q, want a's", c)
	} else if _, err := fmt.Sscan(c[1], &term); err != nil {
		t.Fatal(err)
	}
	b := run("b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitFor(t, 20*time.Second, "b's presence record", func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM "`+table+`" WHERE election = 'e' || chr(31) || 'b'`).Scan(&n)
		return err == nil && n == 1
	})
	var mark int64
	var leader string
	var now uint64
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM "`+table+`_hist"`).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT leader, term FROM "`+table+`" WHERE election = 'e'`).Scan(&leader, &now); err != nil {
		t.Fatal(err)
	}
	if leader != "a" || now != term {
		t.Fatalf("before the SIGTERM the record names %s, term %d; want a, term %d (a's lease ran out while b started? %s scales the timing)", leader, now, term, "LEADERFEED_TEST_SCALE")
	}

	sent := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "b's CMD", func() bool { return len(cmds()) == 4 })
	took := time.Since(sent)
	if code := a.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("a exited %d after SIGTERM, want 0", code)
	}
	// b leads on the record a handed it (term+1); on a starved machine
	// the handover may reach b after the lease it grants ended (a quarter
	// of the lease is left for that): b then claims the next term at once,
	// which the history below shows.
	var bTerm uint64
	if c := cmds(); c[2] != "b" {
		t.Fatalf("CMDs %q: want b's next", c)
	} else if _, err := fmt.Sscan(c[3], &bTerm); err != nil || (bTerm != term+1 && bTerm != term+2) {
		t.Fatalf("CMDs %q: want b's of term %d next", c, term+1)
	}

	// The writes since the mark, a's and b's renewals aside: a's
	// withdrawal, then the handover.
	rows, err := conn.Query(ctx, `SELECT id, op, key, leader, term, successor, handover, at FROM "`+table+`_hist" ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type write struct {
		id                         int64
		op, key, leader, successor string
		term                       uint64
		handover                   int64
		at                         time.Time
	}
	var got, all []string // all: every row from b's join, for a failure
	withdrawn, handedOver, claimed := -1, -1, false
	var bToken, aLeft int64            // rows: b's first presence write with a token; a's withdrawal
	var bPresent, reservedAt time.Time // b's last presence write before a's withdrawal; a vacancy reserved for b
	for rows.Next() {
		var w write
		if err := rows.Scan(&w.id, &w.op, &w.key, &w.leader, &w.term, &w.successor, &w.handover, &w.at); err != nil {
			t.Fatal(err)
		}
		if w.key == "e\x1fb" && w.op != "DELETE" && aLeft == 0 {
			bPresent = w.at
		}
		if w.key == "e" && w.leader == "" && w.term == term && w.successor == "b" && reservedAt.IsZero() {
			reservedAt = w.at
		}
		if w.key == "e\x1fb" && w.op == "INSERT" || len(all) > 0 {
			all = append(all, fmt.Sprintf("#%d %s %q leader=%q term=%d successor=%q handover=%d", w.id, w.op, w.key, w.leader, w.term, w.successor, w.handover))
		}
		switch {
		case w.key == "e\x1fb" && w.op == "TOKEN":
			bToken = w.id
		case w.id <= mark:
		case w.key == "e\x1fa" && w.op == "DELETE":
			withdrawn, aLeft = len(got), w.id
			got = append(got, "a's presence withdrawn")
		case w.key != "e":
		case bTerm == term+2 && w.leader == "b" && w.term == bTerm && w.handover == 0 && !claimed:
			claimed = true
			got = append(got, fmt.Sprintf("b's claim of term %d", bTerm))
		case w.term == term && w.leader == "a" || w.term == bTerm && w.leader == "b" && w.handover == 0:
			// a renewal
		default:
			if w.leader == "b" && w.term == term+1 && w.successor == "" {
				handedOver = len(got)
			}
			got = append(got, fmt.Sprintf("leader=%q term=%d successor=%q handover=%d", w.leader, w.term, w.successor, w.handover))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The handover: b's term written at once, with a token; nothing else
	// of the record between (no vacancy, no claim of b's).
	late := bTerm == term+2 && claimed && len(got) == 3 && got[2] == fmt.Sprintf("b's claim of term %d", bTerm)
	// A leader reserves the vacancy for a successor whose token is older
	// than half the lease when it reads it (base: oneWriteAge), which b
	// claims at once (term+1): the designed fallback for a successor
	// stalled past its refresh, and only then. Its token was at most
	// reserved - bPresent old at a's read (after a's withdrawal).
	fallback := withdrawn == 0 && len(got) == 2 && !reservedAt.IsZero() && !bPresent.IsZero() && bTerm == term+1 &&
		got[1] == fmt.Sprintf("leader=%q term=%d successor=%q handover=0", "", term, "b") &&
		reservedAt.Sub(bPresent) > timing.LeaseDuration/2
	if !fallback && (withdrawn < 0 || handedOver != withdrawn+1 || (len(got) != 2 && !late)) {
		why := ""
		if bToken == 0 || bToken > aLeft {
			// a read the participants as it withdrew (one round trip); a
			// leader skips a participant without a token (base: successor).
			why = "; b had not yet written a presence record with a handover token when a withdrew and read the participants"
		}
		if !reservedAt.IsZero() && !bPresent.IsZero() {
			why += fmt.Sprintf("; b's last presence write before a's withdrawal was %v before the vacancy reserved for it (a reserves it for a token older than %v)", reservedAt.Sub(bPresent), timing.LeaseDuration/2)
		}
		t.Fatalf("the store's writes after the SIGTERM, renewals aside: %q; want a's presence withdrawn, then one write naming b leader of term %d with a handover token%s\nthe history from b's join:\n%s", got, term+1, why, strings.Join(all, "\n"))
	}
	if late {
		t.Logf("the handover reached b after the lease it granted (a starved machine): b claimed term %d at once", bTerm)
	}
	if fallback {
		t.Logf("b's last presence write was %v before a reserved the vacancy, over half the lease (%v): b was stalled, a reserved the vacancy for it and b claimed term %d at once", reservedAt.Sub(bPresent), timing.LeaseDuration/2, bTerm)
	}
	t.Logf("SIGTERM of the leader: %v to the other run's CMD; writes %q", took, got)
	_ = b
}

// handoverHistorySQL keeps every write of the election table {T}, and
// when it was made, in the transaction that makes it: a presence
// record's refreshes as op REFRESH.
const handoverHistorySQL = `
CREATE TABLE "{T}_hist" (
  id bigserial PRIMARY KEY,
  op text NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  key text NOT NULL,
  leader text NOT NULL,
  term bigint NOT NULL,
  successor text NOT NULL,
  handover bigint NOT NULL
);
CREATE FUNCTION "{T}_hist"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO "{T}_hist" (op, key, leader, term, successor, handover)
    VALUES (TG_OP, OLD.election, OLD.leader, OLD.term, OLD.successor, OLD.handover);
  ELSIF TG_OP = 'INSERT' OR strpos(NEW.election, chr(31)) = 0 THEN
    INSERT INTO "{T}_hist" (op, key, leader, term, successor, handover)
    VALUES (TG_OP, NEW.election, NEW.leader, NEW.term, NEW.successor, NEW.handover);
  ELSE
    INSERT INTO "{T}_hist" (op, key, leader, term, successor, handover)
    VALUES ('REFRESH', NEW.election, NEW.leader, NEW.term, NEW.successor, NEW.handover);
  END IF;
  -- A participant's first presence write with a handover token.
  IF TG_OP <> 'DELETE' AND strpos(NEW.election, chr(31)) > 0
      AND convert_from(NEW.value, 'UTF8')::jsonb->>'k' IS NOT NULL
      AND (TG_OP = 'INSERT' OR convert_from(OLD.value, 'UTF8')::jsonb->>'k' IS NULL) THEN
    INSERT INTO "{T}_hist" (op, key, leader, term, successor, handover)
    VALUES ('TOKEN', NEW.election, NEW.leader, NEW.term, NEW.successor, NEW.handover);
  END IF;
  RETURN NULL;
END
$$;
CREATE TRIGGER "{T}_hist" AFTER INSERT OR UPDATE OR DELETE ON "{T}"
  FOR EACH ROW EXECUTE FUNCTION "{T}_hist"();
`
