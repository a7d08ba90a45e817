package fence

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Stamp puts obj under lease's fence and stamps it with token: the label fencing.dev/lease
// and the annotation fencing.dev/token. The apiserver then refuses the write if token is
// lower than the one stored on the object, or than the lease's current token.
func Stamp(obj metav1.Object, lease string, token int64) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1alpha1.LeaseLabel] = lease
	obj.SetLabels(labels)
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[v1alpha1.TokenAnnotation] = strconv.FormatInt(token, 10)
	obj.SetAnnotations(annotations)
}

// StampPatch is a merge patch that stamps an object (label and annotation).
func StampPatch(lease string, token int64) map[string]any {
	return map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{v1alpha1.LeaseLabel: lease},
		"annotations": map[string]any{v1alpha1.TokenAnnotation: strconv.FormatInt(token, 10)},
	}}
}

// TokenOf is the token stamped on obj, if it carries a well-formed one.
func TokenOf(obj metav1.Object) (int64, bool) {
	v, ok := obj.GetAnnotations()[v1alpha1.TokenAnnotation]
	if !ok {
		return 0, false
	}
	t, err := strconv.ParseInt(v, 10, 64)
	return t, err == nil && t >= 0
}

// FromAPIError turns a refusal by the fencing policies into *Fenced (a lower token) or
// *NotHolder (a pod that does not hold the lease); any other error is returned as it is.
func FromAPIError(err error) error {
	if err == nil || !apierrors.IsForbidden(err) {
		return err
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return err
	}
	_, what, found := strings.Cut(status.Status().Message, "fenced: ")
	if !found {
		return err
	}
	if presented, highest, ok := refusedTokens(what); ok {
		return &Fenced{Presented: presented, Highest: highest}
	}
	if strings.Contains(what, " does not hold FencedLease ") {
		return &NotHolder{Message: what}
	}
	return err
}

// refusedTokens reads "... fencing.dev/token <presented> is lower than <highest>...".
func refusedTokens(message string) (int64, int64, bool) {
	_, rest, ok := strings.Cut(message, v1alpha1.TokenAnnotation+" ")
	if !ok {
		return 0, 0, false
	}
	presentedText, rest, ok := strings.Cut(rest, " is lower than ")
	if !ok {
		return 0, 0, false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	presented, err1 := strconv.ParseInt(presentedText, 10, 64)
	highest, err2 := strconv.ParseInt(rest[:end], 10, 64)
	return presented, highest, err1 == nil && err2 == nil
}

// Delete deletes a fenced object as the holder of token: stamps the token with a patch
// (which the policies check), then deletes on exactly the version that patch wrote, so that
// no write of another holder can come in between. obj names the object; it is updated with
// the stamped version.
func Delete(ctx context.Context, c client.Client, obj client.Object, lease string, token int64) error {
	if err := checkToken(token); err != nil {
		return err
	}
	patch, err := jsonMerge(StampPatch(lease, token))
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		return FromAPIError(err)
	}
	rv, uid := obj.GetResourceVersion(), obj.GetUID()
	pre := client.Preconditions{ResourceVersion: &rv, UID: &uid}
	return FromAPIError(c.Delete(ctx, obj, pre))
}
