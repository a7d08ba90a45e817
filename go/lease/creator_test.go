package lease_test

import (
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	rbacv1 "k8s.io/api/rbac/v1"
)

// A holder that is neither a cluster admin nor allowed to override (a ServiceAccount with the
// holder Role) stamps its claim with its creator, as a SelfSubjectReview names it: the
// claim-ownership policy refuses a claim without it where no MutatingAdmissionPolicy writes
// it (Kubernetes before 1.36; hack/compat runs this there).
func TestAServiceAccountHolderStampsItsCreator(t *testing.T) {
	e := setup(t, "go-creator", "db", 15)
	ctx := testenv.Ctx(t, time.Minute)
	role := &rbacv1.Role{
		ObjectMeta: metaOf(e.ns, "holder"),
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"fencing.dev"}, Resources: []string{"fencedleases"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"fencing.dev"}, Resources: []string{"fencedleaseclaims"}, Verbs: []string{"list", "watch", "create", "patch", "delete"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metaOf(e.ns, "holder"),
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "holder"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "worker", Namespace: e.ns}},
	}
	call, cancel := testenv.Call()
	defer cancel()
	if err := e.admin.Create(call, role); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.Create(call, binding); err != nil {
		t.Fatal(err)
	}
	sa := newClient(t, testenv.ServiceAccountConfig(t, e.cfg, e.ns, "worker"))
	var l *lease.Lease
	// RBAC bindings reach the authorizer with a delay.
	testenv.Eventually(t, "the ServiceAccount acquires", 20*time.Second, func() error {
		var err error
		l, err = lease.Acquire(ctx, sa, e.ns, "db", lease.Options{Identity: "worker", Wait: wait})
		return err
	})
	claim := e.claimsOf(t, "worker")[0]
	if got, want := claim.Annotations["fencing.dev/created-by"], "system:serviceaccount:"+e.ns+":worker"; got != want {
		t.Fatalf("fencing.dev/created-by = %q, want %q", got, want)
	}
	if _, ok := claim.Annotations["fencing.dev/created-by-pod"]; ok {
		t.Fatalf("a holder with no pod-bound token claims a pod: %v", claim.Annotations)
	}
	release(t, l)
}
