# Prometheus for the compose test: no image registry is reachable here, so Debian's own
# prometheus package (2.42) on the same debootstrapped base as the sapo image.
#   docker build --network host -f tests/docker/prometheus.Dockerfile --build-arg BASE_IMAGE=... -t sapo-test/prometheus:2.42 tests/docker
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
VOLUME /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
