# syntax=docker/dockerfile:1
# The same two images `make images` assembles offline with go-containerregistry
# (internal/images), for people who build with Docker:
#   docker build --target scheduler -t tessera-scheduler .
#   docker build --target agent -t tessera-agent .
# `make images` is what Tessera tests and ships; this file follows it.

ARG GO_VERSION=1.26
ARG VERSION=dev
ARG REVISION=unknown

FROM golang:${GO_VERSION}-bookworm AS build
ARG VERSION
ARG REVISION
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV LDFLAGS="-s -w -X github.com/tessera-gpu/tessera/pkg/version.Version=${VERSION} -X github.com/tessera-gpu/tessera/pkg/version.Revision=${REVISION}"
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o /out/tessera-scheduler ./cmd/tessera-scheduler
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o /out/tessera-agent ./cmd/tessera-agent

# The agent's C library, from Debian's own packages (internal/images.DebianPackages).
FROM debian:bookworm AS debs
RUN apt-get update -q && mkdir /debs /rootfs && cd /debs && \
    apt-get download -q -o APT::Sandbox::User=root libc6 libgcc-s1 gcc-12-base && \
    for d in /debs/*.deb; do dpkg-deb -x "$d" /rootfs; done

FROM scratch AS scheduler
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title=tessera-scheduler \
      org.opencontainers.image.source=https://github.com/tessera-gpu/tessera \
      org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION} \
      org.opencontainers.image.licenses=Apache-2.0
COPY --chmod=0644 <<'PASSWD' /etc/passwd
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
COPY --chmod=0644 <<'GROUP' /etc/group
root:x:0:
nonroot:x:65532:
GROUP
COPY --from=build /out/tessera-scheduler /usr/local/bin/tessera-scheduler
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera-scheduler"]

FROM scratch AS agent
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title=tessera-agent \
      org.opencontainers.image.source=https://github.com/tessera-gpu/tessera \
      org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION} \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=debs /rootfs/ /
COPY --from=build /out/tessera-agent /usr/local/bin/tessera-agent
ENV PATH=/usr/local/bin:/usr/bin:/bin LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/lib64
USER 0:0
ENTRYPOINT ["/usr/local/bin/tessera-agent"]
