# Multi-stage build: compile with the pinned toolchain, ship a small distroless runtime (no shell,
# non-root). The HEALTHCHECK uses the binary itself, since the image has no curl.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY rust-toolchain.toml Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY config ./config
RUN cargo build --release --locked --bin compactor

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/compactor /usr/local/bin/compactor
COPY config/compactor.toml /etc/compactor/compactor.toml
ENV COMPACTOR_CONFIG=/etc/compactor/compactor.toml \
    COMPACTOR_LISTEN=0.0.0.0:8787
USER nonroot:nonroot
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/compactor", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/compactor"]
