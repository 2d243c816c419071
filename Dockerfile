# tollgate: multi-stage build, small non-root runtime.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The dependency layer: the dependencies are built against placeholder
# sources, so an edit under src/ reuses this layer and rebuilds only tollgate
# itself; only a Cargo.toml or Cargo.lock change builds them again. (Cargo
# wants every declared target's file to exist, benches included.)
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && for b in limiter keys_memory hyper_floor; do echo 'fn main() {}' > "benches/$b.rs"; done \
 && cargo build --profile dist --locked \
 && rm -rf src benches target/dist/tollgate target/dist/deps/tollgate-* \
           target/dist/deps/libtollgate-* target/dist/.fingerprint/tollgate-*
COPY src ./src
COPY benches ./benches
# strip --strip-debug: the DWARF line tables (54 of the 66 MB) go, the symbol
# names that make a panic's backtrace readable stay.
# The dist profile: release plus fat LTO and one codegen unit (Cargo.toml).
# The sources may be older than the placeholders: touched, so cargo rebuilds them.
RUN touch src/main.rs src/lib.rs \
 && cargo build --profile dist --locked \
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
