package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TokenSource gives the current fencing token, or an error once the lease is not held:
// *lease.Lease and *election.LeaderElector are token sources.
type TokenSource interface {
	Token() (int64, error)
}

// FixedToken is a TokenSource that always gives the same token: for unit tests of code that
// writes under a lease, e.g. a reconciler with controller-runtime's fake client,
// NewClient(fake.NewClientBuilder().Build(), "my-lease", fence.FixedToken(7)).
type FixedToken int64

// Token is t.
func (t FixedToken) Token() (int64, error) { return int64(t), nil }

// ErrUnstampable is a write the stamping client cannot stamp (a JSON patch, a collection
// delete). Use a merge patch, or delete objects one by one.
var ErrUnstampable = errors.New("this write cannot carry a fencing token")

// NewClient wraps c so that every write is fenced by lease: before each write it takes the
// token from tokens (and refuses to write, with the token source's error, once the lease is
// not held), stamps it on the object (Create, Update, Patch, Apply; Delete stamps then
// deletes on that version, see Delete), and turns the apiserver's fencing refusals into
// *Fenced or *NotHolder, which wrap the apiserver's 403 (apierrors.IsForbidden holds).
// Every option of a wrapped call reaches the apiserver as it would without the wrapper: dry
// run, field owner, force, field validation, propagation policy, grace period,
// preconditions. Reads go straight to c.
//
// What it cannot stamp:
//   - a JSON patch (types.JSONPatchType): ErrUnstampable; use a merge patch;
//   - DeleteAllOf: ErrUnstampable; delete objects one by one;
//   - subresource writes (status, scale, eviction...): the apiserver keeps the stored
//     metadata. They are checked against the token source before they are sent, and fenced
//     by the writer's identity when the lease names their kind in spec.fence.
func NewClient(c client.Client, lease string, tokens TokenSource) client.Client {
	return &stampingClient{Client: c, lease: lease, tokens: tokens}
}

type stampingClient struct {
	client.Client
	lease  string
	tokens TokenSource
}

func (s *stampingClient) token() (int64, error) {
	t, err := s.tokens.Token()
	if err != nil {
		return 0, fmt.Errorf("not writing under FencedLease %s: %w", s.lease, err)
	}
	return t, CheckToken(t)
}

func (s *stampingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	t, err := s.token()
	if err != nil {
		return err
	}
	Stamp(obj, s.lease, t)
	return FromAPIError(s.Client.Create(ctx, obj, opts...))
}

func (s *stampingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	t, err := s.token()
	if err != nil {
		return err
	}
	Stamp(obj, s.lease, t)
	return FromAPIError(s.Client.Update(ctx, obj, opts...))
}

func (s *stampingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	t, err := s.token()
	if err != nil {
		return err
	}
	Stamp(obj, s.lease, t)
	return FromAPIError(s.Client.Patch(ctx, obj, stampedPatch{patch, StampPatch(s.lease, t)}, opts...))
}

func (s *stampingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	t, err := s.token()
	if err != nil {
		return err
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return err
	}
	Stamp(u, s.lease, t)
	applied := client.ApplyConfigurationFromUnstructured(u)
	if err := s.Client.Apply(ctx, applied, opts...); err != nil {
		return FromAPIError(err)
	}
	// As client.Apply does, obj gets the object the apiserver answered with.
	if answer, err := u.MarshalJSON(); err == nil {
		_ = json.Unmarshal(answer, obj)
	}
	return nil
}

func (s *stampingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	t, err := s.token()
	if err != nil {
		return err
	}
	return Delete(ctx, s.Client, obj, s.lease, t, opts...)
}

func (s *stampingClient) DeleteAllOf(context.Context, client.Object, ...client.DeleteAllOfOption) error {
	return fmt.Errorf("DeleteAllOf under FencedLease %s: %w", s.lease, ErrUnstampable)
}

func (s *stampingClient) Status() client.SubResourceWriter {
	return &checkedWriter{SubResourceWriter: s.Client.Status(), s: s}
}

func (s *stampingClient) SubResource(name string) client.SubResourceClient {
	inner := s.Client.SubResource(name)
	return &checkedSubResource{SubResourceClient: inner, w: &checkedWriter{SubResourceWriter: inner, s: s}}
}

// stampedPatch adds the stamp to a merge, strategic-merge or apply patch.
type stampedPatch struct {
	client.Patch
	stamp map[string]any
}

func (p stampedPatch) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	switch p.Type() {
	case types.MergePatchType, types.StrategicMergePatchType, types.ApplyPatchType, types.ApplyCBORPatchType:
	default:
		return nil, fmt.Errorf("a %s patch: %w (use a merge patch)", p.Type(), ErrUnstampable)
	}
	if p.Type() == types.ApplyCBORPatchType {
		return data, nil // the object was stamped before it was encoded
	}
	var body map[string]any
	if err := json.Unmarshal(data, &body); err != nil {
		return nil, fmt.Errorf("stamping a patch: %w", err)
	}
	merge(body, p.stamp)
	return json.Marshal(body)
}

// merge copies src into dst, recursively for nested objects.
func merge(dst, src map[string]any) {
	for k, v := range src {
		sub, isMap := v.(map[string]any)
		have, hasMap := dst[k].(map[string]any)
		if isMap && hasMap {
			merge(have, sub)
			continue
		}
		dst[k] = v
	}
}

func jsonMerge(patch map[string]any) ([]byte, error) { return json.Marshal(patch) }

// checkedWriter refuses a subresource write once the lease is not held.
type checkedWriter struct {
	client.SubResourceWriter
	s *stampingClient
}

func (w *checkedWriter) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if _, err := w.s.token(); err != nil {
		return err
	}
	return FromAPIError(w.SubResourceWriter.Create(ctx, obj, sub, opts...))
}

func (w *checkedWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if _, err := w.s.token(); err != nil {
		return err
	}
	return FromAPIError(w.SubResourceWriter.Update(ctx, obj, opts...))
}

func (w *checkedWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if _, err := w.s.token(); err != nil {
		return err
	}
	return FromAPIError(w.SubResourceWriter.Patch(ctx, obj, patch, opts...))
}

func (w *checkedWriter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	if _, err := w.s.token(); err != nil {
		return err
	}
	return FromAPIError(w.SubResourceWriter.Apply(ctx, obj, opts...))
}

type checkedSubResource struct {
	client.SubResourceClient
	w *checkedWriter
}

func (c *checkedSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return c.w.Create(ctx, obj, sub, opts...)
}

func (c *checkedSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return c.w.Update(ctx, obj, opts...)
}

func (c *checkedSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return c.w.Patch(ctx, obj, patch, opts...)
}

func (c *checkedSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return c.w.Apply(ctx, obj, opts...)
}
