# busmq gateway image. It listens on every interface (gRPC on 8443; metrics, health and
# the dashboard on 8444), so it serves TLS (certificate and key mounted) or refuses to
# start; see the README, sections Security and Operating.
#   docker build -t busmq-gateway .
#   docker run -p 8443:8443 -v "$PWD/tls:/tls:ro" \
#     -e BUSMQ_GATEWAY_TLS_CERT=/tls/server.crt -e BUSMQ_GATEWAY_TLS_KEY=/tls/server.key \
#     -e BUSMQ_GATEWAY_TLS_CA=/tls/ca.crt -e BUSMQ_GATEWAY_SECRETS="$(cat .busmq-secret)" \
#     -e BUSMQ_REDIS_URLS=redis://redis:6379 busmq-gateway
# Behind a TLS-terminating proxy: -e BUSMQ_GATEWAY_ALLOW_PLAINTEXT=true (logged as a
# warning). Secrets may also come from a mounted file: --secret-file /run/secrets/busmq.
# With no BUSMQ_REDIS_URLS the gateway runs its embedded Redis in /data.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY gateway ./gateway
COPY proto ./proto
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 busmq \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --create-home busmq
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
WORKDIR /data
ENV BUSMQ_DATA_DIR=/data/redis \
    BUSMQ_GATEWAY_LISTEN=0.0.0.0:8443 \
    BUSMQ_GATEWAY_HTTP_LISTEN=0.0.0.0:8444 \
    PYTHONUNBUFFERED=1
EXPOSE 8443 8444
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-m", "busmq_gateway.healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["busmq-gateway"]
