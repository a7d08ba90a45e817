package lease_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence/postgres"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/jackc/pgx/v5"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// pay appends a payout to table under token, in a transaction of its own.
func pay(ctx context.Context, conn *pgx.Conn, table string, token int64) error {
	tx, err := postgres.Begin(ctx, conn, token)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (account, amount) VALUES (42, 100)"); err != nil {
		return postgres.Check(err)
	}
	return postgres.Check(tx.Commit(ctx))
}

// The holder whose claim was deleted (lost) writes with its old token after the next holder
// did: PostgreSQL refuses twice, Refusal says NewerHolder, and the refusals are counted and
// reported as one WriteRefused Event on the lease whose series counts both.
func TestARefusedWriteIsLoggedCountedAndReportedOnTheLease(t *testing.T) {
	url := os.Getenv("FL_POSTGRES_URL")
	if url == "" {
		t.Fatal("FL_POSTGRES_URL is not set: eval \"$(hack/datastores up)\"")
	}
	e := setup(t, "go-refused", "payouts", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	table := "go_payouts_" + testenv.RandomSuffix()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, account bigint NOT NULL, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	scope, _ := postgres.NewScope("account-" + table)
	if err := scope.Enable(ctx, conn, table); err != nil {
		t.Fatal(err)
	}

	stale := e.acquire(t, ctx, "payouts", "stale")
	old := token(t, stale)
	e.deleteClaimOf(t, "stale")
	next := e.acquire(t, ctx, "payouts", "next")
	if err := pay(ctx, conn, table, token(t, next)); err != nil {
		t.Fatalf("the holder's payout: %v", err)
	}
	for range 2 {
		err := pay(ctx, conn, table, old)
		if got := stale.Refusal(err); got != lease.NewerHolder {
			t.Fatalf("Refusal(%v) = %v, want NewerHolder", err, got)
		}
	}
	if got := stale.Refusal(context.Canceled); got != lease.NotRefused {
		t.Fatalf("Refusal of an error that is no refusal = %v", got)
	}
	stale.Reported(ctx)

	var events eventsv1.EventList
	list, cancelList := testenv.Call()
	defer cancelList()
	if err := e.admin.List(list, &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	var reports []eventsv1.Event
	for _, ev := range events.Items {
		if ev.Reason == lease.WriteRefusedReason && ev.Regarding.Name == "payouts" {
			reports = append(reports, ev)
		}
	}
	if len(reports) != 1 || reports[0].Series == nil || reports[0].Series.Count != 2 {
		t.Fatalf("want one WriteRefused Event counting 2, got %+v", reports)
	}
	if r := reports[0]; r.ReportingController != lease.HolderReportingController || r.ReportingInstance == "" ||
		!strings.Contains(r.Note, "token "+itoa(old)+" is lower than") {
		t.Fatalf("the report does not name its sender and both tokens: %+v", r)
	}
	if n := counted(t, e.ns, "payouts"); n != 2 {
		t.Fatalf("fenced_lease_holder_write_refusals_total = %v, want 2", n)
	}
	release(t, next)
	release(t, stale)
}

// counted is fenced_lease_holder_write_refusals_total of lease ns/name in controller-runtime's
// registry.
func counted(t *testing.T, ns, name string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "fenced_lease_holder_write_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["lease"] == name {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
