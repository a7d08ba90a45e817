package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/fence"
	pgfence "github.com/fenced-lease/fenced-lease/go/fence/postgres"
	redisfence "github.com/fenced-lease/fenced-lease/go/fence/redis"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writeTimeout is the longest wait for one write's answer; past it the outcome is unknown.
const writeTimeout = 5 * time.Second

// resource is a fenced resource as the suite's history.rs names it. The Go holders write the
// three that order writes by token; the follow holder (followmode.go) also writes the workload
// its lease fences by kind (identity alone), as the Rust holders and kubectl fence's do.
type resource string

const (
	kubeObject  resource = "kube"
	postgresRow resource = "postgres"
	redisKey    resource = "redis"
	workload    resource = "workload"
)

// rounds is the order the holder writes in, round after round.
var rounds = []resource{kubeObject, postgresRow, redisKey}

// resources holds the connections to the fenced resources, and names them as the runner
// (tests/safety/jepsen/writes.rs) does when it creates them.
type resources struct {
	namespace string
	kube      kubernetes.Interface
	api       client.Client
	table     *pgfence.Table
	pgURL     string
	pgMu      sync.Mutex
	pg        *pgx.Conn
	redis     *goredis.Client
	writes    uint64
	process   string
}

func newResources(s settings, config *rest.Config) (*resources, error) {
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	api, err := client.New(config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	redisOptions, err := goredis.ParseURL(s.redis)
	if err != nil {
		return nil, fmt.Errorf("FL_REDIS_URL: %w", err)
	}
	return &resources{
		namespace: s.namespace, kube: kube, api: api, process: s.process,
		table: pgfence.NewTable("jepsen_"+strings.ReplaceAll(s.namespace, "-", "_"), "lease"),
		pgURL: s.postgres, redis: goredis.NewClient(redisOptions),
	}, nil
}

func (r *resources) close() {
	_ = r.redis.Close()
	r.pgMu.Lock()
	defer r.pgMu.Unlock()
	if r.pg != nil {
		_ = r.pg.Close(context.Background())
	}
}

// key names what write n, of res for lease, changes.
func (r *resources) key(res resource, lease string, n uint64) string {
	switch res {
	case workload:
		key, _, _ := workloadPatch(lease, "", n)
		return key
	case kubeObject:
		return "jepsen-" + lease
	case redisKey:
		return r.namespace + ":{" + lease + "}"
	}
	return lease
}

// write writes token to res for lease, recording the attempt and its outcome. Reports
// whether a fence refused it.
func (r *resources) write(rec *recorder, res resource, lease string, token int64) bool {
	n := r.writes
	id := fmt.Sprintf("%s#%d", r.process, n)
	r.writes++
	key := r.key(res, lease, n)
	attempt := event{"ev": "write-attempt", "id": id, "resource": string(res), "key": key, "lease": lease, "token": token}
	if res == workload {
		attempt["how"] = "merge (client-go)"
	}
	rec.record(attempt)
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	seq, err := r.send(ctx, res, key, lease, token, id, n)
	t := monotonic()
	var fenced *fence.Fenced
	var notHolder *fence.NotHolder
	switch {
	case err == nil:
		rec.recordAt(t, event{"ev": "write-accepted", "id": id, "seq": seq})
		return false
	case errors.As(err, &fenced):
		rec.recordAt(t, event{"ev": "write-refused", "id": id, "highest": fenced.Highest})
		return true
	case errors.As(err, &notHolder):
		rec.recordAt(t, event{"ev": "write-refused", "id": id, "highest": 0, "not_holder": notHolder.Message})
		return true
	case ctx.Err() != nil:
		rec.recordAt(t, event{"ev": "write-failed", "id": id, "error": fmt.Sprintf("no answer within %v", writeTimeout)})
	default:
		rec.recordAt(t, event{"ev": "write-failed", "id": id, "error": err.Error()})
	}
	return false
}

// send makes one write; seq is the resource's own order of it when the answer carries one.
func (r *resources) send(ctx context.Context, res resource, key, lease string, token int64, id string, n uint64) (seq *uint64, err error) {
	switch res {
	case workload:
		if err := r.patchWorkload(ctx, lease, id, n); err != nil {
			return nil, fence.FromAPIError(err)
		}
		return nil, nil
	case kubeObject:
		patch := fence.StampPatch(lease, token)
		patch["data"] = map[string]any{"write": id}
		body, err := json.Marshal(patch)
		if err != nil {
			return nil, err
		}
		cm, err := r.kube.CoreV1().ConfigMaps(r.namespace).Patch(ctx, key, types.MergePatchType, body, metav1.PatchOptions{})
		if err != nil {
			return nil, fence.FromAPIError(err)
		}
		if rv, err := strconv.ParseUint(cm.ResourceVersion, 10, 64); err == nil {
			return &rv, nil
		}
		return nil, nil
	case postgresRow:
		r.pgMu.Lock()
		defer r.pgMu.Unlock()
		if r.pg == nil || r.pg.IsClosed() {
			if r.pg, err = pgx.Connect(ctx, r.pgURL); err != nil {
				r.pg = nil
				return nil, fmt.Errorf("connect: %w", err)
			}
		}
		return nil, r.table.Update(ctx, r.pg, []any{lease}, map[string]any{"last_write": id}, token)
	case redisKey:
		reply, err := redisfence.Call(ctx, r.redis, key, token, "RPUSH", fmt.Sprintf("%d %s", token, id))
		if err != nil {
			return nil, err
		}
		n, ok := reply.(int64)
		if !ok || n < 0 {
			return nil, fmt.Errorf("unexpected reply %v", reply)
		}
		length := uint64(n)
		return &length, nil
	}
	return nil, fmt.Errorf("unknown resource %q", res)
}

// leaseMovedOn reads the lease from the store (not a cache): its state as a history event,
// when a token above token has been issued.
func (r *resources) leaseMovedOn(ctx context.Context, name string, token int64) (event, bool) {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	var l v1alpha1.FencedLease
	if err := r.api.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: name}, &l); err != nil {
		return nil, false
	}
	if l.Status == nil || l.Status.FencingToken <= token {
		return nil, false
	}
	rv, _ := strconv.ParseUint(l.ResourceVersion, 10, 64)
	state := event{
		"ev": "lease-state", "lease": name, "uid": string(l.UID), "rv": rv,
		"holder": nil, "identity": nil, "token": l.Status.FencingToken,
		"term": l.Status.LeaseDurationSeconds, "waiting": l.Status.Waiting,
	}
	if h := l.Status.Holder; h != nil {
		state["holder"], state["identity"] = claimOf(h), h.Identity
		if h.Lease != nil {
			state["follows"] = h.Lease.Name
		}
		if h.PodUID != nil {
			state["pod"] = *h.PodUID
		}
	}
	return state, true
}
