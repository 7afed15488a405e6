# The image of deploy/kubernetes: vipd, vipctl and vipd-k8s, with the
# iptables tools the iptables dataplane runs. Build it from the repository's
# root: docker build -t ghcr.io/vipd/vipd:latest .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The eBPF objects and protobuf code are committed, so neither clang nor
# buf is needed here.
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/vipd ./cmd/vipctl ./cmd/vipd-k8s

FROM debian:trixie-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["vipd"]
CMD ["run"]
