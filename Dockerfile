# nodepool's image for those who build with Docker or another engine that
# reads Dockerfiles (docker build, podman build, buildah). Without one, ko
# (.ko.yaml) or deploy/cmd/nodepool-image build the same image; see
# docs/deployment.md.
#
#   docker build --build-arg VERSION=$(git describe --always) -t nodepool .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# A static binary: no C library is needed at run time.
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/nodepool-nats/nodepool/service.Version=${VERSION}" \
      -o /out/nodepool ./cmd/nodepool \
 && mkdir -p /out/data

# distroless's static base: CA certificates, /etc/passwd with the non-root
# user 65532, no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/nodepool /usr/local/bin/nodepool
COPY --from=build --chown=65532:65532 /out/data /var/lib/nodepool
ENV NODEPOOL_CONFIG=/etc/nodepool/nodepool.yaml \
    NODEPOOL_DATA_DIR=/var/lib/nodepool
WORKDIR /var/lib/nodepool
USER 65532:65532
EXPOSE 8005
ENTRYPOINT ["/usr/local/bin/nodepool"]
CMD ["run"]
