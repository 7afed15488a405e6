# vipd build, test and demo entry points. Tools (buf, protoc plugins, grpcurl)
# are pinned in tools/go.mod and run with `go tool`, so nothing is downloaded
# outside the Go module proxy.
GO       ?= go
TOOL     := $(GO) tool -modfile=$(CURDIR)/tools/go.mod
BIN      := $(CURDIR)/bin
GOTEST   ?= $(GO) test
TESTARGS ?= -count=1 -race -timeout 20m

.PHONY: all build test generate lint demo clean deps bench bench-quick fuzz test-soak test-soak-full package kube-e2e

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

$(BIN)/grpcurl: tools/go.mod tools/go.sum
	$(GO) build -modfile=$(CURDIR)/tools/go.mod -o $(BIN)/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl

deps:
	./scripts/install-deps.sh

# test runs every package but the fault tests of test/soak, which
# test-soak runs in their short form (under 5 minutes; CI runs it) and
# test-soak-full in their 30-second form.
test: deps build
	$(GOTEST) $(TESTARGS) $$($(GO) list ./... | grep -v '/test/soak$$')

test-soak: deps
	$(GOTEST) -count=1 -timeout 10m ./test/soak/

test-soak-full: deps
	VIPD_SOAK=full $(GOTEST) -count=1 -timeout 30m ./test/soak/
	$(GO) test -run '^$$' -fuzz '^FuzzTornStateDir$$' -fuzztime 5m ./server/store/

# kube-e2e runs vipd-k8s (with deploy/kubernetes/rbac.yaml's rights) and
# vipd against a real etcd, kube-apiserver and EndpointSlice controller on
# loopback (test/kube, its own module). test/kube/controlplane/build.sh
# builds those binaries once into a directory beside the Go build cache
# and prints it; a later run with the same module only prints it. Nothing
# in it may skip: under CI=true a skipped test fails the target.
KUBE_TESTARGS ?= -count=1 -timeout 40m

kube-e2e:
	@set -e; bin=$$(test/kube/controlplane/build.sh); \
	echo "== control plane binaries: $$bin"; \
	out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	{ rc=0; cd test/kube && VIPD_KUBE_BIN=$$bin $(GO) test -p 1 -v $(KUBE_TESTARGS) ./... 2>&1 || rc=$$?; echo $$rc >"$$out/rc"; } | tee "$$out/log"; \
	if [ "$$CI" = true ] && grep -q -- '--- SKIP' "$$out/log"; then echo "kube-e2e: a test skipped under CI=true" >&2; exit 1; fi; \
	exit $$(cat "$$out/rc")

# fuzz runs every fuzz target for FUZZTIME each (package:target pairs; see
# scripts/fuzz.sh). A crasher is written under the package's testdata/fuzz
# and fails the run.
FUZZTIME ?= 30s
FUZZ_TARGETS := \
	./server/validation:FuzzUpsertService \
	./server/validation:FuzzSyncServices \
	./server/validation:FuzzUpdateBackends \
	./server/validation:FuzzFlowFilter \
	./server/validation:FuzzExplain \
	./server:FuzzAPI \
	./server/store:FuzzTornStateDir \
	./internal/manifest:FuzzLoad

fuzz:
	GO=$(GO) ./scripts/fuzz.sh $(FUZZTIME) $(FUZZ_TARGETS)

# buf.yaml (a workspace of the one module proto/) and buf.gen.yaml sit at
# the repository root, so buf runs from here.
generate:
	$(TOOL) buf generate
	$(GO) generate ./dataplane/ebpf/
	$(GO) generate ./bench/statelessdnat/

# lint fails on an incompatible API change: buf breaking compares the API
# with the last release tag, or without one with main (see
# scripts/buf-against.sh; BUF_AGAINST=<buf input> overrides).
lint:
	$(GO) vet ./...
	$(TOOL) buf lint
	@against=$$(./scripts/buf-against.sh) || exit 1; \
	if [ -n "$$against" ]; then \
		echo "$(TOOL) buf breaking --against '$$against'"; \
		$(TOOL) buf breaking --against "$$against"; \
	fi

# DATAPLANE picks vipd's dataplane for the demo: ebpf or iptables.
DATAPLANE ?= ebpf

demo: deps build $(BIN)/grpcurl
	$(GO) run ./cmd/vipd-demo -bin $(BIN) -dataplane $(DATAPLANE)

# bench measures vipd against the direct path and a kube-proxy-shaped
# iptables ruleset and writes bench/RESULTS.md (about half an hour);
# bench-quick runs small sizes of every measurement and prints the tables.
bench: deps build
	$(GO) run ./bench/cmd/vipd-bench -vipd $(BIN)/vipd -out bench/RESULTS.md

bench-quick: deps build
	$(GO) run ./bench/cmd/vipd-bench -quick -vipd $(BIN)/vipd

# package builds bin/vipd_<version>_amd64.deb with nfpm (deploy/package/
# nfpm.yaml): vipd and vipctl (static, with the version linked in), the
# systemd unit, a commented /etc/vipd/vipd.yaml and an empty
# /etc/vipd/services.d/. PKG_VERSION overrides the version from git.
PKG_VERSION ?= $(shell ./scripts/pkg-version.sh)
package:
	rm -rf $(BIN)/pkg $(BIN)/vipd_*.deb
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath \
		-ldflags "-s -w -X github.com/vipd/vipd/internal/version.version=$(PKG_VERSION)" \
		-o $(BIN)/pkg/ ./cmd/vipd ./cmd/vipctl
	PKG_VERSION=$(PKG_VERSION) $(TOOL) nfpm package --config deploy/package/nfpm.yaml --packager deb --target $(BIN)/

clean:
	rm -rf $(BIN)
