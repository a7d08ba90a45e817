package fence_test

import (
	"context"
	"testing"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/lock"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// A reconciler's writes are unit-tested without a cluster: the stamping client over
// controller-runtime's fake client, a FixedToken in place of the lock, also in the context.
func TestAReconcilerIsTestedWithoutACluster(t *testing.T) {
	ctx := lock.WithTokens(context.Background(), fence.FixedToken(7))
	c := fence.NewClient(fake.NewClientBuilder().Build(), "payouts", lock.TokensFrom(ctx))
	if err := c.Create(ctx, configMap("default", "ledger")); err != nil {
		t.Fatal(err)
	}
	got := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "ledger"}, got); err != nil {
		t.Fatal(err)
	}
	if tok, ok := fence.TokenOf(got); !ok || tok != 7 || got.Labels["fencing.dev/lease"] != "payouts" {
		t.Fatalf("stamped %d %v, labels %v", tok, ok, got.Labels)
	}
	if err := c.Delete(ctx, got, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
}
