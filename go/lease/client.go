package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	eventsclient "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
)

// Client reads FencedLeases and writes, heartbeats and watches this holder's
// FencedLeaseClaims, and reports the refusals of its writes as Events (Lease.Refusal). Build
// one per process with NewClient and share it.
type Client struct {
	rest   rest.Interface
	events eventsclient.EventsV1Interface
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err) // only fails on a programming error in AddToScheme
	}
	return s
}()

// NewClient is a client of the fencing.dev API for config. Requests carry per-call
// timeouts of their own, so config.Timeout may stay zero.
func NewClient(config *rest.Config) (*Client, error) {
	c := rest.CopyConfig(config)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent() + " fenced-lease-go"
	}
	if c.QPS == 0 {
		c.QPS, c.Burst = 50, 100
	}
	r, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("fencing.dev client: %w", err)
	}
	events, err := eventsclient.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("events.k8s.io client: %w", err)
	}
	return &Client{rest: r, events: events}, nil
}

func (c *Client) getLease(ctx context.Context, ns, name string) (*v1alpha1.FencedLease, error) {
	out := &v1alpha1.FencedLease{}
	err := c.rest.Get().Namespace(ns).Resource(v1alpha1.LeasesResource).Name(name).Do(ctx).Into(out)
	return out, err
}

// getClaim reads a claim with a list by name: the holder Role grants list and watch on
// claims, not get.
func (c *Client) getClaim(ctx context.Context, ns, name string) (*v1alpha1.FencedLeaseClaim, error) {
	list := &v1alpha1.FencedLeaseClaimList{}
	opts := &metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	err := c.rest.Get().Namespace(ns).Resource(v1alpha1.ClaimsResource).
		VersionedParams(opts, metav1.ParameterCodec).Do(ctx).Into(list)
	if err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		gr := schema.GroupResource{Group: v1alpha1.Group, Resource: v1alpha1.ClaimsResource}
		return nil, apierrors.NewNotFound(gr, name)
	}
	return &list.Items[0], nil
}

func (c *Client) createClaim(ctx context.Context, claim *v1alpha1.FencedLeaseClaim) (*v1alpha1.FencedLeaseClaim, error) {
	out := &v1alpha1.FencedLeaseClaim{}
	err := c.rest.Post().Namespace(claim.Namespace).Resource(v1alpha1.ClaimsResource).Body(claim).Do(ctx).Into(out)
	return out, err
}

func (c *Client) patchClaim(ctx context.Context, ns, name string, patch []byte) (*v1alpha1.FencedLeaseClaim, error) {
	out := &v1alpha1.FencedLeaseClaim{}
	err := c.rest.Patch(types.MergePatchType).Namespace(ns).Resource(v1alpha1.ClaimsResource).Name(name).
		Body(patch).Do(ctx).Into(out)
	return out, err
}

func (c *Client) deleteClaim(ctx context.Context, ns, name string) error {
	return c.rest.Delete().Namespace(ns).Resource(v1alpha1.ClaimsResource).Name(name).Do(ctx).Error()
}

// watchOne watches the object name of resource from resourceVersion rv on.
func (c *Client) watchOne(ctx context.Context, ns, resource, name, rv string) (watch.Interface, error) {
	timeout := int64((4*time.Minute + time.Duration(randFloat()*float64(time.Minute))) / time.Second)
	opts := &metav1.ListOptions{
		Watch:           true,
		FieldSelector:   "metadata.name=" + name,
		ResourceVersion: rv,
		TimeoutSeconds:  &timeout,
	}
	return c.rest.Get().Namespace(ns).Resource(resource).
		VersionedParams(opts, metav1.ParameterCodec).Watch(ctx)
}

// LeaseDuration is the spec.leaseDurationSeconds of FencedLease namespace/name: the duration
// of its next term (a running term keeps the one it was granted with). A missing lease is
// an error matching ErrLeaseNotFound.
func (c *Client) LeaseDuration(ctx context.Context, namespace, name string) (time.Duration, error) {
	l, err := c.getLease(ctx, namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return 0, &Error{Kind: ErrLeaseNotFound, What: "FencedLease " + namespace + "/" + name, Err: err}
		}
		return 0, fromAPI("get FencedLease "+namespace+"/"+name, err)
	}
	return viewLease(l).specDuration, nil
}
