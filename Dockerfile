# The worker image: `agent-worker`, hosting the example agents (or your own: build FROM this
# image, copy your package in and set AGENT_MODULES, or pass `--agents MODULE:ATTR`). It connects through temporalio.envconfig, so TEMPORAL_ADDRESS,
# TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_* and TEMPORAL_CONFIG_FILE/TEMPORAL_PROFILE
# configure it; see .env.example and docs/operating/deploying.md.
#
#   docker build -t agent-worker .
#   docker compose up --build          # Temporal, its UI and this worker
#
# Stopping: SIGTERM (docker stop, compose, Kubernetes) makes the worker stop polling and give
# running model and tool calls AGENT_GRACEFUL_SHUTDOWN_SECONDS (default 10) to finish. Give the
# container longer than that before SIGKILL: `docker stop -t 30`, compose `stop_grace_period: 30s`,
# Kubernetes `terminationGracePeriodSeconds: 30`.

# An exact patch release, the same in both stages so the virtualenv's interpreter path holds.
# Bump it deliberately; the replay tests guard the workflow code, not the interpreter.
ARG PYTHON_IMAGE=python:3.11.15-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY . .
# A regular (not editable) install of the project with its runtime dependencies only: the test
# and bench extras stay out of the image. The cache mount keeps rebuilds after a code change fast.
# pip also writes the bytecode here, where the final stage's read-only venv keeps it: with
# PYTHONDONTWRITEBYTECODE below nothing else would ever cache it, and every start would compile
# the project from source.
RUN --mount=type=cache,target=/root/.cache/pip pip install --compile .

FROM ${PYTHON_IMAGE}
# tini runs as PID 1: it passes SIGTERM on to python, so a stop that arrives before the worker
# has installed its own handlers (while it connects) still ends it instead of waiting for SIGKILL,
# and it reaps any child process. Not version-pinned (hadolint DL3008): Debian stable keeps tini
# at 0.19.0, and an exact pin would have to name a per-architecture rebuild suffix.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed, unprivileged uid, given as a number so Kubernetes' runAsNonRoot can verify it. The
# worker needs no write access outside its home.
RUN groupadd --gid 10001 agent \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin agent
USER 10001:10001
WORKDIR /home/agent
# The example agents are not in the package (the wheel ships none): they are copied beside it,
# for `docker compose up`'s demo, and named by AGENT_MODULES, which a team's own image replaces.
COPY --from=build /src/examples /opt/agents/examples
ENV PYTHONPATH=/opt/agents \
    AGENT_MODULES=examples
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["agent-worker"]
