# The gpuops image: one command, `gpuops`, for every service of docker-compose.yml (engine,
# simulated fleet, NVML exporter, one-shot setup and tokens).
#   docker build -t gpuops:local .      docker run --rm gpuops:local --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# curl: healthchecks of docker-compose.yml and the Kibana import of deploy/setup/setup.sh
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first (a layer that survives source edits), then the code.
COPY pyproject.toml README.md ./
COPY gpuops ./gpuops
# Editable: the package stays at /app/gpuops, beside /app/elk and /app/rules, which the engine
# finds relative to its source tree (gpuops.audit.settings, gpuops.sim.demo).
RUN pip install -e .

COPY rules ./rules
COPY elk ./elk
COPY deploy ./deploy

# Non-root. Named volumes take their owner from these directories on first use: state and
# secrets are the engine's; the file_sd directory belongs to nobody (65534), Prometheus' user.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/gpuops --no-create-home gpuops \
    && mkdir -p /var/lib/gpuops/state /var/lib/gpuops/secrets /var/lib/gpuops/sd \
    && chown gpuops:gpuops /var/lib/gpuops /var/lib/gpuops/state /var/lib/gpuops/secrets \
    && chown 65534:65534 /var/lib/gpuops/sd
USER gpuops

EXPOSE 9400 9835 9842 9843
ENTRYPOINT ["gpuops"]
CMD ["--help"]
