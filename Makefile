# Tessera — the two commands a newcomer needs are `make demo` and `make test`.

GO ?= go
# The release and revision every binary make builds reports (tessera
# version), as the images stamp them (Go's own VCS stamp is off where
# GOFLAGS has -buildvcs=false).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS = -X github.com/tessera-gpu/tessera/pkg/version.Version=$(VERSION) -X github.com/tessera-gpu/tessera/pkg/version.Revision=$(REVISION)
OPENB ?= ../shared/traces/openb
# go-nvml's cgo preamble calls NVML functions NVIDIA has deprecated; the compiler's
# deprecation warnings (about 300 lines on a cold build) say nothing about Tessera.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: libtessera libtessera-test bench-libtessera c-compiler demo demo-sim test race test-short rules images manifests apt-lists browser web-screenshot soak bench bench-allocate bench-sim bench-scheduler fuzz build vet fmt-check openb openb-timeline e2e-node node-tools tessera-cli clean

## demo: a local playground cluster (4 simulated nodes × 8 H100s) with a sample workload; prints where each pod landed.
demo: tessera-cli
	./bin/tessera up --demo

# bin/tessera, stamped: make demo, soak and e2e-node run it.
tessera-cli:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/tessera ./cmd/tessera

## demo-sim: replay the built-in synthetic workload through every policy and print the summary.
demo-sim:
	$(GO) run ./cmd/tessera sim --seeds 42-46

## test: every test of the repository (vet, formatting and the Prometheus rules first); the openb replays need ../shared.
test: vet fmt-check rules libtessera-test apt-lists browser bin/prometheus bin/kube-state-metrics
	$(GO) test -count=1 -timeout 30m ./...
	@$(MAKE) --no-print-directory race

## libtessera: the preload library the agent puts in time-sliced GPU containers (libtessera/out/libtessera.so; Debian's C compiler).
libtessera: c-compiler
	$(MAKE) --no-print-directory -C libtessera

## libtessera-test: the library's tests against its fake driver, plain, under AddressSanitizer and under ThreadSanitizer; part of make test.
libtessera-test: c-compiler
	$(MAKE) --no-print-directory -C libtessera test

## bench-libtessera: the library's cost per allocation and per launch against the fake driver alone.
bench-libtessera: c-compiler
	$(MAKE) --no-print-directory -C libtessera bench

# The library and its sanitizer builds need a C compiler with the
# sanitizer runtimes; make installs Debian's when missing, as root only.
CC_WORKS = echo 'int main(void){return 0;}' | cc -x c -o /dev/null -
c-compiler:
	@if ! { $(CC_WORKS) -fsanitize=address,undefined && $(CC_WORKS) -fsanitize=thread; } 2>/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's C compiler and sanitizer runtimes (for libtessera)"; \
			(ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq) && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev libasan8 libubsan1 libtsan2 >/dev/null; \
		else echo "libtessera needs a C compiler with AddressSanitizer and ThreadSanitizer (Debian: apt-get install gcc libasan8 libubsan1 libtsan2)"; exit 1; fi; fi

## race: the tests of the packages where goroutines meet (scheduler, agent, preemption, playground) under the race detector; part of make test.
RACE_PKGS = ./pkg/scheduler/... ./pkg/agent/... ./pkg/preemption/... ./pkg/playground/...
race:
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)

# The image test fetches the agent's Debian packages with apt-get download,
# which needs apt's package lists; a fresh machine (CI) has none. Tests do not
# change the host, so make fetches them here, as root only.
apt-lists:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then \
		echo "fetching apt's package lists (for the agent image's Debian packages)"; apt-get update -qq; fi

# The web view's test drives Debian's chromium headless; make installs it
# when missing, as root only (elsewhere the test says how and skips).
browser:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium (for the web view's browser test)"; \
		(ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq) && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; fi

## web-screenshot: a screenshot of the web view (tessera top --web) on the demo workload, into out/web-view.png.
web-screenshot: browser
	TESSERA_WEB_SCREENSHOT=$(CURDIR)/out/web-view.png $(GO) test -count=1 -run TestWebViewInHeadlessChromium -v ./test/e2e/ | grep -E 'screenshot|PASS|FAIL|ok'

## rules: check and unit-test the shipped Prometheus rules with promtool (built from Go modules, pinned in hack/tools).
rules: bin/promtool
	cd deploy/prometheus && ../../bin/promtool check rules tessera-rules.yaml && ../../bin/promtool test rules tessera-rules_test.yaml

# promtool at the version hack/tools/go.mod pins, without Prometheus' service
# discovery plugins (rule checks need none of them, and they triple the build).
bin/promtool: hack/tools/go.mod hack/tools/go.sum
	@echo "building promtool from Go modules (hack/tools; a few minutes the first time)"
	cd hack/tools && $(GO) build -tags remove_all_sd -o ../../bin/promtool github.com/prometheus/prometheus/cmd/promtool

# Prometheus' server at the version hack/tools pins, for the end-to-end test
# that the shipped alerts fire from the playground's series as scraped.
bin/prometheus: hack/tools/go.mod hack/tools/go.sum
	@echo "building Prometheus from Go modules (hack/tools; a few minutes the first time)"
	cd hack/tools && $(GO) build -tags remove_all_sd -o ../../bin/prometheus github.com/prometheus/prometheus/cmd/prometheus

# kube-state-metrics at the version hack/tools/kube-state-metrics pins, for
# the end-to-end test of the alerts that read the agent DaemonSet's state.
bin/kube-state-metrics: hack/tools/kube-state-metrics/go.mod hack/tools/kube-state-metrics/go.sum
	@echo "building kube-state-metrics from Go modules (hack/tools/kube-state-metrics; a minute or two the first time)"
	cd hack/tools/kube-state-metrics && $(GO) build -o ../../../bin/kube-state-metrics k8s.io/kube-state-metrics/v2

## images: tessera-scheduler's and tessera-agent's OCI image archives, into out/images (no Docker, no registry; REGISTRY= to tag for yours).
REGISTRY ?= ghcr.io/tessera-gpu
images:
	$(GO) run ./hack/images --out out/images --registry $(REGISTRY)

## manifests: regenerate the plain manifests under deploy/ from the Helm chart (deploy/chart/tessera); make test fails when they drift.
manifests:
	$(GO) run ./hack/manifests

## test-short: the unit tests without the trace replays.
test-short:
	$(GO) test -short ./...

## build: the binaries, into bin/.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: the allocator's and the agent's Go benchmarks (compare runs with benchstat).
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/allocator/ ./pkg/agent/metrics/

## bench-allocate: Allocate through kubelet's device manager, Tessera's plugin vs a minimal one, interleaved (root).
bench-allocate:
	$(GO) test ./pkg/agent/deviceplugin/ -run '^$$' -bench AllocateThroughDeviceManager -benchtime 2000x -count 5

## bench-sim: time one policy × one seed over the openb default trace, cached and plain.
bench-sim: build
	@for p in fgd tessera; do /usr/bin/time -f "$$p: %e s, %M KB" ./bin/tessera sim --policy $$p --seeds 42 \
		--nodes $(OPENB)/openb_node_list_gpu_node.csv --pods $(OPENB)/openb_pod_list_default.csv >/dev/null; done
	@/usr/bin/time -f "fgd --plain: %e s" ./bin/tessera sim --policy fgd --seeds 42 --plain \
		--nodes $(OPENB)/openb_node_list_gpu_node.csv --pods $(OPENB)/openb_pod_list_default.csv >/dev/null

## bench-scheduler: tessera-scheduler throughput against the default profile, same run: 1,000 and 5,000 nodes × 8 GPUs, and 5,000 with 1,000 pods waiting and GPU pods deleted; and claim pods on 100 DRA nodes, TesseraGPU against upstream DynamicResources (BENCHCOUNT runs each, default 3).
BENCHCOUNT ?= 3
bench-scheduler:
	$(GO) test ./test/integration/ -run '^$$' -bench 'BenchmarkSchedulingThroughput|BenchmarkClaimSchedulingThroughput' -benchtime 1x -count $(BENCHCOUNT) -timeout 120m -v

## openb: the published comparison, seeds 42-51, on the four openb workloads.
openb: build
	@mkdir -p out
	@for w in default gpushare40 multigpu50 gpuspec10; do ./bin/tessera sim --policy all --seeds 42-51 \
		--nodes $(OPENB)/openb_node_list_gpu_node.csv --pods $(OPENB)/openb_pod_list_$$w.csv --out out/openb_$$w.csv || exit 1; done

## openb-timeline: the openb lists that carry times, replayed by them (every policy, seeds 42-44, arrivals SPEEDUP times as fast; default 1).
SPEEDUP ?= 1
openb-timeline: build
	@mkdir -p out
	@for w in default gpushare40 gpushare60 gpuspec10 gpuspec20 cpu100; do ./bin/tessera sim --timeline --speedup $(SPEEDUP) --policy all --seeds 42-44 \
		--nodes $(OPENB)/openb_node_list_gpu_node.csv --pods $(OPENB)/openb_pod_list_$$w.csv --out out/timeline_$$w.csv --plot out/timeline_$$w.png || exit 1; done

## soak: 10,000 events of churn and faults on a playground per seed (SEEDS), invariants checked after every step; prints a summary each.
SEEDS ?= 1 2 3
SOAK_EVENTS ?= 10000
soak: tessera-cli
	@for s in $(SEEDS); do ./bin/tessera soak --seed $$s --events $(SOAK_EVENTS) || exit 1; done

## fuzz: run every fuzz target for FUZZEXECS executions each (default 1,000,000; make test runs their seed corpora only).
FUZZEXECS ?= 1000000
FUZZ_TARGETS = ./pkg/gpu/:FuzzDecodeAssignment ./pkg/gpu/:FuzzDecodeInventory ./pkg/gpu/:FuzzParseModelList \
	./pkg/gpu/:FuzzParseSliceGuarantees ./pkg/apis/config/:FuzzLoad ./pkg/sim/:FuzzParsePods ./pkg/sim/:FuzzParseNodes \
	./pkg/cgroup/:FuzzParse ./pkg/forecast/:FuzzFit ./pkg/preemption/:FuzzAnnotations ./pkg/scheduler/:FuzzDecodeArgs \
	./pkg/patch/:FuzzAnnotations ./pkg/podgpu/:FuzzRequest
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg), $(FUZZEXECS) executions"; \
		out=$$($(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZEXECS)x 2>&1); rc=$$?; \
		echo "$$out" | grep -E 'execs: [0-9]+ \(|^(ok|FAIL|---)|Failing input|panic|hung|deadline|_test.go' | tail -6; [ $$rc = 0 ] || exit 1; \
	done

## e2e-node: the chart installed, as the README says, from make images' archives on a one-node cluster of real components (kubelet, containerd, runc, kube-proxy) in namespaces of its own, checked as an operator would, and the host compared before and after (root; docs/development.md#make-e2e-node).
E2E_REGISTRY ?= e2e.tessera.local
e2e-node: node-tools tessera-cli
	$(MAKE) --no-print-directory images REGISTRY=$(E2E_REGISTRY)
	$(GO) build -o bin/e2enode ./hack/e2enode
	./bin/e2enode --registry $(E2E_REGISTRY)

# The node's components, from Go modules at the versions hack/tools/node
# pins, stamped with their releases (unstamped, Kubernetes reports
# v0.0.0-master, which the chart's kubeVersion refuses); the pause image's
# program, static; and Debian's runc, CNI plugins and iptables.
NODE_TOOLS = etcd:./etcd kube-apiserver:k8s.io/kubernetes/cmd/kube-apiserver \
	kube-controller-manager:k8s.io/kubernetes/cmd/kube-controller-manager \
	kube-scheduler:k8s.io/kubernetes/cmd/kube-scheduler kubelet:k8s.io/kubernetes/cmd/kubelet \
	kube-proxy:k8s.io/kubernetes/cmd/kube-proxy kubectl:k8s.io/kubernetes/cmd/kubectl \
	containerd:github.com/containerd/containerd/v2/cmd/containerd \
	containerd-shim-runc-v2:github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	ctr:github.com/containerd/containerd/v2/cmd/ctr helm:helm.sh/helm/v4/cmd/helm
node-tools: bin/node/.built
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { command -v runc && command -v iptables && command -v ip && [ -x /usr/lib/cni/bridge ]; } >/dev/null; then \
		echo "installing Debian's runc, CNI plugins and iptables (for make e2e-node)"; \
		(ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq) && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc containernetworking-plugins iptables iproute2 >/dev/null; fi
bin/node/.built: hack/tools/node/go.mod hack/tools/node/go.sum hack/tools/node/etcd/main.go hack/e2enode/pause/main.go
	@echo "building the node's components from Go modules (hack/tools/node; several minutes the first time)"
	@mkdir -p bin/node
	@cd hack/tools/node && kube=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	ctrd=$$($(GO) list -m -f '{{.Version}}' github.com/containerd/containerd/v2) && \
	minor=$$(echo $$kube | cut -d. -f2) && \
	kubeflags="-X k8s.io/component-base/version.gitVersion=$$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$minor -X k8s.io/component-base/version.gitTreeState=clean" && \
	for t in $(NODE_TOOLS); do name=$${t%%:*}; pkg=$${t#*:}; start=$$(date +%s); \
		$(GO) build -tags no_btrfs -ldflags "$$kubeflags -X github.com/containerd/containerd/v2/version.Version=$${ctrd#v}" -o ../../../bin/node/$$name $$pkg || exit 1; \
		echo "  $$name: $$(( $$(date +%s) - start )) s"; done
	CGO_ENABLED=0 $(GO) build -o bin/node/pause ./hack/e2enode/pause
	@touch $@

clean:
	rm -rf bin out libtessera/out
