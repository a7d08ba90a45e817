package fence_test

import (
	"context"
	"slices"
	"testing"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// keep is a finalizer of the tests' own, so that a deleted object stays to be looked at.
const keep = "test.fencing.dev/keep"

// A delete through the stamping client does what the same delete does without it: a
// foreground delete leaves the owner waiting for its dependents, a dry run writes nothing,
// stale preconditions are a Conflict and write nothing.
func TestTheStampingClientDeletesWithTheCallersOptions(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-fence-delete")
	ctx := testenv.Ctx(t, 2*testenv.APITimeout)
	stamping := fence.NewClient(admin, "db", fixed{token: 9})
	for _, c := range []struct {
		name string
		c    client.Client
	}{{"plain", admin}, {"stamping", stamping}} {
		t.Run(c.name, func(t *testing.T) {
			create := func(name string, finalizers ...string) *corev1.ConfigMap {
				cm := configMap(ns, c.name+"-"+name)
				cm.Finalizers = finalizers
				if err := c.c.Create(ctx, cm); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unfinalize(admin, cm) })
				return cm
			}
			stored := func(cm *corev1.ConfigMap) *corev1.ConfigMap {
				got := &corev1.ConfigMap{}
				if err := admin.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
					t.Fatalf("%s: %v", cm.Name, err)
				}
				return got
			}

			dry := create("dry")
			if err := c.c.Delete(ctx, dry.DeepCopy(), client.DryRunAll); err != nil {
				t.Fatalf("dry-run delete: %v", err)
			}
			if got := stored(dry); got.ResourceVersion != dry.ResourceVersion || got.DeletionTimestamp != nil {
				t.Fatalf("a dry-run delete wrote: resourceVersion %s -> %s, deleted at %v", dry.ResourceVersion, got.ResourceVersion, got.DeletionTimestamp)
			}

			owner := create("owner")
			dependent := configMap(ns, c.name+"-dependent")
			dependent.Finalizers = []string{keep} // it stays, so the owner waits for it
			dependent.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, BlockOwnerDeletion: new(true),
			}}
			if err := admin.Create(ctx, dependent); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unfinalize(admin, dependent) })
			if err := c.c.Delete(ctx, owner.DeepCopy(), client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
				t.Fatalf("foreground delete: %v", err)
			}
			if got := stored(owner); got.DeletionTimestamp == nil || !slices.Contains(got.Finalizers, metav1.FinalizerDeleteDependents) {
				t.Fatalf("after a foreground delete the owner has deletionTimestamp %v, finalizers %v", got.DeletionTimestamp, got.Finalizers)
			}

			pre := create("preconditions")
			oldRV, otherUID := "1", types.UID("00000000-0000-0000-0000-000000000000")
			for _, p := range []client.Preconditions{{ResourceVersion: &oldRV}, {UID: &otherUID}} {
				if err := c.c.Delete(ctx, pre.DeepCopy(), p); !apierrors.IsConflict(err) {
					t.Fatalf("delete with preconditions %+v: %v, want a Conflict", p, err)
				}
			}
			if got := stored(pre); got.ResourceVersion != pre.ResourceVersion || got.DeletionTimestamp != nil {
				t.Fatalf("a delete with failed preconditions wrote: resourceVersion %s -> %s", pre.ResourceVersion, got.ResourceVersion)
			}
			rv, uid := pre.ResourceVersion, pre.UID
			if err := c.c.Delete(ctx, pre.DeepCopy(), client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
				t.Fatalf("delete with preconditions that hold: %v", err)
			}
		})
	}
}

// Create, Update, Patch and Apply through the stamping client honour dry run and field
// owner, and a fencing refusal is still a 403 to apierrors.
func TestTheStampingClientWritesWithTheCallersOptions(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-fence-options")
	ctx := testenv.Ctx(t, testenv.APITimeout)
	s := fence.NewClient(admin, "db", fixed{token: 9})
	absent := func(name string) {
		t.Helper()
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s after a dry run: %v", name, err)
		}
	}
	if err := s.Create(ctx, configMap(ns, "dry"), client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	absent("dry")
	if err := s.Apply(ctx, corev1ac.ConfigMap("dry-applied", ns).WithData(map[string]string{"v": "a"}), client.FieldOwner("t"), client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	absent("dry-applied")

	cm := configMap(ns, "owned")
	if err := s.Create(ctx, cm, client.FieldOwner("creator")); err != nil {
		t.Fatal(err)
	}
	cm.Data["v"] = "1"
	if err := s.Update(ctx, cm, client.FieldOwner("updater")); err != nil {
		t.Fatal(err)
	}
	raw := client.RawPatch(types.MergePatchType, []byte(`{"data":{"w":"2"}}`))
	if err := s.Patch(ctx, cm, raw, client.FieldOwner("patcher")); err != nil {
		t.Fatal(err)
	}
	applied := corev1ac.ConfigMap("owned", ns).WithData(map[string]string{"x": "3"})
	if err := s.Apply(ctx, applied, client.FieldOwner("applier"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if applied.ResourceVersion == nil || *applied.ResourceVersion == cm.ResourceVersion {
		t.Fatalf("Apply did not give the object back: resourceVersion %v", applied.ResourceVersion)
	}
	managers := []string{}
	for _, f := range stored(ctx, t, admin, cm).ManagedFields {
		managers = append(managers, f.Manager)
	}
	for _, m := range []string{"creator", "updater", "patcher", "applier"} {
		if !slices.Contains(managers, m) {
			t.Fatalf("field managers %v lack %s", managers, m)
		}
	}
	cm = stored(ctx, t, admin, cm)
	before := cm.ResourceVersion
	cm.Data["v"] = "dry"
	if err := s.Update(ctx, cm, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if got := stored(ctx, t, admin, cm); got.Data["v"] == "dry" {
		t.Fatalf("a dry-run update was stored (resourceVersion %s -> %s)", before, got.ResourceVersion)
	}

	stale := fence.NewClient(admin, "db", fixed{token: 8})
	err := stale.Update(ctx, stored(ctx, t, admin, cm))
	wantFenced(t, err, 8, 9)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a fencing refusal is not a 403 to apierrors: %v", err)
	}
	err = stale.Delete(ctx, configMap(ns, "owned"))
	wantFenced(t, err, 8, 9)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("a fenced delete is not a 403 to apierrors: %v", err)
	}
}

func stored(ctx context.Context, t *testing.T, c client.Client, cm *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	got := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// unfinalize removes the test's finalizers so that the namespace can go.
func unfinalize(c client.Client, cm *corev1.ConfigMap) {
	ctx, cancel := testenv.Call()
	defer cancel()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	_ = c.Patch(ctx, cm.DeepCopy(), patch)
}
