package rethink

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// This file holds the decisions Create makes about the server's catalog,
// as pure functions: what to do next given the rows of the system tables
// rethinkdb.db_config and rethinkdb.table_config, and what a failed drop
// means. create.go runs them against the server; plan_test.go checks them
// without one.
//
// Why duplicates exist at all: on RethinkDB 2.4.4 (measured), dbCreate and
// tableCreate check the name against the server's current metadata and
// then commit, without serializing concurrent creators, so several
// concurrent calls with one name can all succeed. Every query that names
// the database or table afterwards fails with "... is ambiguous; there are
// multiple ... with that name". Only the system tables, which address
// databases and tables by UUID, can tell them apart and drop all but one.

// dbRow is a row of rethinkdb.db_config.
type dbRow struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// tableRow is a row of rethinkdb.table_config read with identifier_format
// "uuid", so that DB is the database's id, not its (possibly ambiguous)
// name.
type tableRow struct {
	ID         string          `json:"id"`
	Name       string          `json:"name"`
	DB         string          `json:"db"`
	PrimaryKey string          `json:"primary_key"`
	Durability string          `json:"durability"`
	WriteAcks  json.RawMessage `json:"write_acks"` // "majority", "single", or a list
}

// action is what Create does next.
type action int

const (
	actDone        action = iota + 1 // exactly one database and one table: use them
	actCreateDB                      // the database is missing: create it
	actCreateTable                   // the table is missing: create it
	actDropDBs                       // duplicate databases: drop step.Drop
	actDropTables                    // duplicate tables: drop step.Drop
	actMissing                       // missing and creating is off: fail (ErrInvalidConfig)
	actRefuse                        // a duplicate holds data not ours: fail, drop nothing
)

func (a action) String() string {
	switch a {
	case actDone:
		return "done"
	case actCreateDB:
		return "create database"
	case actCreateTable:
		return "create table"
	case actDropDBs:
		return "drop duplicate databases"
	case actDropTables:
		return "drop duplicate tables"
	case actMissing:
		return "missing"
	case actRefuse:
		return "refuse"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// step is the decision of plan.
type step struct {
	Action action
	// Keep is the id of the database (actDropDBs) or table (actDropTables,
	// actDone) that stays.
	Keep string
	// Drop are the ids to drop, in ascending order, for actDropDBs and
	// actDropTables.
	Drop []string
	// Table is the kept table's row, for actDone.
	Table tableRow
	// What names what is missing (actMissing) or why nothing is dropped
	// (actRefuse).
	What string
}

// plan decides the next step of Create for database db and table table.
// dbs are the rows of db_config named db; tables are the rows of
// table_config (identifier_format "uuid") of every database in dbs, of any
// name. create says whether missing things may be created.
//
// Every process that sees the same rows takes the same decision, so
// concurrent creators converge on one database and one table:
//
//   - Several databases named db: keep the one holding the most tables
//     (a database that has our table, or the application's tables, wins
//     over an empty duplicate), ties broken by the lowest id; drop the
//     others in ascending id order. While duplicates exist, no table can
//     be created in any of them by name (the name is ambiguous), so in the
//     race this resolves they are all empty and the lowest id is kept. A
//     duplicate that holds a table other than ours is the application's
//     data: plan refuses and drops nothing, for an administrator to sort
//     out.
//   - One database, several tables named table in it: keep the lowest id,
//     drop the others in ascending id order. Tables of other names are
//     never touched.
//   - Nothing missing and no duplicates: done.
func plan(db, table string, dbs []dbRow, tables []tableRow, create bool) step {
	switch len(dbs) {
	case 0:
		if !create {
			return step{Action: actMissing, What: "database " + db}
		}
		return step{Action: actCreateDB}
	case 1:
	default:
		count := map[string]int{}
		foreign := map[string][]string{}
		for _, t := range tables {
			count[t.DB]++
			if t.Name != table {
				foreign[t.DB] = append(foreign[t.DB], t.Name)
			}
		}
		sorted := slices.Clone(dbs)
		slices.SortFunc(sorted, func(a, b dbRow) int {
			return cmp.Or(cmp.Compare(count[b.ID], count[a.ID]), cmp.Compare(a.ID, b.ID))
		})
		keep := sorted[0].ID
		var drop, refuse []string
		for _, d := range sorted[1:] {
			if d.ID == keep {
				continue // a row listed twice: nothing to drop
			}
			if f := foreign[d.ID]; len(f) > 0 {
				slices.Sort(f)
				refuse = append(refuse, fmt.Sprintf("%s (tables %s)", d.ID, strings.Join(f, ", ")))
			}
			drop = append(drop, d.ID)
		}
		if len(refuse) > 0 {
			return step{Action: actRefuse, Keep: keep, What: fmt.Sprintf(
				"%d databases are named %s; keeping %s would drop %s, which hold tables other than %s: drop or rename the duplicates by hand (through rethinkdb.db_config)",
				len(dbs), db, keep, strings.Join(refuse, "; "), table)}
		}
		slices.Sort(drop)
		drop = slices.Compact(drop)
		if len(drop) == 0 {
			return plan(db, table, sorted[:1], tables, create)
		}
		return step{Action: actDropDBs, Keep: keep, Drop: drop}
	}
	var ours []tableRow
	for _, t := range tables {
		if t.DB == dbs[0].ID && t.Name == table {
			ours = append(ours, t)
		}
	}
	slices.SortFunc(ours, func(a, b tableRow) int { return cmp.Compare(a.ID, b.ID) })
	ours = slices.CompactFunc(ours, func(a, b tableRow) bool { return a.ID == b.ID })
	switch len(ours) {
	case 0:
		if !create {
			return step{Action: actMissing, What: "table " + db + "." + table}
		}
		return step{Action: actCreateTable}
	case 1:
		return step{Action: actDone, Keep: ours[0].ID, Table: ours[0]}
	}
	drop := make([]string, 0, len(ours)-1)
	for _, t := range ours[1:] {
		drop = append(drop, t.ID)
	}
	return step{Action: actDropTables, Keep: ours[0].ID, Drop: drop}
}

// dropOutcome is what a drop through a system table came to.
type dropOutcome int

const (
	dropped     dropOutcome = iota + 1 // this call dropped it
	alreadyGone                        // someone else dropped it first: fine
	dropFailed                         // neither: Create fails with the error and the next Create resumes
)

func (o dropOutcome) String() string {
	switch o {
	case dropped:
		return "dropped"
	case alreadyGone:
		return "already gone"
	case dropFailed:
		return "failed"
	}
	return fmt.Sprintf("dropOutcome(%d)", int(o))
}

// deleteResult is the write result of a Delete on a system table row.
type deleteResult struct {
	Deleted    int    `json:"deleted"`
	Skipped    int    `json:"skipped"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error"`
}

// classifyDrop tells what r.db("rethinkdb").table(...).get(id).delete()
// came to, from its write result res, or from err when the query failed. A
// row that is not there (skipped: get of a missing id yields null) was
// dropped by a concurrent creator taking the same decision; so was a
// database or table the server reports as not existing. Anything else is a
// failure: the drop may or may not have happened, and Create returns the
// error; the next Create lists the catalog again and resumes from what it
// finds.
func classifyDrop(res deleteResult, err error) dropOutcome {
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return alreadyGone
		}
		return dropFailed
	}
	switch {
	case res.Errors == 0 && res.Deleted == 1:
		return dropped
	case res.Errors == 0 && res.Deleted == 0 && res.Skipped == 1:
		return alreadyGone
	case res.Errors > 0 && strings.Contains(res.FirstError, "does not exist"):
		return alreadyGone
	}
	return dropFailed
}
