# The service-mirror controller image.
#
#   docker build -t ghcr.io/service-mirror/service-mirror:0.1.0 .
#
# Manifests that run it: `service-mirror install --image <this image>`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Only what the build needs (see .dockerignore); Cargo.lock pins every dependency.
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
RUN cargo build --release --locked -p service-mirror --bin service-mirror --no-default-features \
    && install -D -m 0755 target/release/service-mirror /out/service-mirror

# glibc + libgcc + CA certificates, no shell, no package manager; runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/service-mirror /usr/local/bin/service-mirror
USER 65532:65532
# Admin server: /metrics, /ping, /live, /ready.
EXPOSE 9999
ENTRYPOINT ["/usr/local/bin/service-mirror"]
