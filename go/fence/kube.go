package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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
// *NotHolder (a pod that does not hold the lease), each wrapping the apiserver's 403 so that
// apierrors.IsForbidden still holds; any other error is returned as it is.
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
		return &Fenced{Presented: presented, Highest: highest, Err: err}
	}
	if strings.Contains(what, " does not hold FencedLease ") {
		return &NotHolder{Message: what, Err: err}
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

// Delete deletes a fenced object as the holder of token, with opts as client.Delete takes
// them (propagation policy, grace period, preconditions, dry run, ...). It stamps the token
// with a merge patch, which the policies check and which carries the caller's
// preconditions, then deletes exactly the version that patch wrote, so that no write of
// another holder can come in between. obj names the object and is updated with the stamped
// version. A dry run is a dry run throughout: the policies judge the stamp, nothing is
// written, obj is left as it was. A UID precondition that does not match is a 409 Conflict,
// as from client.Delete.
func Delete(ctx context.Context, c client.Client, obj client.Object, lease string, token int64, opts ...client.DeleteOption) error {
	if err := CheckToken(token); err != nil {
		return err
	}
	do := (&client.DeleteOptions{}).ApplyOptions(opts)
	stamp := StampPatch(lease, token)
	meta := stamp["metadata"].(map[string]any)
	pre := metav1.Preconditions{}
	if do.Preconditions != nil {
		pre = *do.Preconditions
	}
	if pre.ResourceVersion != nil {
		meta["resourceVersion"] = *pre.ResourceVersion
	}
	if pre.UID != nil {
		meta["uid"] = string(*pre.UID)
	}
	patch, err := jsonMerge(stamp)
	if err != nil {
		return err
	}
	target, patchOpts := obj, []client.PatchOption(nil)
	dryRun := len(do.DryRun) > 0
	if dryRun {
		target = obj.DeepCopyObject().(client.Object)
		patchOpts = append(patchOpts, client.DryRunAll)
	}
	if err := c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch), patchOpts...); err != nil {
		if pre.UID != nil && uidRefused(err) {
			gr := schema.GroupResource{Group: target.GetObjectKind().GroupVersionKind().Group}
			return apierrors.NewConflict(gr, obj.GetName(), fmt.Errorf("precondition failed: UID in precondition: %v: %w", *pre.UID, err))
		}
		return FromAPIError(err)
	}
	if !dryRun {
		// The version the stamp wrote: the delete applies to it or fails.
		rv, uid := target.GetResourceVersion(), target.GetUID()
		pre = metav1.Preconditions{ResourceVersion: &rv, UID: &uid}
	}
	return FromAPIError(c.Delete(ctx, obj, append(opts, client.Preconditions(pre))...))
}

// uidRefused: the apiserver refused a patch because it would change metadata.uid, which is
// how a stamp patch carrying a UID precondition fails on another object of the same name.
func uidRefused(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == "metadata.uid" {
			return true
		}
	}
	return false
}
