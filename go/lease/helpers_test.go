package lease_test

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

func metaOf(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
