# fenced-lease. `make test` is what CI runs; it installs or builds what it needs.
SHELL := bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: help demo demo-follow test test-node soak deps lint lint-rust fmt crds up down chart-sync chart-test chart-readme compat monitoring-test image krew release bench bench-admission bench-fence bench-follow bench-guards bench-restart
help: ## show the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

demo: ## the double dividend: a paused lease holder's writes refused by the apiserver and PostgreSQL (builds only the control plane, the operator and the example)
	@hack/deps
	@hack/demo

demo-follow: ## an unmodified client-go leader election fenced by a FencedLease that follows its Lease: the paused leader's writes refused (under a minute once built)
	@hack/deps
	@hack/demo-follow

test: ## everything: lint, chart, alert rules, unit and integration tests (Rust and the Go module) against a real control plane, PostgreSQL and Redis, the compatibility suite on the oldest supported Kubernetes (hack/compat), and the pods on a real node (hack/test-node, as root); no test that measures time runs beside a build (hack/test)
	@hack/test

test-node: ## the project's pods on a real node (hack/test-node, as root): the packaged chart with Helm (two replicas of the image, helm test, the leader deleted and frozen, uninstall), the double dividend's workers as pods with one frozen, the token's delivery to a pod's files measured; the last step of test
	@hack/test-node

soak: deps ## the safety suite's long profile (tests/safety/jepsen), then the PostgreSQL guard's race as long: SEED=<n> DURATION=<20m> replay or lengthen a run
	@started=; hack/datastores status >/dev/null 2>&1 || started=1; \
	eval "$$(hack/datastores up)" && eval "$$(hack/control-plane up)" && \
	$(CARGO) test --locked --all-features --test jepsen -- --profile long $(if $(SEED),--seed $(SEED)) $(if $(DURATION),--duration $(DURATION)) && \
	FL_GUARD_RACE=$(or $(DURATION),20m) $(CARGO) test --locked --all-features --test cluster -- --exact fence::postgres::scopes::in_commit_order_no_lower_token_commits_after_a_higher_one_in_its_scope; \
	rc=$$?; [ -z "$$started" ] || hack/datastores down; exit $$rc

deps: ## Debian packages, Rust components, and the Go-built tools (hack/tools: the control plane, Helm, promtool, revive; cached)
	@hack/deps
	@hack/tools build

lint: lint-rust ## rustfmt and clippy, warnings are errors; the Go module's gofmt, go vet and revive (hack/go-lint)
	@hack/go-lint

lint-rust: ## rustfmt, clippy (every target with all features; the libraries and binaries with none) and the crates' docs, warnings are errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --all-targets --all-features -- -D warnings
	$(CARGO) clippy --locked --lib --bins -- -D warnings
	RUSTDOCFLAGS='-D warnings' $(CARGO) doc --locked --quiet --no-deps --all-features -p fenced-lease-api -p fenced-lease -p fenced-lease-operator -p kubectl-fence

fmt: ## format the code
	$(CARGO) fmt --all

crds: ## regenerate crds/ from the Rust types in crates/api/ (and the copies of the chart and the Go module)
	$(CARGO) run --locked --quiet --bin fenced-lease-crdgen -- --dir crds
	cp crds/*.yaml go/crds/
	@$(MAKE) --no-print-directory chart-sync

CHART := charts/fenced-lease
MONITORING := deploy/monitoring/alerts.yaml deploy/monitoring/dashboard.json
chart-sync: ## copy crds/, deploy/rbac/, deploy/admission/ and deploy/monitoring/ into the chart (tests/chart and chart-test fail until you do)
	rm -f $(CHART)/files/crds/*.yaml $(CHART)/files/rbac/*.yaml $(CHART)/files/admission/*.yaml $(CHART)/files/monitoring/*
	cp crds/*.yaml $(CHART)/files/crds/
	cp deploy/rbac/operator.yaml deploy/rbac/holder-role.yaml $(CHART)/files/rbac/
	if compgen -G 'deploy/admission/*.yaml' >/dev/null; then mkdir -p $(CHART)/files/admission && cp deploy/admission/*.yaml $(CHART)/files/admission/; fi
	mkdir -p $(CHART)/files/monitoring && cp $(MONITORING) $(CHART)/files/monitoring/

chart-test: ## the chart's copies of deploy/monitoring/ are current, its README's values table too; helm lint, helm template for the oldest and newest supported Kubernetes, helm-unittest
	@for f in $(MONITORING); do cmp -s $$f $(CHART)/files/monitoring/$${f##*/} || { echo "$(CHART)/files/monitoring/$${f##*/} differs from $$f: run make chart-sync" >&2; exit 1; }; done
	hack/chart-readme --check
	hack/helm helm lint --strict $(CHART)
	for v in 1.34.0 1.37.2; do hack/helm helm template fl $(CHART) --kube-version $$v >/dev/null || exit 1; done
	hack/helm unittest --strict $(CHART)

chart-readme: ## regenerate the values table of charts/fenced-lease/README.md from values.yaml (chart-test fails until you do)
	hack/chart-readme

compat: ## the compatibility suite alone: the promises that matter, on the oldest supported Kubernetes minor (hack/compat; a control plane of its own)
	@hack/compat

monitoring-test: ## promtool: check deploy/monitoring/alerts.yaml and run its unit tests (alerts_test.yaml)
	hack/promtool check rules deploy/monitoring/alerts.yaml
	hack/promtool test rules deploy/monitoring/alerts_test.yaml

image: ## the operator's image, FROM scratch, built without a daemon (a release build; not part of test)
	@hack/image

krew: ## the kubectl plugin's krew archive and manifest in target/krew/ (a release build; not part of test)
	@hack/krew

release: ## VERSION=x.y.z: everything a release publishes, built into dist/ with SHA256SUMS, then checked (hack/release; not part of test)
	@[ -n "$(VERSION)" ] || { echo "usage: make release VERSION=x.y.z" >&2; exit 2; }
	@hack/release build $(VERSION)

up: ## start the local control plane; then: eval "$$(hack/control-plane env)"
	@hack/control-plane up

down: ## stop the local control plane and remove its data
	@hack/control-plane down

bench: deps ## BENCHMARKS.md's tables in one run (not part of test; BENCH_* options: see hack/bench)
	@hack/bench

bench-admission: deps ## only the admission objects' cost at 0/1,000/10,000 fenced leases (bench-admission; BENCH_ADMISSION_SIZES, see hack/bench)
	@BENCH_ONLY=admission hack/bench

bench-fence: deps ## only the fences: the lease rules' window after a grant, guarded PostgreSQL and Redis writes beside unguarded ones (bench-fence, with hack/datastores)
	@BENCH_ONLY=fence hack/bench

bench-guards: ## only what a guard that fences a scope costs, beside the same writes unguarded (bench-guards; PostgreSQL and Redis, no control plane)
	@hack/deps
	@BENCH_ONLY=guards hack/bench

bench-follow: deps ## only the window of a lease that follows a coordination Lease, beside the operator-free window (bench-follow; BENCH_FOLLOW_CHANGES)
	@BENCH_ONLY=follow hack/bench

bench-restart: deps ## only the restart window: fenced writes admitted again after 20 apiserver and 10 etcd restarts, beside writes no fence matches (bench/restart_window.sh; a control plane of its own)
	@bench/restart_window.sh apiserver 20 && bench/restart_window.sh etcd 10

go-test: deps ## the Go module (go/): hack/go-lint, then its tests against the control plane, PostgreSQL, Redis and the operator
	@hack/go-lint
	@hack/go-test
