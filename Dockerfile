# syntax=docker/dockerfile:1
# The one `inferencecache` binary (serve, operator, subscribe, crds, ...) on a
# minimal non-root runtime. With a registry:
#   docker build -t inferencecache:dev .     (or `buildah bud` / `podman build`)
# Without one (air-gapped, CI): `.ci/build-image` builds the same image from
# Debian packages with podman and prints the archive to import.

# --- builder ---------------------------------------------------------------
# 1.89 is the workspace's rust-version: the oldest Rust that builds Cargo.lock
# (kube 5, async-nats 0.51, serde-saphyr 2.2). A newer builder works too.
FROM docker.io/library/rust:1.89-bookworm AS builder
WORKDIR /src
# protoc is not needed: the proto crate compiles the contract with protox.
# The binary loses its line tables (about 200 MB) but keeps its symbols.
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY proto proto
RUN cargo build --release --locked -p inferencecache-cli --bin inferencecache \
 && cp target/release/inferencecache /inferencecache \
 && strip --strip-debug /inferencecache

# --- runtime ---------------------------------------------------------------
# distroless/cc: glibc + libgcc + CA certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /inferencecache /usr/local/bin/inferencecache
# glibc malloc: buffers of 128 KiB and more (prompt_text tokenization) come
# from mmap and go back at free, and the heap top is trimmed past 128 KiB, so
# RSS returns after a tokenizer flood (+70 MiB after, against +279 MiB with
# the defaults: BENCHMARKS.md "Memory after a prompt_text flood").
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072
USER 65532:65532
EXPOSE 9090 8080 8081 9443
ENTRYPOINT ["/usr/local/bin/inferencecache"]
CMD ["serve"]
