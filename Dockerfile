# syntax=docker/dockerfile:1
# creditd image: `docker compose up` (see docker-compose.yml) or
#   docker build -t creditd \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse HEAD) \
#     --build-arg BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#   docker run -e REDIS_URL=... -e DATABASE_URL=... -p 127.0.0.1:8080:8080 creditd

# The exact toolchain of go.mod (go 1.26.8): a cached layer is only reused
# with the compiler that made it, and GOTOOLCHAIN=local forbids a download.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
ENV GOTOOLCHAIN=local CGO_ENABLED=0
WORKDIR /src
# Modules first, in a cache mount shared by every build on this builder.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=unknown
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT} -X main.date=${BUILD_DATE}" \
      -o /out/creditd ./cmd/creditd \
 && mkdir -p /out/home

# Distroless static: CA certificates and tzdata, no shell, no package
# manager. The HEALTHCHECK is the binary itself (creditd healthcheck), so it
# needs neither curl nor a shell.
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/creditd /usr/local/bin/creditd
# creditd keeps its dev-mode files (CREDITD_DEV_FILE, default .data/...)
# under its working directory, which the compose file mounts as a volume.
# UID 10001 is the user of earlier images, so their volumes stay writable.
COPY --from=build --chown=10001:10001 /out/home /var/lib/creditd
WORKDIR /var/lib/creditd
USER 10001:10001
ENV CREDITD_ADDR=:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=4s --start-period=30s --retries=3 \
  CMD ["creditd", "healthcheck", "--timeout", "3s"]
ENTRYPOINT ["creditd"]
CMD ["serve"]
