# oncegate's container image: a static binary on an empty base, run as a non-root user, with
# the embedded NATS server's store on the /data volume.
#
#   docker build -t oncegate .                 (or: buildah bud -t oncegate .)
#   docker run -p 8080:8080 -v oncegate-data:/data oncegate
#
# deploy/image_test.go builds this file with buildah and runs the image; the pages
# docs/operations/container.md and docs/operations/kubernetes.md say how to use it.

# The builder. GO_IMAGE is an argument so a machine that cannot pull from Docker Hub can
# name a local image with the same Go (the test does); a newer Go builds the same binary.
ARG GO_IMAGE=golang:1.26.8-bookworm

FROM ${GO_IMAGE} AS build
WORKDIR /src
# GOPROXY, when given, is where the modules come from (the test serves them from the host's
# module cache with file://; unset, Go's default proxy).
ARG GOPROXY
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# VERSION names the build in `oncegate version` (the image has no .git to read it from).
ARG VERSION=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X main.buildVersion=${VERSION}" -o /out/oncegate ./cmd/oncegate && \
    mkdir -p /out/data /out/etc && \
    echo 'nonroot:x:65532:65532:nonroot:/data:/sbin/nologin' > /out/etc/passwd && \
    echo 'nonroot:x:65532:' > /out/etc/group

# The image: nothing but the binary, the CA roots (for https backends), a user and /data.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/etc/passwd /out/etc/group /etc/
COPY --from=build /out/oncegate /oncegate
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# The embedded NATS store (--data-dir); keep it on a volume: it holds the idempotency records
# and the billing ledger.
VOLUME ["/data"]
ENV ONCEGATE_LISTEN=0.0.0.0:8080 \
    ONCEGATE_DATA_DIR=/data
# 8080 HTTP API; 4222 NATS clients (--nats-listen, for other roles and the nats CLI);
# 6222 cluster routes (--nats-cluster-listen). (--metrics-listen, off by default, picks its own.)
EXPOSE 8080 4222 6222
# A worker-only container serves no /readyz: run it with --metrics-listen and
# -e ONCEGATE_HEALTHCHECK_URL=http://127.0.0.1:PORT/metrics (docs/operations/container.md).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/oncegate", "healthcheck"]
ENTRYPOINT ["/oncegate"]
CMD ["serve"]
