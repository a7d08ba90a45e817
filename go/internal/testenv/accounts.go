package testenv

import (
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ServiceAccountConfig creates ServiceAccount name in ns (bound to nothing) and returns a
// config that authenticates as it, with a token from the TokenRequest API.
func ServiceAccountConfig(t testing.TB, admin *rest.Config, ns, name string) *rest.Config {
	t.Helper()
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := Call()
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceAccount: %v", err)
	}
	seconds := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = tr.Status.Token
	return cfg
}
