# tollgate: multi-stage build, small non-root runtime.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
# strip --strip-debug: the DWARF line tables (54 of the 66 MB) go, the symbol
# names that make a panic's backtrace readable stay.
# The dist profile: release plus fat LTO and one codegen unit (Cargo.toml).
RUN cargo build --profile dist --locked \
 && mkdir -p /out/var/lib/tollgate \
 && strip --strip-debug -o /out/tollgate target/dist/tollgate

# distroless/cc: glibc, CA certificates and a non-root user, no shell, no curl.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tollgate /usr/local/bin/tollgate
COPY --from=build --chown=65532:65532 /out/var/lib/tollgate /var/lib/tollgate
COPY docker/tollgate.yaml /etc/tollgate/tollgate.yaml
USER 65532:65532
WORKDIR /var/lib/tollgate
VOLUME ["/var/lib/tollgate"]
ENV TOLLGATE_CONFIG=/etc/tollgate/tollgate.yaml
EXPOSE 8080 8443
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/tollgate", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
