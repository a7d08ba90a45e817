package postgres_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/fence/postgres"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/jackc/pgx/v5"
)

func connect(t *testing.T) (context.Context, *pgx.Conn) {
	url := os.Getenv("FL_POSTGRES_URL")
	if url == "" {
		if os.Getenv("FL_REQUIRE_CLUSTER") == "1" {
			t.Fatal("FL_POSTGRES_URL is not set: eval \"$(hack/datastores up)\"")
		}
		t.Skip("FL_POSTGRES_URL not set")
	}
	ctx := testenv.Ctx(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return ctx, conn
}

func TestTheDatabaseRefusesALowerTokenWithBothTokens(t *testing.T) {
	ctx, conn := connect(t)
	table := "go_payouts_" + testenv.RandomSuffix()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (account bigint PRIMARY KEY, paid_by text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+table) })
	payouts := postgres.NewTable(table, "account")
	if err := payouts.Enable(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" (account) VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	if err := payouts.Update(ctx, conn, []any{42}, map[string]any{"paid_by": "a"}, 7); err != nil {
		t.Fatal(err)
	}
	err := payouts.Update(ctx, conn, []any{42}, map[string]any{"paid_by": "stale"}, 6)
	var f *fence.Fenced
	if !errors.As(err, &f) || f.Presented != 6 || f.Highest != 7 {
		t.Fatalf("err = %v, want Fenced{6, 7}", err)
	}
	if err := payouts.Update(ctx, conn, []any{42}, map[string]any{"paid_by": "a again"}, 7); err != nil {
		t.Fatalf("an equal token: %v", err)
	}
	if err := payouts.Update(ctx, conn, []any{43}, nil, 7); !errors.Is(err, postgres.ErrNoRow) {
		t.Fatalf("a missing row: %v", err)
	}
	tx, err := payouts.Begin(ctx, conn, []any{42}, 8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE "+table+" SET paid_by = 'b' WHERE account = 42"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := payouts.Begin(ctx, conn, []any{42}, 7); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("a stale transaction: %v", err)
	}
	var paidBy string
	var token int64
	if err := conn.QueryRow(ctx, "SELECT paid_by, fence_token FROM "+table+" WHERE account = 42").Scan(&paidBy, &token); err != nil {
		t.Fatal(err)
	}
	if paidBy != "b" || token != 8 {
		t.Fatalf("row: paid_by %q, token %d", paidBy, token)
	}
}

// The embedded SQL is the repository's fence/postgres/.
func TestTheEmbeddedMigrationsAreTheRepositorys(t *testing.T) {
	for file, embedded := range map[string]string{"001_fenced_lease.sql": postgres.Migration, "002_scopes.sql": postgres.MigrationScopes} {
		want, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "fence", "postgres", file))
		if err != nil {
			t.Fatal(err)
		}
		if string(want) != embedded {
			t.Fatalf("go/fence/postgres/%s differs from fence/postgres/: copy it again", file)
		}
	}
}

// A stale holder's insert of a second payout into a table bound to a scope is refused, and
// so is a write that presents no token.
func TestATableBoundToAScopeRefusesAStaleInsertAndATokenlessWrite(t *testing.T) {
	ctx, conn := connect(t)
	table := "go_ledger_" + testenv.RandomSuffix()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, account bigint, amount bigint)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+table) })
	scope, err := postgres.NewScope("go-" + table)
	if err != nil {
		t.Fatal(err)
	}
	if err := scope.Enable(ctx, conn, table); err != nil {
		t.Fatal(err)
	}
	pay := func(token int64) error {
		tx, err := scope.Begin(ctx, conn, token)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (account, amount) VALUES (42, 100)"); err != nil {
			return postgres.Check(err)
		}
		return postgres.Check(tx.Commit(ctx))
	}
	if err := pay(8); err != nil {
		t.Fatal(err)
	}
	err = pay(7)
	var f *fence.Fenced
	if !errors.As(err, &f) || f.Presented != 7 || f.Highest != 8 || f.Scope != scope.String() {
		t.Fatalf("err = %v, want Fenced{%s, 7, 8}", err, scope)
	}
	_, err = conn.Exec(ctx, "UPDATE "+table+" SET amount = 0")
	if err := postgres.Check(err); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("a tokenless update: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d payouts, %v", n, err)
	}
	if highest, ok, err := scope.Highest(ctx, conn); err != nil || !ok || highest != 8 {
		t.Fatalf("Highest = %d, %v, %v", highest, ok, err)
	}
}
