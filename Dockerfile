# syntax=docker/dockerfile:1
# The one `inferencecache` binary (serve, operator, subscribe, crds, ...) on a
# minimal non-root runtime. Build: `docker build -t inferencecache:dev .` or
# `buildah bud -t inferencecache:dev .`

# --- builder ---------------------------------------------------------------
FROM docker.io/library/rust:1.85-bookworm AS builder
WORKDIR /src
# protoc is not needed: the proto crate compiles the contract with protox.
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY proto proto
RUN cargo build --release --locked -p inferencecache-cli --bin inferencecache \
 && cp target/release/inferencecache /inferencecache

# --- runtime ---------------------------------------------------------------
# distroless/cc: glibc + libgcc + CA certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /inferencecache /usr/local/bin/inferencecache
USER 65532:65532
EXPOSE 9090 8080 8081
ENTRYPOINT ["/usr/local/bin/inferencecache"]
CMD ["serve"]
