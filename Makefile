# vipd build, test and demo entry points. Tools (buf, protoc plugins, grpcurl)
# are pinned in tools/go.mod and run with `go tool`, so nothing is downloaded
# outside the Go module proxy.
GO       ?= go
TOOL     := $(GO) tool -modfile=$(CURDIR)/tools/go.mod
BIN      := $(CURDIR)/bin
GOTEST   ?= $(GO) test
TESTARGS ?= -count=1 -race -timeout 20m

.PHONY: all build test generate lint demo clean deps bench bench-quick

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

$(BIN)/grpcurl: tools/go.mod tools/go.sum
	$(GO) build -modfile=$(CURDIR)/tools/go.mod -o $(BIN)/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl

deps:
	./scripts/install-deps.sh

test: deps build
	$(GOTEST) $(TESTARGS) ./...

generate:
	cd proto && $(TOOL) buf generate
	$(GO) generate ./dataplane/ebpf/

lint:
	$(GO) vet ./...
	cd proto && $(TOOL) buf lint

# DATAPLANE picks vipd's dataplane for the demo: ebpf or iptables.
DATAPLANE ?= ebpf

demo: deps build $(BIN)/grpcurl
	$(GO) run ./internal/demo -bin $(BIN) -dataplane $(DATAPLANE)

# bench measures vipd against the direct path and a kube-proxy-shaped
# iptables ruleset and writes bench/RESULTS.md (about half an hour);
# bench-quick runs small sizes of every measurement and prints the tables.
bench: deps build
	$(GO) run ./bench/cmd/vipd-bench -vipd $(BIN)/vipd -out bench/RESULTS.md

bench-quick: deps build
	$(GO) run ./bench/cmd/vipd-bench -quick -vipd $(BIN)/vipd

clean:
	rm -rf $(BIN)
