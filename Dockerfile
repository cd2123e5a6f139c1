# syntax=docker/dockerfile:1
# creditd image: `docker compose up` (see docker-compose.yml) or
#   docker build -t creditd . && docker run -e REDIS_URL=... -e DATABASE_URL=... -p 8080:8080 creditd

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so source edits reuse the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/creditd ./cmd/creditd

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/creditd --create-home --shell /usr/sbin/nologin creditd
COPY --from=build /out/creditd /usr/local/bin/creditd
# creditd keeps its dev-mode files (CREDITD_DEV_FILE, default .data/...) under
# its working directory.
WORKDIR /var/lib/creditd
USER creditd
ENV CREDITD_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["creditd"]
CMD ["serve"]
