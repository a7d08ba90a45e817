// Package postgres fences PostgreSQL rows through pgx: the check is SQL shipped in this
// repository (fence/postgres/001_fenced_lease.sql, embedded here as Migration), so every
// client gets it whatever its language. A fenced table carries, per row, the highest token
// that wrote it in the column fence_token, and a trigger refuses any write presenting a lower
// one with SQLSTATE FL001, which becomes *fence.Fenced. A write here is one statement,
//
//	UPDATE t SET fence_token = fenced_lease.accept(fence_token, $1), c1 = $2 ... WHERE key = $k
//
// so the check runs on the locked row: check and write are one atomic step.
//
//	payouts := postgres.NewTable("payouts", "account")
//	err := payouts.Enable(ctx, pool) // installs the migration if missing
//	err = payouts.Update(ctx, pool, []any{42}, map[string]any{"paid_by": "a"}, token)
//	if errors.Is(err, fence.ErrFenced) { /* a newer holder exists: stop */ }
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Migration is fence/postgres/001_fenced_lease.sql: the schema fenced_lease, its check
// fenced_lease.accept(highest, token) and the trigger fenced_lease.enable(table) installs.
// Idempotent; Install runs it as one transaction.
//
//go:embed 001_fenced_lease.sql
var Migration string

const (
	// FenceColumn holds the highest token accepted for a row.
	FenceColumn = "fence_token"
	// FencedSQLState is the SQLSTATE of a refused token; its DETAIL reads
	// presented=<token> highest=<token>.
	FencedSQLState = "FL001"
)

// ErrNoRow says the row a fenced write names does not exist.
var ErrNoRow = errors.New("no such row")

// DB is what the guards need: *pgx.Conn, *pgxpool.Pool and pgx.Tx all are.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgx.Conn and *pgxpool.Pool are.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Install installs (or upgrades) the schema fenced_lease: Migration as one implicit
// transaction (a multi-statement query). Needs the privilege to create a schema.
func Install(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, Migration)
	return Check(err)
}

// Check turns a refusal by the database (SQLSTATE FL001) into *fence.Fenced; any other
// error is returned as it is. Use it on statements of your own that present a token.
func Check(err error) error {
	var pg *pgconn.PgError
	if err == nil || !errors.As(err, &pg) || pg.Code != FencedSQLState {
		return err
	}
	var presented, highest int64
	if _, scanErr := fmt.Sscanf(pg.Detail, "presented=%d highest=%d", &presented, &highest); scanErr != nil {
		return err
	}
	return &fence.Fenced{Presented: presented, Highest: highest}
}

// Table is a table whose rows are fenced, each identified by its key columns. Names are
// quoted as SQL identifiers (so they are case-sensitive); the name may be schema.table.
type Table struct {
	name string
	keys []string
}

// NewTable is table name, its rows identified by keyColumns.
func NewTable(name string, keyColumns ...string) *Table {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = pgx.Identifier{p}.Sanitize()
	}
	keys := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		keys[i] = pgx.Identifier{k}.Sanitize()
	}
	return &Table{name: strings.Join(parts, "."), keys: keys}
}

// Enable fences the table for every client: installs Migration if it is missing, then
// fenced_lease.enable(table) adds the fence column (BIGINT NOT NULL DEFAULT 0) if missing
// and the trigger that refuses lower tokens. Idempotent.
func (t *Table) Enable(ctx context.Context, db DB) error {
	var installed bool
	err := db.QueryRow(ctx, "SELECT to_regprocedure('fenced_lease.accept(bigint,bigint)') IS NOT NULL").Scan(&installed)
	if err != nil {
		return err
	}
	if !installed {
		if err := Install(ctx, db); err != nil {
			return err
		}
	}
	_, err = db.Exec(ctx, "SELECT fenced_lease.enable($1::text::regclass)", t.name)
	return err
}

// Update sets the columns of set on the row with key, if token is not lower than the row's:
// one UPDATE whose fence_token = fenced_lease.accept(fence_token, token). The row must exist
// (ErrNoRow); a lower token is *fence.Fenced.
func (t *Table) Update(ctx context.Context, db DB, key []any, set map[string]any, token int64) error {
	if err := fence.CheckToken(token); err != nil {
		return err
	}
	if len(key) != len(t.keys) {
		return fmt.Errorf("%s is keyed by %d column(s), got %d value(s)", t.name, len(t.keys), len(key))
	}
	fc := pgx.Identifier{FenceColumn}.Sanitize()
	sql := fmt.Sprintf("UPDATE %s SET %s = fenced_lease.accept(%s, $1)", t.name, fc, fc)
	args := []any{token}
	columns := make([]string, 0, len(set))
	for c := range set {
		columns = append(columns, c)
	}
	sort.Strings(columns)
	for _, c := range columns {
		args = append(args, set[c])
		sql += fmt.Sprintf(", %s = $%d", pgx.Identifier{c}.Sanitize(), len(args))
	}
	var where []string
	for i, k := range t.keys {
		args = append(args, key[i])
		where = append(where, fmt.Sprintf("%s = $%d", k, len(args)))
	}
	tag, err := db.Exec(ctx, sql+" WHERE "+strings.Join(where, " AND "), args...)
	if err != nil {
		return Check(err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("row %v of %s: %w", key, t.name, ErrNoRow)
	}
	return nil
}

// Begin starts a transaction fenced as a whole: its first statement checks and records
// token on the row with key, and the row lock it takes holds until commit, so every other
// writer of the row waits. Commit or roll back the returned transaction.
func (t *Table) Begin(ctx context.Context, db Beginner, key []any, token int64) (pgx.Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.Update(ctx, tx, key, nil, token); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}
